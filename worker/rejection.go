package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// explain adds to err, the store's answer to change h (reserved under
// label), what its order's sequence says of why: when the order does not
// exist, why the exchange that was to create it did not (rejected, or the
// creation's position skipped: by whom and why); when the order is past
// h's position, the skip of that position (an operator's skip of a head
// whose task then ran anyway, from the archive, say). A change without a
// position, another error, or a sequence that says nothing (its log keeps
// the latest 20 entries) leaves err as it is; so does a failed read of the
// sequence, which costs only the explanation.
func (w *Worker) explain(ctx context.Context, h tasks.Header, label string, err error) error {
	if h.Seq == 0 {
		return err
	}
	switch {
	case errors.Is(err, orders.ErrNotFound):
		if why, _ := w.runner.NotCreated(ctx, h.OrderNo, w.isCreation); why != "" {
			return fmt.Errorf("%w; it was to be created, but %s", err, why)
		}
	case errors.Is(err, orders.ErrPassed):
		if why, _ := w.runner.Skipped(ctx, h.OrderNo, h.Seq, label); why != "" {
			return fmt.Errorf("%w: %s", err, why)
		}
	}
	return err
}

// isCreation reports whether label is that of a creation's position in an
// order's sequence (an exchange of another order creating it).
func (w *Worker) isCreation(label string) bool {
	_, _, from, ok := w.kinds.ParseLabel(label)
	return ok && from != ""
}
