// Package storehook wraps an orders.Store so that a hook runs before every
// write: the work inside the order's lock takes time, fails or is observed.
// It serves the testing aids and dev tools (cmd/worker's
// WORKER_SIMULATE_WORK, the demo's timeline, the benchmarks) and the tests.
// It is not an order store of its own and holds no state; production code
// paths other than those testing aids do not use it (the lint's depguard
// rules say which packages may import it).
package storehook

import (
	"context"
	"time"

	"github.com/orderworker/orderworker/worker/orders"
)

// Hook runs before a write; typ is orders.TypeModify or orders.TypeExchange.
// A non-nil error is returned instead of writing.
type Hook func(ctx context.Context, typ, eventID, orderNo string) error

// BeforeWrite returns a Store that runs hook before every Modify and
// Exchange of s (inside the order's lock, when the caller holds it) and
// writes only if the hook returns nil. Reads and Put go straight to s. It is
// safe for concurrent use if s and hook are.
func BeforeWrite(s orders.Store, hook Hook) orders.Store { return hooked{Store: s, hook: hook} }

type hooked struct {
	orders.Store
	hook Hook
}

func (h hooked) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	if err := h.hook(ctx, orders.TypeModify, eventID, orderNo); err != nil {
		return orders.Result{}, err
	}
	return h.Store.Modify(ctx, eventID, orderNo, c)
}

func (h hooked) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	if err := h.hook(ctx, orders.TypeExchange, eventID, orderNo); err != nil {
		return orders.Result{}, err
	}
	return h.Store.Exchange(ctx, eventID, orderNo, x)
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
