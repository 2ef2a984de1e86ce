package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

// Kind is the worker's entry for one task kind: how its tasks wait, and
// the handler that applies their payload to the store, with the store
// write it needs. Make it with [NewKind]; [Kinds] lists the contract's.
// Adding a task type to the contract means adding its tasks.Kind and one
// NewKind entry here. A program (or a test) with a kind of its own
// appends its entry to Kinds() and passes the list as [Config.Kinds].
//
// A Kind is a value: copy it and set Wait to change how its tasks wait.
type Kind struct {
	// Kind is the contract's kind, the one the handler's payload type
	// names (set by NewKind). Do not change it: New refuses an entry whose
	// kind reads payloads of another type than its handler's.
	Kind *tasks.Kind
	// Wait is how a task of the kind waits for its order's lock and its
	// turn, unless Config.Waits says otherwise. A zero field means
	// DefaultWait's.
	Wait Wait
	// Failure is what becomes of an order whose change of the kind fails
	// past its failure budget, unless Config.Failures says otherwise:
	// [Halt] (NewKind's default) keeps the change its order's head and
	// runs nothing behind it, the order listed as blocked "halted" with
	// the last error, until an operator retries or skips it; [Continue]
	// archives it and the order's next change goes on. An archived head
	// of a halting kind is never skipped by the gap check either,
	// whatever archived it. The zero value means Continue.
	Failure FailurePolicy

	// apply runs the handler on a store that implements the write and a
	// payload of the handler's type; nil for an entry not made by NewKind.
	apply func(ctx context.Context, store orders.Store, p tasks.Payload) error
	// write is the store interface (or type) the handler needs.
	write reflect.Type
	// has reports whether a store implements write.
	has func(store orders.Store) bool
	// payload reports whether p is of the handler's payload type.
	payload func(p tasks.Payload) bool
}

// NewKind returns the worker's entry for the kind of payload type P, with
// the failure policy [Halt]
// (P's Kind method names it, as river's AddWorker[T] reads T's kind):
// handle applies a valid payload of the kind to a store that implements
// S, the write the kind needs (such as orders.Modifier), inside the
// order's lock, in the task's turn, with the fence in ctx
// (orders.FencedWrite reads it). handle returns the store's error; the
// Worker classifies it (see the package doc, "Failures"). The compiler
// checks the handler's payload and store types: no type assertion is
// left to the handler. wait is the kind's default wait; a zero field
// means DefaultWait's.
//
// A store that lacks S but forwards changes (orders.Forwarder, as the
// HTTP store does) is given the task's change instead of running handle:
// the kind's type and name, the event ID, the order number and the
// payload's own members (tasks.Body). A store that has S is always
// given the write.
//
// P is a value type (a struct, as the contract's payloads are) whose Kind
// method works on its zero value. [New] refuses an entry whose store
// lacks S (and does not forward), naming the kind and S, and one whose
// kind reads another payload type than P.
func NewKind[P tasks.Payload, S any](wait Wait, handle func(ctx context.Context, store S, p P) error) Kind {
	var zero P
	return Kind{
		Kind:    kindOf(zero),
		Wait:    wait.Or(DefaultWait()),
		Failure: Halt,
		write:   reflect.TypeFor[S](),
		has: func(store orders.Store) bool {
			_, ok := store.(S)
			_, fwd := store.(orders.Forwarder)
			return ok || fwd
		},
		payload: func(p tasks.Payload) bool {
			_, ok := p.(P)
			return ok
		},
		apply: func(ctx context.Context, store orders.Store, p tasks.Payload) error {
			pp, ok := p.(P)
			if !ok {
				return fmt.Errorf("%s: payload %T is not a %T: %w", kindOf(zero), p, zero, asynq.SkipRetry)
			}
			if s, ok := store.(S); ok {
				return handle(ctx, s, pp)
			}
			if f, ok := store.(orders.Forwarder); ok {
				return forward(ctx, f, pp)
			}
			return fmt.Errorf("%s: %T does not implement %s: %w", kindOf(zero), store, reflect.TypeFor[S](), ErrNoWrite)
		},
	}
}

