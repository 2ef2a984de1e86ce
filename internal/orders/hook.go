package orders

import (
	"context"
	"time"
)

// Hook runs before a write; typ is TypeModify or TypeExchange. A non-nil
// error is returned instead of writing.
type Hook func(ctx context.Context, typ, eventID, orderNo string) error

// BeforeWrite returns a Store that runs hook before every Modify and
// Exchange of s (inside the order's lock, when the caller holds it) and
// writes only if the hook returns nil. Reads and Put go straight to s. It is
// for the demo, tests and benchmarks, which need the work inside the lock to
// take time or to be observed. It is safe for concurrent use if hook is.
func BeforeWrite(s Store, hook Hook) Store { return hooked{Store: s, hook: hook} }

type hooked struct {
	Store
	hook Hook
}

func (h hooked) Modify(ctx context.Context, eventID, orderNo string, c Changes) (Result, error) {
	if err := h.hook(ctx, TypeModify, eventID, orderNo); err != nil {
		return Result{}, err
	}
	return h.Store.Modify(ctx, eventID, orderNo, c)
}

func (h hooked) Exchange(ctx context.Context, eventID, orderNo string, x Exchange) (Result, error) {
	if err := h.hook(ctx, TypeExchange, eventID, orderNo); err != nil {
		return Result{}, err
	}
	return h.Store.Exchange(ctx, eventID, orderNo, x)
}

// Delay returns a Hook that waits d, or until ctx ends (returning its cause),
// as a write that takes d would.
func Delay(d time.Duration) Hook {
	return func(ctx context.Context, _, _, _ string) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
