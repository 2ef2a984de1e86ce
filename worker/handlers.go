package worker

import (
	"context"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/tasks"
)

// Compile-time checks that the handlers are asynq handlers.
var (
	_ asynq.Handler = (*ModifyHandler)(nil)
	_ asynq.Handler = (*ExchangeHandler)(nil)
)

// ModifyHandler applies order:modify tasks to a store. It expects to run
// inside the order's lock, with the fence in the context (the Worker's
// middleware does that); the store refuses a write without one. It is safe
// for concurrent use.
type ModifyHandler struct {
	Store orders.Store
}

// ProcessTask parses the payload and applies the change. A malformed payload,
// an unknown or closed order and other permanent store errors are returned
// wrapping asynq.SkipRetry, so the task is archived with the reason.
func (h *ModifyHandler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.ParseModify(t.Payload())
	if err != nil {
		return err
	}
	_, err = h.Store.Modify(ctx, p.EventID, p.OrderNo, orders.Changes{
		Address: p.Changes.Address,
		Remark:  p.Changes.Remark,
		Items:   p.Changes.Items,
	})
	return storeError(err)
}

// ExchangeHandler applies order:exchange tasks to a store, as ModifyHandler
// does for modifies. It is safe for concurrent use.
type ExchangeHandler struct {
	Store orders.Store
}

// ProcessTask parses the payload and applies the exchange. Errors are
// classified as for ModifyHandler.
func (h *ExchangeHandler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.ParseExchange(t.Payload())
	if err != nil {
		return err
	}
	_, err = h.Store.Exchange(ctx, p.EventID, p.OrderNo, orders.Exchange{
		Items:      p.Items,
		NewOrderNo: p.NewOrderNo,
		Reason:     p.Reason,
	})
	return storeError(err)
}

// storeError marks the store errors that no retry can fix as SkipRetry.
func storeError(err error) error {
	if err != nil && orders.Permanent(err) {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}
