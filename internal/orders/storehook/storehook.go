// Package storehook runs a hook before every store write of the worker's
// kinds: the work inside the order's lock takes time, fails or is
// observed. It serves the testing aids and dev tools (cmd/worker's
// WORKER_SIMULATE_WORK, the demo's timeline, the benchmarks) and the tests.
// It wraps the worker's kind entries (worker.Kind.Before), not the store,
// so it is the same for every kind and a kind added to the table needs no
// change here. It holds no state; production code paths other than those
// testing aids do not use it (the lint's depguard rules say which packages
// may import it).
package storehook

import (
	"context"
	"time"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// Hook runs before a write; typ is the write's kind (its task type, as
// tasks.TypeModify), eventID and orderNo the task's. A non-nil error is
// returned instead of writing.
type Hook func(ctx context.Context, typ, eventID, orderNo string) error

// Kinds returns a copy of kinds whose handlers run hook before their store
// write: inside the order's lock, in the task's turn, with the fenced
// write in ctx (see worker.Kind.Before). A write runs only if the hook
// returns nil; the hook's error is the handler's. A nil kinds stands for
// worker.Kinds(), the default of worker.Config.Kinds, so that
// Config.Kinds = Kinds(Config.Kinds, hook) hooks whatever the Worker would
// serve; an empty (non-nil) kinds gives an empty list. A nil hook returns
// the entries unchanged. kinds itself is not changed. The hook must be
// safe for concurrent use: a Worker runs tasks concurrently.
func Kinds(kinds []worker.Kind, hook Hook) []worker.Kind {
	if kinds == nil {
		kinds = worker.Kinds()
	}
	out := make([]worker.Kind, len(kinds))
	for i, k := range kinds {
		out[i] = k
		if hook != nil {
			out[i] = k.Before(func(ctx context.Context, p tasks.Payload) error {
				h := p.Header()
				return hook(ctx, p.Kind().Type, h.EventID, h.OrderNo)
			})
		}
	}
	return out
}

// Delay returns a Hook that waits d, or until ctx ends (returning its cause),
// as a write that takes d would. A d of 0 or less returns nil at once.
func Delay(d time.Duration) Hook {
	return func(ctx context.Context, _, _, _ string) error { return Sleep(ctx, d) }
}

// Sleep waits d, or until ctx ends (returning its cause): simulated work. A
// d of 0 or less returns nil at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
