// Package requeue maps the order domain onto the engine's keys and labels:
// which order a task is of ([OrderNo], RunnerConfig.Key), and where the
// task of a position of an order's sequence waits ([Locate]), for the
// engine to bring it back to the front of its queue (keyorder.Wake,
// RunnerConfig.Locate), run it in a hold, or read it. The
// worker parks a task whose turn in its order's sequence has not come in
// asynq's retry set, with a long delay; when the turn comes, whoever
// passed it on (a worker's commit, a producer's void, an operator's skip)
// has the engine call it back, so the task runs next instead of after the
// whole backlog.
//
// Its [Sequencer] is the domain's key space: every program of the domain
// (the producer, the worker, the operator actions, the order view) builds
// its engine parts on one, so that they agree on it.
//
// It is not part of the engine: a task's order, and which queues a label's
// task may be in, are orderworker's policy (the payloads, labels and
// placements of package tasks).
package requeue

import (
	"cmp"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// LockSpace follows the programs' key prefix (KEY_PREFIX) in the engine's
// keys: the orders' sequences, locks and fences, the index of held orders
// and the release notice channel all start with keyPrefix+LockSpace.
const LockSpace = "lock:"

// Sequencer returns the engine's key space of the order domain on rdb,
// under keyPrefix (the programs' KEY_PREFIX, "ow:" by default) followed by
// LockSpace, with cfg's other settings. It returns NewSequencer's error
// for a prefix with a brace or a setting out of range.
func Sequencer(rdb redis.UniversalClient, keyPrefix string, cfg keyorder.SeqConfig) (*keyorder.Sequencer, error) {
	cfg.Prefix = keyPrefix + LockSpace
	return keyorder.NewSequencer(rdb, cfg)
}

// Locate returns where the task of a position of an order's sequence
// waits, given the position's label (tasks.PositionLabel or
// tasks.CreationLabel), read against kinds (the caller's: tasks.Kinds, or
// a worker's configured kinds): its placements under shards
// (tasks.Shards.Placements of its kind for the order: the order's shard of
// its type's queue, then its shards under the counts that drain; for a
// creation, those of the exchanged order, whose queue holds the exchange)
// and its task ID; ok is false for a label that names no task of kinds.
// Waking a label costs one round trip, plus one per placement looked at in
// vain while a count drains. The function is safe for concurrent use.
func Locate(shards tasks.Shards, kinds tasks.Table) keyorder.Locate {
	return func(orderNo, label string) ([]string, string, bool) {
		typ, id, from, ok := kinds.ParseLabel(label)
		if !ok {
			return nil, "", false
		}
		return shards.Placements(kinds.Of(typ), cmp.Or(from, orderNo)), id, true
	}
}

// OrderNo returns the engine's key of a task of kinds (RunnerConfig.Key):
// the order number of its payload. It returns an error for a task of no
// kind of kinds and for a payload its kind refuses. The function is safe
// for concurrent use.
func OrderNo(kinds tasks.Table) func(*asynq.Task) (string, error) {
	return func(t *asynq.Task) (string, error) {
		k := kinds.Of(t.Type())
		if k == nil {
			return "", fmt.Errorf("task type %q is not a configured kind", t.Type())
		}
		p, err := k.Parse(t.Payload())
		if err != nil {
			return "", fmt.Errorf("%s payload: %w", t.Type(), err)
		}
		return p.Header().OrderNo, nil
	}
}
