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
	"fmt"
	"time"

	"github.com/orderworker/orderworker/worker/orders"
)

// Hook runs before a write; typ is the write's kind (its task type, as
// orders.TypeModify). A non-nil error is returned instead of writing.
type Hook func(ctx context.Context, typ, eventID, orderNo string) error

// Store is an order store whose writes run a hook first. It implements
// orders.Store and every write of the contract (orders.Modifier,
// orders.Exchanger): a write that s itself lacks returns an error
// naming the missing interface, after the hook. The notes of an orders.Annotator are not passed on: a hooked
// store keeps no notes. A test in this package runs every kind of
// worker.Kinds through a hooked store, so a write added to the contract
// without its method here fails it.
type Store struct {
	orders.Store
	s    orders.Store
	hook Hook
}

// BeforeWrite returns a Store that runs hook before every write of s
// (inside the order's lock, when the caller holds it) and writes only if
// the hook returns nil. Reads and Put go straight to s. A nil hook runs
// nothing. It is safe for concurrent use if s and hook are.
func BeforeWrite(s orders.Store, hook Hook) *Store { return &Store{Store: s, s: s, hook: hook} }

var (
	_ orders.Modifier  = (*Store)(nil)
	_ orders.Exchanger = (*Store)(nil)
)

// before runs the hook of a write of kind typ.
func (h *Store) before(ctx context.Context, typ, eventID, orderNo string) error {
	if h.hook == nil {
		return nil
	}
	return h.hook(ctx, typ, eventID, orderNo)
}

// Modify runs the hook, then s's Modify.
func (h *Store) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	if err := h.before(ctx, orders.TypeModify, eventID, orderNo); err != nil {
		return orders.Result{}, err
	}
	m, ok := h.s.(orders.Modifier)
	if !ok {
		return orders.Result{}, fmt.Errorf("storehook: %T lacks orders.Modifier", h.s)
	}
	return m.Modify(ctx, eventID, orderNo, c)
}

// Exchange runs the hook, then s's Exchange.
func (h *Store) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	if err := h.before(ctx, orders.TypeExchange, eventID, orderNo); err != nil {
		return orders.Result{}, err
	}
	e, ok := h.s.(orders.Exchanger)
	if !ok {
		return orders.Result{}, fmt.Errorf("storehook: %T lacks orders.Exchanger", h.s)
	}
	return e.Exchange(ctx, eventID, orderNo, x)
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
