// Package workertest runs one task through a kind's handler against an
// order store, with the rules a worker.Worker applies around it, without
// an asynq server or Redis: the way river's rivertest.Worker tests a job's
// worker. Use it to test a store of your own, or a kind of your own, in a
// plain unit test:
//
//	w, err := workertest.New(mystore.New(), workertest.Config{})
//	res := w.Work(ctx, tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: ...})
//	// res.Outcome == worker.OutcomeOK
//
// What it applies, as the Worker does:
//   - the kind: a task type that none of Config.Kinds has is rejected, and
//     so is a payload that its kind's strict parser refuses (both are
//     archived by a Worker at once);
//   - the store's write: [New] refuses a kind whose store lacks its write
//     (worker.ErrNoWrite), as worker.New does;
//   - the fence: each run writes under a fence (orders.Write in the
//     context, read with orders.FencedWrite) newer than every fence this
//     Worker gave the order before, taken from the clock in microseconds as
//     the order lock's are, with the Worker's ID and the run's start;
//   - the position, as far as it concerns one task: a payload without a
//     seq runs without order (worker.ModeFree); one whose seq is after
//     the newest position this Worker applied to its order runs in its
//     turn (worker.ModeTurn: the positions between are taken as skipped,
//     and the seq is recorded); one at or before it runs out of turn
//     (worker.ModePassed, orders.Write.SeqOutOfTurn);
//   - the outcome: a store error that no retry can fix (orders.Permanent)
//     is rejected (wrapped with asynq.SkipRetry), a stale fence is lost
//     (it would run again under a fresh lock), a handler's panic is an
//     error, and every other error is a failure that the Worker would
//     retry (worker.OutcomeError); see worker.Outcome.
//
// What it leaves out, because it needs several tasks, a queue or Redis:
// the order's lock and waiting for it, waiting for a turn, the gap check
// that skips positions, the hold that drains an order's next changes,
// retries and the failure budget, queues and shards, and the task ID
// contract.
package workertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// DefaultID is the default of Config.ID.
const DefaultID = "workertest"

// Config tunes a Worker. The zero value is valid and means all defaults.
type Config struct {
	// Kinds are the kinds whose tasks the Worker runs, as
	// worker.Config.Kinds. Defaults to worker.Kinds(), the contract's.
	Kinds []worker.Kind
	// ID is the writer written to the history (orders.Write.Worker).
	// Defaults to DefaultID.
	ID string
	// Now is the clock of the fences and of orders.Write.StartedAt.
	// Defaults to time.Now.
	Now func() time.Time
}

// Worker runs tasks one at a time through its kinds' handlers against a
// store. It is safe for concurrent use: runs are serialized, as a Worker's
// runs of one order are by the order's lock.
type Worker struct {
	store orders.Store
	kinds []worker.Kind
	id    string
	now   func() time.Time

	mu      sync.Mutex
	fences  map[string]int64 // the newest fence given to each order
	applied map[string]int64 // the newest position applied in its turn, by order
}

// Result is what one run did: what a Worker's Config.OnDone would see of
// it.
type Result struct {
	// Outcome classifies Err: one of worker's Outcome* constants.
	Outcome string
	// Err is what the run would return to asynq (nil when applied).
	Err error
	// Fence is the fence the run wrote under; 0 when it did not get to
	// the store (an unknown type, a bad payload).
	Fence int64
	// Mode says how the run took its position (see the package doc); empty
	// when it did not get to the store.
	Mode worker.Mode
	// Seq is the payload's position, when it could be read.
	Seq int64
}

// New returns a Worker that runs the tasks of cfg.Kinds against store. It
// returns an error for a nil store, and, as worker.New does, for a kind
// entry not made by worker.NewKind and one whose write store lacks
// (matching worker.ErrNoWrite, naming the kind and the interface).
func New(store orders.Store, cfg Config) (*Worker, error) {
	if store == nil {
		return nil, errors.New("workertest: nil store")
	}
	kinds := cfg.Kinds
	if kinds == nil {
		kinds = worker.Kinds()
	}
	for _, k := range kinds {
		if err := k.Check(store); err != nil {
			return nil, err
		}
	}
	if cfg.ID == "" {
		cfg.ID = DefaultID
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Worker{store: store, kinds: slices.Clone(kinds), id: cfg.ID, now: cfg.Now,
		fences: map[string]int64{}, applied: map[string]int64{}}, nil
}

// Work runs payload p as a task of its kind: p is marshalled as a producer
// would (tasks.Marshal) and run as [Worker.WorkTask] runs it. A nil p, or
// one that does not marshal, is rejected.
func (w *Worker) Work(ctx context.Context, p tasks.Payload) Result {
	if p == nil {
		return result(Result{}, fmt.Errorf("workertest: nil payload: %w", asynq.SkipRetry))
	}
	b, err := tasks.Marshal(p)
	if err != nil {
		return result(Result{}, fmt.Errorf("workertest: %w: %w", err, asynq.SkipRetry))
	}
	return w.WorkTask(ctx, asynq.NewTask(p.Kind().Type, b))
}

// WorkTask runs task t once, as a Worker runs it when its turn has come
// (see the package doc for the rules), and returns what the run did.
func (w *Worker) WorkTask(ctx context.Context, t *asynq.Task) Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.IndexFunc(w.kinds, func(k worker.Kind) bool { return k.Kind.Type == t.Type() })
	if i < 0 {
		return result(Result{}, fmt.Errorf("unknown task type %q: %w", t.Type(), asynq.SkipRetry))
	}
	k := w.kinds[i]
	p, err := k.Kind.Parse(t.Payload())
	if err != nil {
		// tasks' errors match asynq.SkipRetry: archived with the reason.
		return result(Result{}, fmt.Errorf("%s payload: %w", k.Kind.Type, err))
	}
	h := p.Header()
	now := w.now()
	r := Result{Seq: h.Seq, Fence: max(w.fences[h.OrderNo]+1, now.UnixMicro())}
	w.fences[h.OrderNo] = r.Fence
	switch {
	case h.Seq == 0:
		r.Mode = worker.ModeFree
	case h.Seq > w.applied[h.OrderNo]:
		r.Mode = worker.ModeTurn
	default:
		r.Mode = worker.ModePassed
	}
	wctx := orders.WithWrite(ctx, orders.Write{
		Fence:        r.Fence,
		Worker:       w.id,
		StartedAt:    now,
		Seq:          h.Seq,
		SeqOutOfTurn: r.Mode != worker.ModeTurn,
		NoResult:     true, // the worker reads only the error
	})
	err = apply(wctx, k, w.store, p)
	if err != nil && orders.Permanent(err) {
		err = fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	r = result(r, err)
	if r.Mode == worker.ModeTurn && (r.Outcome == worker.OutcomeOK || r.Outcome == worker.OutcomeRejected) {
		// The position's work is done: the order moves on past it.
		w.applied[h.OrderNo] = h.Seq
	}
	return r
}

// apply runs k's handler, turning a panic into an error as a Worker does.
func apply(ctx context.Context, k worker.Kind, store orders.Store, p tasks.Payload) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic in the %s handler: %v", k.Kind.Type, v)
		}
	}()
	return k.Apply(ctx, store, p)
}

func result(r Result, err error) Result {
	r.Err, r.Outcome = err, worker.Outcome(err)
	return r
}
