package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// Done describes one task run, for [Config.OnDone].
type Done struct {
	// Type is the task's type as found ("unknown" types included).
	Type string
	// TaskID is the asynq task ID.
	TaskID string
	// Queue is the queue the task was taken from.
	Queue string
	// Retried is how many times the task had failed before this run.
	Retried int
	// OrderNo, EventID and Seq are the payload's, when it could be read.
	OrderNo, EventID string
	Seq              int64
	// Outcome classifies Err: one of the Outcome* constants.
	Outcome string
	// Err is what the run returned to asynq (nil when applied).
	Err error
	// Locked says the run held its order's lock; Fence is the lease's
	// fencing token then, and Mode how it was granted (ModeTurn in its
	// turn, ModePassed for a position already passed, ModeFree without a
	// position).
	Locked bool
	Fence  int64
	Mode   Mode
	// Lock says how the lock (and the turn) was waited for.
	Lock LockStats
	// Skipped counts the positions before this one that the run skipped
	// (their tasks did not exist).
	Skipped int
	// Drained says the run was taken by a Worker that held its order's lock
	// for the change before it, in the same hold (see Config.DrainMax),
	// rather than dequeued by asynq.
	Drained bool
	// Started is when the run began; Took how long it lasted.
	Started time.Time
	Took    time.Duration
}

// Mode says how a task run's order lock was granted (Done.Mode).
type Mode string

// The modes of a run's lock, with the values the lock gives them (its
// lease's mode; a test holds them equal).
const (
	// ModeFree is a lock taken without a position: the task carries no
	// seq (it was enqueued by hand), so it runs without order.
	ModeFree Mode = "free"
	// ModeTurn is a lock taken in the position's turn: once the run's work
	// is done, the turn passes to the order's next position.
	ModeTurn Mode = "turn"
	// ModePassed is a lock whose position was already passed (or whose
	// order's sequence is gone): granted at once, like ModeFree; the store
	// checks the seq but does not record it (orders.Write.SeqOutOfTurn).
	ModePassed Mode = "passed"
)

// LockStats says how a task run waited for its order's lock and its turn
// (Done.Lock).
type LockStats struct {
	Waited        time.Duration // from the first attempt to the lock, over every round of the run
	Attempts      int           // attempts to take the lock (acquire scripts run)
	WokenByNotice int           // waits ended by a release notice
	WokenByDelay  int           // waits ended by the random delay
	TurnWaits     int           // attempts that found it not yet the position's turn
}

// run collects what one task run learns, for its log line, its metrics and
// OnDone. It lives in the context for the run.
type run struct {
	Done
	rep *keyorder.Report // the engine's account of the run
	// kind and payload are the task's, once admitted.
	kind    *Kind
	payload tasks.Payload
}

type runKey struct{}

func runFrom(ctx context.Context) *run {
	if r, ok := ctx.Value(runKey{}).(*run); ok {
		return r
	}
	return &run{} // a run outside the Worker's handler
}

// Outcomes of a task run, as logged and counted.
const (
	OutcomeOK       = "ok"       // applied (or replayed: already applied)
	OutcomeBusy     = "busy"     // the order stayed locked past the wait deadline; back to the queue, not a failure
	OutcomeWaiting  = "waiting"  // not yet its turn; back to the queue, not a failure
	OutcomeRejected = "rejected" // permanent error or out of its failure budget; the task is archived
	OutcomeLost     = "lost"     // the lease was lost or the fence was stale mid-run; runs again soon, not a failure

	// OutcomeUnconfirmed: WAIT_REPLICAS replicas did not confirm the
	// order's state in time, so nothing was written; runs again soon, not
	// a failure.
	OutcomeUnconfirmed = "unconfirmed"
	OutcomeError       = "error" // any other error; retried with backoff, a failure
)

// Outcome classifies a handler's error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, keyorder.ErrNotYourTurn):
		return OutcomeWaiting
	case errors.Is(err, keyorder.ErrBusy):
		return OutcomeBusy
	case errors.Is(err, asynq.SkipRetry):
		return OutcomeRejected
	case errors.Is(err, keyorder.ErrLost), errors.Is(err, orders.ErrStaleFence):
		return OutcomeLost
	case errors.Is(err, keyorder.ErrNotReplicated):
		return OutcomeUnconfirmed
	}
	return OutcomeError
}

