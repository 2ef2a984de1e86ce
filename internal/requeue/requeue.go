// Package requeue brings the parked holders of an order's positions back
// to the front of their queues. The worker parks a task whose turn in its
// order's sequence has not come in asynq's retry set, with a long delay;
// when the turn comes, whoever passed it on (a worker's commit, a
// producer's void) calls [Labels] with the labels of the positions it
// called, so the tasks run next instead of after the whole backlog. It
// finds each task where the task contract places it and moves it with
// asynqwire.Front, which owns asynq's Redis layout.
//
// It is not part of asynqwire: which queues a label's task may be in, and
// how long to try again while it is active, is orderworker's policy (the
// labels and placements of package tasks), which an asynq upgrade need not
// check. Every key, script and task state of asynq it uses is asynqwire's.
package requeue

import (
	"cmp"
	"context"
	"slices"

	"github.com/orderworker/orderworker/internal/asynqwire"
	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/v9"
)

// Labels brings back the holders of parked positions of order orderNo's
// sequence, given by their labels (tasks.PositionLabel) in the order of
// their positions: for each, the task of that event in its placement under
// shards (tasks.Shards.Placements: the order's shard of its type's queue,
// then its shards under the counts that drain; a creation's label names
// the exchanged order, whose queue holds the exchange). The first ends up
// first in line (they are moved in reverse order, each to the front). A
// task still active (on its way to being parked) is tried again, with
// short pauses, for up to asynqwire.InTransit. Labels are read against kinds (the
// caller's: tasks.Kinds, or a worker's configured kinds); a label that
// names no task of them is ignored. It costs one round trip per label, plus one per placement
// looked at in vain while a count drains. It returns the first Redis
// error, after trying every label.
func Labels(ctx context.Context, rdb redis.Scripter, orderNo string, shards tasks.Shards, kinds tasks.Table, labels []string) error {
	return move(ctx, rdb, orderNo, shards, kinds, labels, asynqwire.FrontInTransit)
}

// Back is [Labels] for one label, whose task goes to the back of its queue
// (asynqwire.Back): last in line, behind the other orders' tasks waiting
// there.
func Back(ctx context.Context, rdb redis.Scripter, orderNo string, shards tasks.Shards, kinds tasks.Table, label string) error {
	return move(ctx, rdb, orderNo, shards, kinds, []string{label}, asynqwire.BackInTransit)
}

// Locate returns where the task of a position of an order's sequence
// waits, given the position's label (tasks.PositionLabel or
// tasks.CreationLabel), read against kinds: its placements under shards
// (tasks.Shards.Placements of its kind for the order, or, for a creation,
// for the exchanged order, whose queue holds the exchange) and its task ID;
// ok is false for a label that names no task of kinds. It is the placement
// [Labels] and [Back] look in, in the form of keyorder's
// RunnerConfig.Locate. The function is safe for concurrent use.
func Locate(shards tasks.Shards, kinds tasks.Table) func(orderNo, label string) (queues []string, taskID string, ok bool) {
	return func(orderNo, label string) ([]string, string, bool) {
		typ, id, from, ok := kinds.ParseLabel(label)
		if !ok {
			return nil, "", false
		}
		return shards.Placements(kinds.Of(typ), cmp.Or(from, orderNo)), id, true
	}
}

type mover func(ctx context.Context, rdb redis.Scripter, queue, id string) (string, error)

func move(ctx context.Context, rdb redis.Scripter, orderNo string, shards tasks.Shards, kinds tasks.Table, labels []string, to mover) error {
	var first error
	locate := Locate(shards, kinds)
	for _, label := range slices.Backward(labels) {
		queues, id, ok := locate(orderNo, label)
		if !ok {
			continue
		}
		for _, queue := range queues {
			state, err := to(ctx, rdb, queue, id)
			if err != nil {
				first = cmp.Or(first, err)
			}
			if err != nil || state != "" {
				break // found there (or failed): not in another placement
			}
		}
		if ctx.Err() != nil {
			return cmp.Or(first, context.Cause(ctx))
		}
	}
	return first
}
