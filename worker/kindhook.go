package worker

import (
	"context"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// Before returns a copy of k whose handler runs hook first: inside the
// order's lock, in the task's turn, with the fenced orders.Write in ctx and
// the payload the handler gets. The handler (and so the store's write)
// runs only if hook returns nil; otherwise [Kind.Apply] returns hook's
// error as the handler's, and the Worker classifies it as it would the
// store's (see the package doc, "Failures"; a hook's panic is a
// handler's). hook does not run when the handler would not: for a store
// that lacks the kind's write or a payload of another type (Apply's
// errors then, as without a hook).
//
// It serves simulated work, fault injection and observation in the
// testing aids and dev tools; it is the same for every kind, so a kind
// added to the table needs nothing of it. Hooks stack:
// k.Before(a).Before(b) runs b, then a, then the handler. A nil hook, or
// an entry not made by [NewKind], returns k unchanged. k itself is not
// changed. hook must be safe for concurrent use: a Worker runs tasks of a
// kind concurrently (up to Config.Concurrency).
func (k Kind) Before(hook func(ctx context.Context, p tasks.Payload) error) Kind {
	if hook == nil || k.apply == nil || k.has == nil || k.payload == nil {
		return k
	}
	apply, has, payload := k.apply, k.has, k.payload
	k.apply = func(ctx context.Context, store orders.Store, p tasks.Payload) error {
		if has(store) && payload(p) {
			if err := hook(ctx, p); err != nil {
				return err
			}
		}
		return apply(ctx, store, p)
	}
	return k
}
