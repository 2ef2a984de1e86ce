package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The drain of a hold.
//
// Only the head of an order waits in the queue: a change accepted behind
// unfinished changes of its order is parked (the producer puts its task in
// asynq's retry set, its position marked parked), and the change before it
// hands it the turn. When a run in its turn commits, and the order's next
// change is parked, the commit keeps the order's lock (keyorder.Lease.Drain),
// and the engine's hold (keyorder.Turns.Drain) takes that change's task
// out of asynq itself, runs it here in the same hold, with the same fence,
// as its own run (its log line, metrics, span and OnDone), records its end
// in asynq as asynq's processor would, and goes on for a quantum
// (Config.DrainMax and DrainFor; keyorder.RunnerConfig.DrainMax says how
// long it lasts and when the hold yields to other orders). On one Redis,
// a drained change's commit also takes the next change's task, in its own
// round trip (keyorder's "fold").
//
// A failure ends the hold (the commit of a failed run does not keep the
// lock), and the failed change backs off in asynq's retry set as a failing
// head does. A Worker killed mid-hold loses nothing: the changes it had
// taken are active in asynq with a lease, and the recoverer brings them
// back once the lease ends (Config.RecoverAfter past it); one it had
// applied replays (the store knows its event) and completes.

// The defaults of the drain's quantum: the engine's.
const (
	// DefaultDrainMax is the default of Config.DrainMax.
	DefaultDrainMax = keyorder.DefaultDrainMax
	// DefaultDrainFor is the default of Config.DrainFor.
	DefaultDrainFor = keyorder.DefaultDrainFor
)

// holdConfig is how the Worker's holds drain an order (keyorder.Turns.Drain).
func (w *Worker) holdConfig() keyorder.HoldConfig {
	return keyorder.HoldConfig{
		Max:      w.cfg.DrainMax,
		For:      w.cfg.DrainFor,
		Locate:   w.locateChange,
		Run:      w.runHeld,
		Busy:     w.busy,
		Queues:   func() []string { return w.served },
		Stopping: w.stopping.Load,
		Failed: func(_ context.Context, t *asynq.Task, held keyorder.Held, err error) {
			if keyorder.Archives(err, held.Retried, held.MaxRetry) {
				w.cfg.Metrics.observeArchived(w.taskTypeLabel(t.Type()), archiveReason(err))
			}
		},
	}
}

// locateChange is the holds' Locate: the placements of a change's task
// under Config.Shards (orderkeys.Locate). A replacement's creation, whose
// position is held by an exchange of another order, is no change to take
// in a hold.
func (w *Worker) locateChange(orderNo, label string) ([]string, string, bool) {
	if _, _, from, ok := w.kinds.ParseLabel(label); !ok || from != "" {
		return nil, "", false
	}
	return w.locate(orderNo, label)
}

// drain goes on with the order's next changes under the lease that the
// commit of run first kept, and ends the hold.
func (w *Worker) drain(ctx context.Context, first *run) {
	changes, yielded := w.turns.Drain(ctx, first.kept, first.Started, &w.hold)
	w.cfg.Metrics.observeHold(changes, yielded)
}

// busy reports whether more than half of the Worker's slots (its
// Concurrency) are in use. A busy Worker's holds yield at the end of their
// quantum even when nothing waits in the queues: the order's next change
// then goes to whichever worker takes it first, so that hot orders spread
// over the workers (a worker that took a burst of orders' first changes
// would otherwise keep them all) rather than stay where they landed. A
// Worker with room to spare keeps its holds: another quantum costs it
// nothing, and a release would cost the order a trip through the queue.
func (w *Worker) busy() bool {
	return 2*w.slots.Load() > int64(w.cfg.Concurrency)
}

// runHeld is the holds' Run: it runs task t, which a hold took out of its
// queue, as its own run, with its log line, metrics, span and OnDone.
func (w *Worker) runHeld(ctx context.Context, t *asynq.Task, held keyorder.Held) error {
	w.inflight.Add(1)
	defer w.inflight.Done()
	r := &run{held: &held, maxRetry: held.MaxRetry}
	r.Started, r.Type, r.TaskID, r.Queue, r.Retried, r.Drained = time.Now(), t.Type(), held.ID, held.Queue, held.Retried, true
	return w.observed(ctx, t, r, asynq.HandlerFunc(w.process))
}

// applyHeld applies payload p of a run of a drained hold, at the position
// of tr, under the hold's lease, which its last commit kept for that
// position.
func (w *Worker) applyHeld(ctx context.Context, k *Kind, p tasks.Payload, r *run, tr *keyorder.TaskRun) error {
	held := r.held
	if tr.Turn != held.Turn {
		// Not the position the hold passed on to (the task was refused as
		// a duplicate and holds another): back to its queue, where it
		// takes its own turn.
		return w.turns.Later(fmt.Errorf("task holds position %d, not %d, which the hold passed on to: %w", tr.Turn.Pos, held.Turn.Pos, keyorder.ErrNotYourTurn))
	}
	prev := held.Lease.Turn()
	if err := held.Lease.Next(tr.Turn); err != nil {
		return w.turns.Later(fmt.Errorf("%w: %w", keyorder.ErrNotYourTurn, err))
	}
	r.Locked, r.Fence, r.Mode = true, held.Lease.Fence(), ModeTurn
	// Its "order lock" span: taken in the hold, kept for it by the change
	// before, with the hold's fence; no wait.
	if _, span := w.startSpan(ctx, tracing.SpanLock); span.IsRecording() {
		span.SetAttributes(tracing.AttrOrderNo.String(held.Lease.Key()), tracing.AttrSeq.Int64(tr.Turn.Pos),
			tracing.AttrFence.Int64(r.Fence), tracing.AttrLockMode.String(string(ModeTurn)),
			attribute.Int64("orderworker.lock.waited_ms", 0), attribute.Int("orderworker.hold.changes", held.Runs))
		span.AddEvent(tracing.EventInHold, trace.WithAttributes(tracing.AttrHeadSeq.Int64(prev.Pos), tracing.AttrHead.String(prev.Label)))
		span.End()
	}
	return w.apply(ctx, k, p, held.Lease, r, tr)
}
