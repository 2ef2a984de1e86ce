// Package orderkeys is the order domain's key space in Redis: the prefix
// every program of orderworker starts its keys with (KEY_PREFIX, by
// default [DefaultPrefix]), the engine's part of it under [LockSpace] and
// the one [SeqConfig] every program builds its engine parts on
// ([Sequencer]), the workers' shared token ([TokenKey]), and how the
// engine reads the domain's tasks: which order a task is of ([OrderNo],
// RunnerConfig.Key), and where the task of a position of an order's
// sequence waits ([Locate]), for the engine to bring it back to the front
// of its queue (keyorder.Wake, RunnerConfig.Locate), run it in a hold, or
// read it. The worker parks a task whose turn in its order's sequence has
// not come in asynq's retry set, with a long delay; when the turn comes,
// whoever passed it on (a worker's commit, a producer's void, an
// operator's skip) has the engine call it back, so the task runs next
// instead of after the whole backlog.
//
// It is not part of the engine: the prefix, a task's order, and which
// queues a label's task may be in, are orderworker's policy (the payloads,
// labels and placements of package tasks). The engine's own default
// prefix (keyorder.DefaultPrefix) is not the domain's: the domain always
// sets its own, through [SeqConfig].
package orderkeys

import (
	"cmp"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// DefaultPrefix is the default KEY_PREFIX, the prefix of every Redis key
// and channel of orderworker's programs: the engine's keys (under
// [LockSpace]), the orders, the event claims, the replicas' markers and
// the shared token. It is the one declaration of that default: every
// Config with a KeyPrefix (or Prefix) of the domain defaults to it, and
// the public worker.DefaultKeyPrefix and producer.DefaultKeyPrefix are
// aliases of it.
const DefaultPrefix = "ow:"

// LockSpace follows the programs' key prefix in the engine's keys: the
// orders' sequences, locks and fences, the index of held orders and the
// release notice channel all start with the prefix followed by LockSpace
// (ow:lock: by default).
const LockSpace = "lock:"

// TokenKey returns the key of the workers' shared order API token under
// the key prefix prefix (token.Config.Key): ow:token:{upstream} by
// default. Its refresh lock and notice channel start with it.
func TokenKey(prefix string) string { return prefix + "token:{upstream}" }

// Use is what one program's key space sets that the others' leave at the
// engine's defaults: the settings of keyorder.SeqConfig that only one
// reader reads. The rest of the key space (its prefix, prefix+LockSpace,
// and the sequences' retention, the engine's default) is the same in
// every program of the domain, so that they agree on it. The zero value
// is the Use of the worker and the operator actions.
type Use struct {
	// MaxWaiting is the producer's cap on an order's waiting positions
	// (producer.Config.MaxWaiting, keyorder.SeqConfig.MaxWaiting). Only a
	// keyorder.Client's reservation reads it, so only the producer sets
	// it. Defaults to 0: no cap.
	MaxWaiting int64
	// StatusPage is how many waiting positions Sequencer.Status reads
	// (keyorder.SeqConfig.StatusPage). Only the order view reads Status
	// (orderview.Config.MaxPositions, and a page of 1 for the heads it
	// follows), so only it sets it. Defaults to the engine's
	// (keyorder.DefaultStatusPage).
	StatusPage int
}

// SeqConfig returns the domain's key space under the programs' key
// prefix prefix (KEY_PREFIX): prefix+LockSpace, with u's per-use
// settings and the engine's defaults for the rest. It is the one
// SeqConfig of the domain: every program builds its Sequencer from it
// ([Sequencer]).
func SeqConfig(prefix string, u Use) keyorder.SeqConfig {
	return keyorder.SeqConfig{Prefix: prefix + LockSpace, MaxWaiting: u.MaxWaiting, StatusPage: u.StatusPage}
}

// Sequencer returns the engine's key space of the order domain on rdb:
// keyorder.NewSequencer of [SeqConfig](prefix, u). A program builds one
// per key space and use, and shares it. It returns NewSequencer's error
// for a prefix with a brace or a setting of u out of range.
func Sequencer(rdb redis.UniversalClient, prefix string, u Use) (*keyorder.Sequencer, error) {
	return keyorder.NewSequencer(rdb, SeqConfig(prefix, u))
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
