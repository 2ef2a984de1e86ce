// Package requeue brings asynq tasks back to the front of their queue at
// once. The worker parks a task whose turn in its order's sequence has not
// come in the retry set, with a long delay; when the turn comes, whoever
// passed it on (a worker's commit, a producer's void) calls [Front] so the
// task runs next instead of after the whole backlog. And [Recover] brings
// back the tasks of a worker that died, sooner than asynq's own recoverer,
// since an order's next changes wait for them.
//
// It writes asynq's keys directly, as asynq's own forwarder does
// ("asynq:{<queue>}:retry", ":pending" and the task hash "t:<id>"; see
// package asynqwire, which enqueues into the same layout). That
// layout is asynq's, not a public API: it is checked against asynq v0.25.1,
// the version go.mod pins, by this package's test, which runs a real asynq
// server.
package requeue

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/orderworker/orderworker/internal/asynqwire"
	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/v9"
)

// frontScript moves a task from the retry set, or from anywhere in the
// pending list, to the front of the pending list (asynq dequeues from the
// right: RPUSH puts it first in line).
//
// KEYS[1] asynq:{q}:t:<id>, KEYS[2] asynq:{q}:pending, KEYS[3] asynq:{q}:retry
// ARGV[1] task ID, ARGV[2] now in ns
//
// Returns "moved", or the task's state ("active", "scheduled", ...; ""
// when there is no such task) when it was left alone.
var frontScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
local g = redis.call('HGET', KEYS[1], 'group')
if g and g ~= '' then return 'grouped' end
if st == 'retry' then
  if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return st end
elseif st == 'pending' then
  if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then return st end
else
  return st or ''
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[2])
return 'moved'
`)

// Front moves task id of queue from asynq's retry set (or from further back
// in its pending list) to the front of the queue, so that a worker takes it
// next. A task in any other state (active, scheduled on purpose, archived,
// completed, gone) is left alone: Front then returns false and that state
// ("" for no such task). It costs one round trip and is safe for concurrent
// use.
func Front(ctx context.Context, rdb redis.Scripter, queue, id string) (moved bool, state string, err error) {
	p := asynqwire.QueueKey(queue)
	res, err := frontScript.Run(ctx, rdb, []string{asynqwire.TaskKey(queue, id), asynqwire.PendingKey(queue), p + "retry"},
		id, strconv.FormatInt(time.Now().UnixNano(), 10)).Text()
	if err != nil {
		return false, "", fmt.Errorf("requeue: front %s in %s: %w", id, queue, err)
	}
	return res == "moved", res, nil
}

// InTransit is how long [Labels] keeps trying to bring back a task that is
// still active: a task is parked by returning from its run, and asynq moves
// it to the retry set just after; the call that wakes it may come first.
const InTransit = 250 * time.Millisecond

// Labels brings back the holders of parked positions of order orderNo's
// sequence, given by their labels (tasks.PositionLabel) in the order of
// their positions: for each, the task of that event in its placement under
// shards (tasks.Shards.Placements: the order's shard of its type's queue,
// then its shards under the counts that drain; a creation's label names
// the exchanged order, whose queue holds the exchange). The first ends up
// first in line (they are moved in reverse order, each to the front). A
// task still active (on its way to being parked) is tried again, with
// short pauses, for up to InTransit. A label that names no task is
// ignored. It costs one round trip per label, plus one per placement
// looked at in vain while a count drains. It returns the first Redis
// error, after trying every label.
func Labels(ctx context.Context, rdb redis.Scripter, orderNo string, shards tasks.Shards, labels []string) error {
	var first error
	for _, label := range slices.Backward(labels) {
		typ, id, from, ok := tasks.ParseLabel(label)
		if !ok {
			continue
		}
		for _, queue := range shards.Placements(tasks.KindOf(typ), cmp.Or(from, orderNo)) {
			state, err := frontWhileActive(ctx, rdb, queue, id)
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

// frontWhileActive is Front, tried again with short pauses for up to
// InTransit while the task is active. It returns the task's state, "moved"
// when it was moved, "" when the queue has no such task.
func frontWhileActive(ctx context.Context, rdb redis.Scripter, queue, id string) (string, error) {
	pause := 5 * time.Millisecond
	deadline := time.Now().Add(InTransit)
	for {
		_, state, err := Front(ctx, rdb, queue, id)
		if err != nil || state != "active" || time.Now().After(deadline) {
			return state, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return state, context.Cause(ctx)
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// recoverScript moves the tasks whose asynq lease expired more than a margin
// ago from the active list to the front of the pending list, without
// counting a failure: their worker died or lost Redis for longer than its
// lease (asynq's processor never writes for a task whose lease it found
// expired, so no late write of the old run can undo this).
//
// KEYS[1] asynq:{q}:lease, KEYS[2] asynq:{q}:active, KEYS[3] asynq:{q}:pending
// ARGV[1] margin in seconds, ARGV[2] task key prefix, ARGV[3] now in ns,
// ARGV[4] at most this many tasks
//
// Returns the IDs moved. The cutoff is Redis TIME minus the margin: the
// lease times are the workers' clocks, and the margin covers their skew.
var recoverScript = redis.NewScript(`
local cutoff = tonumber(redis.call('TIME')[1]) - tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[4]))
local moved = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  if redis.call('LREM', KEYS[2], 1, id) == 1 then
    redis.call('RPUSH', KEYS[3], id)
    redis.call('HSET', ARGV[2] .. id, 'state', 'pending', 'pending_since', ARGV[3])
    moved[#moved + 1] = id
  end
end
return moved
`)

// Recover brings the tasks of queue whose asynq lease expired more than
// margin ago back to the front of the queue, at most 100 per call, and
// returns their IDs. asynq's own recoverer does the same for a lease
// expired 30 s ago, once a minute per server, and counts it as a failure
// (the worker's IsFailure does not). It costs one round trip and is safe
// for concurrent use, by any number of processes.
func Recover(ctx context.Context, rdb redis.Scripter, queue string, margin time.Duration) ([]string, error) {
	p := asynqwire.QueueKey(queue)
	ids, err := recoverScript.Run(ctx, rdb, []string{p + "lease", p + "active", asynqwire.PendingKey(queue)},
		int64(margin/time.Second), p+"t:", strconv.FormatInt(time.Now().UnixNano(), 10), 100).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("requeue: recover %s: %w", queue, err)
	}
	return ids, nil
}
