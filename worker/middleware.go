package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
	"go.opentelemetry.io/otel/attribute"
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
	maxRetry int // the task's asynq MaxRetry
	// held is set for a run of a drained hold (the lease kept for its
	// position, see drain.go); nil for a run that takes its own lock.
	held *keyorder.Held
	// kept is set when the run's commit kept its lease for the next
	// position: the hold goes on with it.
	kept *keyorder.Lease
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

// observe is the outermost layer: it writes the one log line of each task
// run, records its metrics and calls OnDone. Task errors are logged here and
// nowhere else.
func (w *Worker) observe(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		w.inflight.Add(1)
		defer w.inflight.Done()
		w.slots.Add(1)
		defer w.slots.Add(-1)
		r := &run{}
		r.Started = time.Now()
		r.Type = t.Type()
		r.TaskID, _ = asynq.GetTaskID(ctx)
		r.Queue, _ = asynq.GetQueueName(ctx) // one of w.queues: a bounded label
		r.Retried, _ = asynq.GetRetryCount(ctx)
		r.maxRetry, _ = asynq.GetMaxRetry(ctx)
		err := w.observed(ctx, t, r, next)
		if r.kept != nil {
			// The run's commit passed the turn on and kept the order's
			// lock: go on with the order's next changes in this hold.
			w.drain(ctx, r)
		}
		return err
	})
}

// observed runs next for t with the one log line, the metrics, the span
// and OnDone of run r: a run taken from asynq (observe) or from a drained
// hold (drain.go).
func (w *Worker) observed(ctx context.Context, t *asynq.Task, r *run, next asynq.Handler) error {
	var span trace.Span
	if w.tracer != nil {
		ctx, span = w.startRun(ctx, t, r)
	}
	ctx = context.WithValue(ctx, runKey{}, r)
	err := next.ProcessTask(ctx, t)
	r.Took, r.Err, r.Outcome = time.Since(r.Started), err, Outcome(err)
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
	fields = append(fields, tracing.LogFields(ctx)...)
	ce.Write(fields...)
}