// observe is the engine's RunnerConfig.Observe: it wraps every run, asynq's
// and a hold's, with its one log line, its metrics, its span and OnDone.
// Task errors are logged here and nowhere else.
func (w *Worker) observe(ctx context.Context, t *asynq.Task, rep *keyorder.Report, next func(context.Context) error) error {
	w.inflight.Add(1)
	defer w.inflight.Done()
	r := &run{rep: rep}
	r.Started, r.Type, r.TaskID, r.Queue, r.Retried = rep.Started, t.Type(), rep.TaskID, rep.Queue, rep.Retried
	var span trace.Span
	if w.tracer != nil {
		ctx, span = w.startRun(ctx, t, r)
	}
	ctx = context.WithValue(ctx, runKey{}, r)
	err := next(ctx)
	if rep.Final && r.payload != nil {
		w.created(ctx, r.payload, err)
	}
	r.Took, r.Err, r.Outcome = time.Since(r.Started), err, Outcome(err)
	r.Locked, r.Fence, r.Mode, r.Lock = rep.Locked, rep.Fence, Mode(rep.Mode), LockStats(rep.Lock)
	r.Skipped, r.Drained = rep.Skipped, rep.Held > 0
	if r.Drained && err != nil && ctx.Err() == nil && keyorder.Archives(err, rep.Retried, rep.MaxRetry) {
		// asynq's ErrorHandler (countArchived) sees asynq's runs only.
		w.cfg.Metrics.observeArchived(w.taskTypeLabel(t.Type()), archiveReason(err))
	}
	w.cfg.Metrics.observeTask(w.taskTypeLabel(t.Type()), r.Queue, err, r.Took, &r.Done)
	w.logRun(ctx, &r.Done)
	if span != nil {
		endRun(span, &r.Done)
	}
	if w.cfg.OnDone != nil {
		w.cfg.OnDone(r.Done)
	}
	return err
}

func (w *Worker) logRun(ctx context.Context, d *Done) {
	level, msg := zap.InfoLevel, "task done"
	switch d.Outcome {
	case OutcomeOK:
	case OutcomeBusy, OutcomeWaiting:
		msg = "task waits; back to its queue"
	case OutcomeRejected:
		level, msg = zap.WarnLevel, "task rejected; archived"
	default:
		level, msg = zap.WarnLevel, "task failed; will run again"
	}
	ce := w.log.Check(level, msg)
	if ce == nil {
		return // the level is off: build no fields
	}
	fields := []zap.Field{
		zap.String("task_type", d.Type),
		zap.String("task_id", d.TaskID),
		zap.String("queue", d.Queue),
		zap.Int("retried", d.Retried),
		zap.String("order_no", d.OrderNo),
		zap.String("event_id", d.EventID),
		zap.Duration("lock_wait", d.Lock.Waited),
		zap.Int("lock_attempts", d.Lock.Attempts),
		zap.Int("woken_by_notice", d.Lock.WokenByNotice),
		zap.Duration("duration", d.Took),
	}
	if d.Seq > 0 {
		fields = append(fields, zap.Int64("seq", d.Seq))
	}
	if d.Locked {
		fields = append(fields, zap.Int64("fence", d.Fence), zap.String("lock_mode", string(d.Mode)))
	}
	if d.Skipped > 0 {
		fields = append(fields, zap.Int("skipped_before", d.Skipped))
	}
	if d.Drained {
		fields = append(fields, zap.Bool("drained", true))
	}
	if d.Outcome != OutcomeOK && d.Outcome != OutcomeRejected {
		fields = append(fields, zap.String("outcome", d.Outcome))
	}
	if d.Err != nil {
		fields = append(fields, zap.Error(d.Err))
	}
	fields = append(fields, logging.TraceFields(ctx)...)
	ce.Write(fields...)
}

// admit is the engine's RunnerConfig.Admit: it reads the payload once,
// strictly, before the task's turn, and archives a task that breaks the
// contract: an unknown type or a malformed payload; a task on a queue that
// is none of its placements (its position is used up, since the gap check
// would not find it there); a task whose ID is not its event ID.
// failure is the Runner's RunnerConfig.Failure: the failure policy of the
// task's kind (Config.Failures); Continue for a type of no kind.
func (w *Worker) failure(t *asynq.Task) keyorder.FailurePolicy {
	if k := w.cfg.kindOf(t.Type()); k != nil {
		return w.cfg.Failures[k.Kind.Name]
	}
	return Continue
}