// forward passes p's change on to a store that forwards changes: the
// task type, the kind's name, the header's event ID and order number,
// and the payload's own members as the body.
func forward(ctx context.Context, f orders.Forwarder, p tasks.Payload) error {
	k, h := p.Kind(), p.Header()
	body, err := tasks.Body(p)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	_, err = f.Forward(ctx, orders.Change{Type: k.Type, Name: k.Name, EventID: h.EventID, OrderNo: h.OrderNo, Body: body})
	return err
}

// kindOf returns the kind that payload p names, or nil when its Kind
// method fails on it (a nil pointer): New then refuses the entry.
func kindOf(p tasks.Payload) (k *tasks.Kind) {
	defer func() {
		if recover() != nil {
			k = nil
		}
	}()
	return p.Kind()
}

// ErrNoWrite is matched by the error of [New] (and of [Kind.Apply]) for a
// store that does not implement a kind's write (see [Kind.Write]).
var ErrNoWrite = errors.New("worker: the store lacks the kind's write")

// Write returns the store interface (or type) the kind's handler needs,
// such as orders.Modifier; nil for an entry not made by [NewKind].
func (k Kind) Write() reflect.Type { return k.write }

// Check returns nil when the entry was made by [NewKind], its kind reads
// payloads of its handler's type and store implements the kind's write
// (or forwards changes: orders.Forwarder). Otherwise it returns an error naming the kind (and, for a store that
// lacks the write, matching [ErrNoWrite] and naming the interface). New
// checks every kind of Config.Kinds with it.
func (k Kind) Check(store orders.Store) error {
	switch {
	case k.Kind == nil:
		return errors.New("worker: a kind entry without a kind; make it with worker.NewKind, whose payload type (a value type) names its kind")
	case k.apply == nil:
		return fmt.Errorf("worker: kind %s has no handler; make its entry with worker.NewKind", k.Kind)
	}
	if p, err := k.Kind.Decode([]byte("{}")); err == nil && !k.payload(p) {
		return fmt.Errorf("worker: kind %s reads %T payloads, which its handler does not take", k.Kind, p)
	}
	if !k.has(store) {
		return fmt.Errorf("worker: kind %s needs a store that implements %s (or orders.Forwarder), and %T does neither: %w", k.Kind, k.write, store, ErrNoWrite)
	}
	return nil
}

// Apply runs the kind's handler on payload p and store, as a Worker does
// inside the order's lock (ctx must carry the fenced orders.Write). It
// returns the handler's error (or, for a store that lacks the kind's
// write and forwards changes, the forward's); an error matching
// [ErrNoWrite] when store has neither; and one matching asynq.SkipRetry when p is not
// of the handler's payload type. Package workertest runs a task through
// it with the Worker's rules.
func (k Kind) Apply(ctx context.Context, store orders.Store, p tasks.Payload) error {
	if k.apply == nil {
		return fmt.Errorf("worker: kind %s has no handler; make its entry with worker.NewKind", k.Kind)
	}
	return k.apply(ctx, store, p)
}

// FailurePolicy is what becomes of an order whose change fails past its
// failure budget (see [Kind.Failure] and [Config.Failures]): the engine's
// keyorder.FailurePolicy.
type FailurePolicy = keyorder.FailurePolicy

// The failure policies of a kind.
const (
	// Halt keeps a change that failed past its budget its order's head:
	// nothing behind it runs until an operator acts. The default of the
	// kinds NewKind makes (docs/guarantees.md says why).
	Halt = keyorder.FailureHalt
	// Continue archives a change that failed past its budget, and the
	// order's next change goes on.
	Continue = keyorder.FailureContinue
)