// process runs one task: it reads the payload once, strictly, takes the
// order's lock in the task's turn and applies the payload.
func (w *Worker) process(ctx context.Context, t *asynq.Task) error {
	r := runFrom(ctx)
	k := w.cfg.kindOf(t.Type())
	if k == nil {
		return tag(fmt.Errorf("unknown task type %q: %w", clip(t.Type()), asynq.SkipRetry), errUnknownType)
	}
	p, err := k.Kind.Parse(t.Payload())
	if err != nil {
		// tasks' errors match asynq.SkipRetry: archived with the reason.
		return fmt.Errorf("%s payload: %w", k.Kind.Type, err)
	}
	h := p.Header()
	r.OrderNo, r.EventID, r.Seq = h.OrderNo, h.EventID, h.Seq
	label := tasks.PositionLabel(k.Kind.Type, h.EventID)
	var turn keyorder.Turn
	if h.Seq > 0 {
		turn = keyorder.Turn{Pos: h.Seq, Label: label}
	}
	if q := r.Queue; !w.cfg.Shards.Accepts(k.Kind, h.OrderNo, q) {
		err := w.misplaced(k.Kind, h.OrderNo, q)
		if turn.Pos > 0 {
			w.abandon(ctx, h, turn, p, "archived: "+err.Error())
		} else {
			w.turns.Note(ctx, h.OrderNo, 0, label, "archived: "+err.Error())
		}
		return err
	}
	if r.TaskID != h.EventID {
		// The contract: the order's view, the gap check and the dashboard
		// find a change by its event ID as its task ID.
		err := tag(fmt.Errorf("task ID %q is not the payload's event_id %q, as the task contract requires: %w",
			clip(r.TaskID), h.EventID, asynq.SkipRetry), errTaskIDMismatch)
		w.turns.Note(ctx, h.OrderNo, h.Seq, label, "archived: "+err.Error())
		return err
	}

	tr := keyorder.TaskRun{Key: h.OrderNo, Turn: turn, Meta: clip(k.Kind.Type + " " + r.TaskID), Label: label,
		Task: t, Retried: r.Retried, MaxRetry: r.maxRetry}
	if r.held != nil {
		// A run of a drained hold: the lock is held in its turn already.
		return w.applyHeld(ctx, k, p, r, &tr)
	}
	lctx, lspan := w.startSpan(ctx, tracing.SpanLock)
	if lspan.IsRecording() {
		lspan.SetAttributes(tracing.AttrOrderNo.String(h.OrderNo), tracing.AttrSeq.Int64(h.Seq))
	}
	lease, taken, err := w.turns.TakeTask(lctx, &tr, w.cfg.Waits[k.Kind.Name].lock())
	endLock(lspan, lease, taken, err)
	r.Lock.Waited, r.Skipped = taken.Waited, taken.Skipped
	if err != nil {
		return err
	}
	st := lease.Stats()
	st.Waited += taken.Waited // waits of earlier rounds (a skipped head)
	r.Locked, r.Fence, r.Mode, r.Lock = true, lease.Fence(), Mode(lease.Mode()), LockStats(st)
	return w.apply(ctx, k, p, lease, r, &tr)
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

// apply runs the kind's handler inside the lease, and releases it: passing
// the turn on when the task's work is done (applied, or archived), keeping
// it when the task will run again.
func (w *Worker) apply(ctx context.Context, k *Kind, p tasks.Payload, lease *keyorder.Lease, r *run, tr *keyorder.TaskRun) (err error) {
	h := p.Header()
	wctx := lease.Keep(ctx)
	defer func() {
		if v := recover(); v != nil {
			// A handler bug: a failure like any other, and the order's
			// lock is released now rather than at the end of its lease.
			tracing.Log(ctx, w.log).Error("task handler panicked", zap.String("task_id", r.TaskID), zap.Any("panic", v), zap.Stack("stack"))
			err = fmt.Errorf("panic in the %s handler: %v", k.Kind.Type, v)
		}
		// The engine decides what asynq gets and passes the turn on when
		// the change's work is done. When asynq's context for the run is
		// done (its deadline, a shutdown, a cancel from the dashboard),
		// asynq decides what becomes of the task without reading this
		// error: the turn stays, and the task, if it is archived, is
		// skipped by the gap check.
		hctx, hspan := w.startSpan(ctx, tracing.SpanHandoff)
		var final bool
		err, final = w.turns.EndTask(hctx, wctx, lease, tr, err)
		if hspan.IsRecording() {
			hspan.SetAttributes(attribute.Bool("orderworker.turn_passed", final && lease.Mode() == keyorder.ModeTurn))
		}
		if _, kept := lease.Kept(); kept {
			r.kept = lease
		}
		if final {
			w.created(hctx, p, err)
		}
		hspan.End()
	}()
	if skip := tr.OutOfBudget(); skip != nil {
		// It failed past its budget already, in runs that asynq counted
		// without their end reaching the worker (runs that outlived
		// their deadline): archived in its turn, which passes on, rather
		// than applied after all, as the engine's Runner does.
		return skip
	}
	err = w.writeCaughtUp(wctx, k, p, lease, orders.Write{
		Worker:    w.cfg.ID,
		StartedAt: time.Now(),
		// Only a position applied in its turn moves the order on, or
		// one whose order's sequence is gone (see recordsOutOfTurn): a
		// seq that the order's sequence passed, or never handed out, is
		// checked but not recorded.
		SeqOutOfTurn: lease.Mode() != keyorder.ModeTurn && !recordsOutOfTurn(lease, h.Seq, time.Now()),
		NoResult:     true, // the worker reads only the error
		// A Redis store on the lock's Redis also checks the lock's newest
		// fence and releases the lock, passing the turn on, with a
		// modify's commit; or keeps it for the order's next change,
		// parked, which this hold then runs (drain.go), while the hold's
		// quantum lasts.
		Commit: lease,
	})
	// A change of an order that an exchange was to create and did not, or
	// whose position was skipped: say why.
	return storeError(w.explain(ctx, h, tasks.PositionLabel(k.Kind.Type, h.EventID), err))
}

// writeCaughtUp writes p with wr, under lease's fence and at its position
// (lease.Seq: the change's position plus its order's offset). When the
// store refuses it with what it has seen that the order's Redis lost in a
// failover (keyorder.StoreAhead: a fence or a position of the old
// master's), it moves the order above that and writes again at once, in
// this hold, rather than archiving a change it never applied as passed or
// waiting for the new master's clock to pass the old fences.
func (w *Worker) writeCaughtUp(ctx context.Context, k *Kind, p tasks.Payload, lease *keyorder.Lease, wr orders.Write) error {
	log := func() *zap.Logger { return tracing.Log(ctx, w.log).With(zap.String("order_no", p.Header().OrderNo)) }
	tries := 0
	return lease.WriteCaughtUp(ctx, func() error {
		if tries++; tries > 1 {
			log().Info("order store ahead of the order's Redis; caught up",
				zap.Int64("fence", lease.Fence()), zap.Int64("seq", lease.Seq()))
		}
		wr.Fence = lease.Fence()
		if p.Header().Seq > 0 {
			wr.Seq = lease.Seq()
		}
		lease.Drain(w.hold.Drains())
		return w.write(orders.WithWrite(ctx, wr), k, p, wr.Fence)
	}, func(a keyorder.StoreAhead, cerr error) {
		log().Warn("order store ahead of the order's Redis; not caught up",
			zap.Int64("store_fence", a.Fence), zap.Int64("store_seq", a.Pos), zap.Error(cerr))
	})
}

// recordsOutOfTurn reports whether the position seq of a change that runs
// out of its turn is recorded by the store all the same: when its order's
// sequence is gone (expired, lost with a master of a Cluster, or deleted
// by a Redis user that may write the sequences, as the intake's may), the
// changes of the order run in whatever order their tasks come, and only
// the store's record of the newest position applied keeps an older one
// from applying over a newer one (it is refused as passed, and archived
// with that reason). A position further ahead than any sequence hands out
// (positions start at Redis TIME in µs: seq above the clock by more than
// an hour) is none the sequence handed out: a task enqueued by hand, which
// would hold every later change back, so it is only checked.
func recordsOutOfTurn(lease *keyorder.Lease, seq int64, now time.Time) bool {
	return lease.SequenceGone() && seq > 0 && seq <= now.Add(time.Hour).UnixMicro()
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
	w.turns.Created(ctx, c.Creates(), h.EventID, "exchange "+h.EventID+" of "+h.OrderNo, err)
}

// abandon uses up the position of a task that is archived without running
// in its turn (its work is done: it never will run), and settles the
// creation it was to make.
func (w *Worker) abandon(ctx context.Context, h tasks.Header, turn keyorder.Turn, p tasks.Payload, outcome string) {
	w.turns.Abandon(ctx, h.OrderNo, turn, outcome)
	w.created(ctx, p, errors.New(outcome))
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