func (w *Worker) admit(ctx context.Context, t *asynq.Task) (keyorder.Admission, error) {
	r := runFrom(ctx)
	k := w.cfg.kindOf(t.Type())
	if k == nil {
		return keyorder.Admission{}, tag(fmt.Errorf("unknown task type %q: %w", clip(t.Type()), asynq.SkipRetry), errUnknownType)
	}
	p, err := k.Kind.Parse(t.Payload())
	if err != nil {
		// tasks' errors match asynq.SkipRetry: archived with the reason.
		return keyorder.Admission{}, fmt.Errorf("%s payload: %w", k.Kind.Type, err)
	}
	h := p.Header()
	r.kind, r.payload = k, p
	r.OrderNo, r.EventID, r.Seq = h.OrderNo, h.EventID, h.Seq
	a := keyorder.Admission{Key: h.OrderNo, Label: tasks.PositionLabel(k.Kind.Type, h.EventID), Wait: w.cfg.Waits[k.Kind.Name].lock()}
	if q := r.Queue; !w.cfg.Shards.Accepts(k.Kind, h.OrderNo, q) {
		a.Abandon = true
		return a, w.misplaced(k.Kind, h.OrderNo, q)
	}
	if r.TaskID != h.EventID {
		// The contract: the order's view, the gap check and the dashboard
		// find a change by its event ID as its task ID.
		return a, tag(fmt.Errorf("task ID %q is not the payload's event_id %q, as the task contract requires: %w",
			clip(r.TaskID), h.EventID, asynq.SkipRetry), errTaskIDMismatch)
	}
	return a, nil
}

// misplaced is the error of a task of kind k for order orderNo found on
// queue q, which is none of its placements: another kind's queue, or
// another shard than its order's. The workers look a position's task up
// only where the contract puts it (the gap check would skip it), so it is
// archived.
func (w *Worker) misplaced(k *tasks.Kind, orderNo, q string) error {
	s := w.cfg.Shards
	return tag(fmt.Errorf("%s task of order %s on queue %q: its queue is %s (shards %s): %w",
		k.Type, orderNo, clip(q), strings.Join(s.Placements(k, orderNo), " or "), s, asynq.SkipRetry), errMisplaced)
}

// process is the handler of every kind: it writes the payload that admit
// read, in the order's lock and turn, under the run's fence and at its
// position (keyorder.Run), with the lease as the commit hook of a Redis
// store on the lock's Redis, which then also checks the lock's newest
// fence and releases the lock, passing the turn on, or keeps it for the
// order's next change, parked, which the hold then runs.
func (w *Worker) process(ctx context.Context, t *asynq.Task) error {
	r := runFrom(ctx)
	run, ok := keyorder.RunFrom(ctx)
	if !ok || r.payload == nil {
		return fmt.Errorf("worker: task %s ran outside the Worker's Runner: %w", clip(t.Type()), asynq.SkipRetry)
	}
	k, p := r.kind, r.payload
	h := p.Header()
	wr := orders.Write{
		Worker:    w.cfg.ID,
		StartedAt: time.Now(),
		Fence:     run.Fence,
		// Only a position applied in its turn moves the order on, or
		// one whose order's sequence is gone: a seq that the order's
		// sequence passed, or never handed out, is checked but not
		// recorded.
		SeqOutOfTurn: !run.Record,
		NoResult:     true, // the worker reads only the error
		Commit:       run.Commit,
	}
	if h.Seq > 0 {
		wr.Seq = run.Pos
	}
	err := w.write(orders.WithWrite(ctx, wr), k, p, wr.Fence)
	// A change of an order that an exchange was to create and did not, or
	// whose position was skipped: say why.
	return storeError(w.explain(ctx, h, tasks.PositionLabel(k.Kind.Type, h.EventID), err))
}

// write runs the kind's store write inside the run's "order write" span,
// which ends (with the write's error) even when the handler panics.
func (w *Worker) write(ctx context.Context, k *Kind, p tasks.Payload, fence int64) (err error) {
	ctx, span := w.startSpan(ctx, tracing.SpanWrite)
	defer func() {
		tracing.RecordError(span, err)
		span.End()
	}()
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrOrderNo.String(p.Header().OrderNo), tracing.AttrFence.Int64(fence))
	}
	return k.Apply(ctx, w.store, p)
}

// created settles the creation a change of p's kind was to make (an
// exchange creating its replacement), once its work ended for good: the
// replacement exists now, or, with err, never will.
func (w *Worker) created(ctx context.Context, p tasks.Payload, err error) {
	c, ok := p.(tasks.Creator)
	if !ok {
		return
	}
	h := p.Header()
	w.runner.Created(ctx, c.Creates(), h.EventID, "exchange "+h.EventID+" of "+h.OrderNo, err)
}

// clip cuts a string from a task (type, ID, queue) to a length fit for a
// log line, an error or a lock's meta.
func clip(s string) string {
	const limit = keyorder.MaxMetaLen
	if len(s) > limit {
		return s[:limit]
	}
	return s
}
