package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// Kind is the worker's entry for one task kind: how its tasks wait and how
// they are applied to the store. [Kinds] lists the contract's; adding a
// task type to the contract means adding its tasks.Kind and one entry
// here. A program (or a test) with a kind of its own appends its entry to
// Kinds() and passes the list as [Config.Kinds].
type Kind struct {
	// Kind is the contract's kind.
	Kind *tasks.Kind
	// Wait is how a task of the kind waits for its order's lock and its
	// turn, unless Config.Waits says otherwise: lock.DefaultWait, but for
	// what the kind changes. Every field is set.
	Wait Wait
	// Apply applies a valid payload of the kind to store, inside the
	// order's lock, with the fence in ctx. It returns the store's error.
	Apply func(ctx context.Context, store orders.Store, p tasks.Payload) error
}

// kinds is the worker's table, one entry per kind of tasks.Kinds.
var kinds = []Kind{
	{
		Kind: tasks.Exchange,
		// An exchange waits longer than a modify: it goes first (its queue
		// has the higher weight), and a modify can wait for it.
		Wait: lock.Wait{Deadline: 10 * time.Second}.Or(lock.DefaultWait),
		Apply: func(ctx context.Context, store orders.Store, p tasks.Payload) error {
			x := p.(tasks.ExchangePayload)
			_, err := store.Exchange(ctx, x.EventID, x.OrderNo, orders.Exchange{
				Items: x.Items, NewOrderNo: x.NewOrderNo, Reason: x.Reason})
			return err
		},
	},
	{
		Kind: tasks.Modify,
		Wait: lock.DefaultWait,
		Apply: func(ctx context.Context, store orders.Store, p tasks.Payload) error {
			m := p.(tasks.ModifyPayload)
			_, err := store.Modify(ctx, m.EventID, m.OrderNo, orders.Changes{
				Address: m.Changes.Address, Remark: m.Changes.Remark, Items: m.Changes.Items})
			return err
		},
	},
}

// Kinds returns the worker's entries, one per kind of the contract, with
// their default waits: the default of [Config.Kinds].
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// table returns the contract kinds of entries, in their order.
func table(entries []Kind) tasks.Table {
	out := make(tasks.Table, len(entries))
	for i, k := range entries {
		out[i] = k.Kind
	}
	return out
}

// kindOf returns the entry of task type typ among the Worker's kinds, or
// nil.
func (c *Config) kindOf(typ string) *Kind {
	for i := range c.Kinds {
		if c.Kinds[i].Kind.Type == typ {
			return &c.Kinds[i]
		}
	}
	return nil
}

// kindNamed returns the entry of the kind named name among the Worker's
// kinds, or nil.
func (c *Config) kindNamed(name string) *Kind {
	for i := range c.Kinds {
		if c.Kinds[i].Kind.Name == name {
			return &c.Kinds[i]
		}
	}
	return nil
}

// storeError marks the store errors that no retry can fix as SkipRetry.
func storeError(err error) error {
	if err != nil && orders.Permanent(err) {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}