// Wait is how a task waits for its order's lock and for its turn (see
// [Config.Waits] and [Kind.Wait]). A zero field means the default: the
// kind's, then DefaultWait's.
type Wait struct {
	// MinDelay and MaxDelay bound the random delay between two attempts;
	// a release notice of the order (or of the position before the
	// task's) ends the delay early. Default to 50ms and 500ms.
	MinDelay, MaxDelay time.Duration
	// Deadline is how long a task waits in all before it goes back to its
	// queue, without spending a retry. Defaults to 5s (10s for an
	// exchange).
	Deadline time.Duration
}

// DefaultWait returns the default wait of a kind: a random delay of 50ms
// to 500ms between attempts, for up to 5s.
func DefaultWait() Wait { return waitOf(keyorder.DefaultWait) }

// Or returns w with each zero field taken from d.
func (w Wait) Or(d Wait) Wait {
	return Wait{MinDelay: cmp.Or(w.MinDelay, d.MinDelay), MaxDelay: cmp.Or(w.MaxDelay, d.MaxDelay), Deadline: cmp.Or(w.Deadline, d.Deadline)}
}

// Validate returns an error for a negative field or a MinDelay above
// MaxDelay.
func (w Wait) Validate() error {
	switch {
	case w.MinDelay < 0 || w.MaxDelay < 0 || w.Deadline < 0:
		return fmt.Errorf("negative wait %+v", w)
	case w.MinDelay > w.MaxDelay:
		return fmt.Errorf("wait min delay %v above max delay %v", w.MinDelay, w.MaxDelay)
	}
	return nil
}

// lock is w as the lock reads it.
func (w Wait) lock() keyorder.Wait {
	return keyorder.Wait{MinDelay: w.MinDelay, MaxDelay: w.MaxDelay, Deadline: w.Deadline}
}

func waitOf(l keyorder.Wait) Wait {
	return Wait{MinDelay: l.MinDelay, MaxDelay: l.MaxDelay, Deadline: l.Deadline}
}

// kinds is the worker's table, one entry per kind of tasks.Kinds.
var kinds = []Kind{
	// An exchange waits longer than a modify: it goes first (its queue
	// has the higher weight), and a modify can wait for it.
	NewKind(Wait{Deadline: 10 * time.Second}, exchange),
	NewKind(Wait{}, modify),
}

// exchange is the handler of order:exchange tasks.
func exchange(ctx context.Context, store orders.Exchanger, x tasks.ExchangePayload) error {
	_, err := store.Exchange(ctx, x.EventID, x.OrderNo, orders.Exchange{
		Items: x.Items, NewOrderNo: x.NewOrderNo, Reason: x.Reason})
	return err
}

// modify is the handler of order:modify tasks.
func modify(ctx context.Context, store orders.Modifier, m tasks.ModifyPayload) error {
	_, err := store.Modify(ctx, m.EventID, m.OrderNo, orders.Changes{
		Address: m.Changes.Address, Remark: m.Changes.Remark, Items: m.Changes.Items})
	return err
}

// Kinds returns the worker's entries, one per kind of the contract, with
// their default waits: the default of [Config.Kinds].
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// KindsFor returns the entries of [Kinds] whose write store implements
// (all of them for a store that forwards changes: orders.Forwarder), in
// Kinds' order, with their default waits: the Config.Kinds of a Worker
// around a store that serves some kinds only. Such a Worker does not
// serve the other kinds' queues, and a kind added to the contract later
// is left out rather than refused by [New]. Its tasks stay in their queue
// for Workers that serve them; every Worker of a deployment should serve
// the same kinds (see Config.Kinds: a Worker that lacks a kind skips its
// positions as gaps). For a store without any write it returns an empty
// list (not nil), which New refuses.
func KindsFor(store orders.Store) []Kind {
	out := []Kind{} // never nil, which Config.Kinds reads as the default

	for _, k := range kinds {
		if k.has(store) {
			out = append(out, k)
		}
	}
	return out
}

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
