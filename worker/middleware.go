package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/requeue"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
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
	// Started is when the run began; Took how long it lasted.
	Started time.Time
	Took    time.Duration
}

// Mode says how a task run's order lock was granted (Done.Mode).
type Mode string

// The modes of a run's lock, with the values the lock gives them (its
// lock.Mode; a test holds them equal).
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
type run struct{ Done }

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
	OutcomeError    = "error"    // any other error; retried with backoff, a failure
)

// Outcome classifies a handler's error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, lock.ErrNotYourTurn):
		return OutcomeWaiting
	case errors.Is(err, lock.ErrBusy):
		return OutcomeBusy
	case errors.Is(err, asynq.SkipRetry):
		return OutcomeRejected
	case errors.Is(err, lock.ErrLost), errors.Is(err, orders.ErrStaleFence):
		return OutcomeLost
	}
	return OutcomeError
}

// waitError is a task that only waited (for the lock or its turn): it goes
// back to its queue after delay, without spending a retry.
type waitError struct {
	err   error
	delay time.Duration
}

func (e *waitError) Error() string { return e.err.Error() }
func (e *waitError) Unwrap() error { return e.err }

// failure is a failed run that will be retried after delay, chosen when it
// failed so that the positions behind it can wait just as long.
type failure struct {
	err   error
	delay time.Duration
}

func (e *failure) Error() string { return e.err.Error() }
func (e *failure) Unwrap() error { return e.err }

// observe is the outermost layer: it writes the one log line of each task
// run, records its metrics and calls OnDone. Task errors are logged here and
// nowhere else.
func (w *Worker) observe(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		w.inflight.Add(1)
		defer w.inflight.Done()
		r := &run{}
		r.Started = time.Now()
		r.Type = t.Type()
		r.TaskID, _ = asynq.GetTaskID(ctx)
		r.Queue, _ = asynq.GetQueueName(ctx) // one of w.queues: a bounded label
		r.Retried, _ = asynq.GetRetryCount(ctx)
		ctx = context.WithValue(ctx, runKey{}, r)
		err := next.ProcessTask(ctx, t)
		r.Took, r.Err, r.Outcome = time.Since(r.Started), err, Outcome(err)
		w.cfg.Metrics.observeTask(w.taskTypeLabel(t.Type()), r.Queue, err, r.Took, &r.Done)
		w.logRun(&r.Done)
		if w.cfg.OnDone != nil {
			w.cfg.OnDone(r.Done)
		}
		return err
	})
}

func (w *Worker) logRun(d *Done) {
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
	if d.Outcome != OutcomeOK && d.Outcome != OutcomeRejected {
		fields = append(fields, zap.String("outcome", d.Outcome))
	}
	if d.Err != nil {
		fields = append(fields, zap.Error(d.Err))
	}
	ce.Write(fields...)
}

// process runs one task: it reads the payload once, strictly, takes the
// order's lock in the task's turn and applies the payload.
func (w *Worker) process(ctx context.Context, t *asynq.Task) error {
	r := runFrom(ctx)
	k := w.cfg.kindOf(t.Type())
	if k == nil {
		return fmt.Errorf("unknown task type %q: %w", clip(t.Type()), asynq.SkipRetry)
	}
	p, err := k.Kind.Parse(t.Payload())
	if err != nil {
		// tasks' errors match asynq.SkipRetry: archived with the reason.
		return fmt.Errorf("%s payload: %w", k.Kind.Type, err)
	}
	h := p.Header()
	r.OrderNo, r.EventID, r.Seq = h.OrderNo, h.EventID, h.Seq
	var turn lock.Turn
	if h.Seq > 0 {
		turn = lock.Turn{Pos: h.Seq, Label: tasks.PositionLabel(k.Kind.Type, h.EventID)}
	}
	label := tasks.PositionLabel(k.Kind.Type, h.EventID)
	if q, _ := asynq.GetQueueName(ctx); !w.cfg.Shards.Accepts(k.Kind, h.OrderNo, q) {
		err := w.misplaced(k.Kind, h.OrderNo, q)
		if turn.Pos > 0 {
			w.settleAhead(ctx, h, turn, p, "archived: "+err.Error())
		} else {
			w.noteArchived(ctx, h.OrderNo, 0, label, err)
		}
		return err
	}
	if r.TaskID != h.EventID {
		// The contract: the order's view, the gap check and the dashboard
		// find a change by its event ID as its task ID.
		err := fmt.Errorf("task ID %q is not the payload's event_id %q, as the task contract requires: %w",
			clip(r.TaskID), h.EventID, asynq.SkipRetry)
		w.noteArchived(ctx, h.OrderNo, h.Seq, label, err)
		return err
	}

	maxRetry, _ := asynq.GetMaxRetry(ctx)
	// asynq archives a task that returns any error once its retries reach
	// MaxRetry, even a wait: such a task (enqueued by hand against
	// tasks.MaxRetry's rule) waits for its turn until its own deadline.
	lastChance := r.Retried >= maxRetry
	wait := w.cfg.Waits[k.Kind.Name]
	if lastChance {
		if dl, ok := ctx.Deadline(); ok {
			wait.Deadline = max(time.Until(dl)-time.Second, wait.Deadline)
		}
	}
	meta := clip(k.Kind.Type + " " + r.TaskID)

	lease, err := w.acquire(ctx, h.OrderNo, meta, turn, wait, r)
	if err != nil {
		if errors.Is(err, lock.ErrBadPosition) {
			err = fmt.Errorf("%w: %w", err, asynq.SkipRetry)
			w.noteArchived(ctx, h.OrderNo, h.Seq, label, err)
		}
		return err
	}
	st := lease.Stats()
	st.Waited += r.Lock.Waited // waits of earlier rounds (a skipped head)
	r.Locked, r.Fence, r.Mode, r.Lock = true, lease.Fence(), Mode(lease.Mode()), LockStats(st)
	return w.apply(ctx, k, p, lease, r, tasks.FailureBudget(maxRetry))
}

// misplaced is the error of a task of kind k for order orderNo found on
// queue q, which is none of its placements: another kind's queue, or
// another shard than its order's. The workers look a position's task up
// only where the contract puts it (the gap check would skip it), so it is
// archived.
func (w *Worker) misplaced(k *tasks.Kind, orderNo, q string) error {
	s := w.cfg.Shards
	return fmt.Errorf("%s task of order %s on queue %q: its queue is %s (shards %s): %w",
		k.Type, orderNo, clip(q), strings.Join(s.Placements(k, orderNo), " or "), s, asynq.SkipRetry)
}

// acquire takes the order's lock in the task's turn. A task more than two
// positions behind the head, or that waited its deadline, is parked: it
// goes back to its queue with a *waitError, to be brought to the front of
// the queue when its turn nears (see wake), and to look again after
// GapWait at the latest.
// When the head of the order's sequence has been unfilled longer than
// GapWait, it first checks whether the head's task exists and skips the
// head when it does not, then tries again.
func (w *Worker) acquire(ctx context.Context, orderNo, meta string, turn lock.Turn, wait lock.Wait, r *run) (*lock.Lease, error) {
	checked := int64(0) // the head found to exist: no need to look again
	for {
		wt := wait
		if turn.Pos > 0 && checked == 0 {
			wt.StuckAfter = w.cfg.GapWait
		}
		lease, err := w.lockr.AcquireTurn(ctx, orderNo, meta, turn, wt)
		var te *lock.TurnError
		var busy *lock.BusyError
		switch {
		case err == nil:
			return lease, nil
		case errors.As(err, &busy):
			r.Lock.Waited += busy.Waited
			return nil, &waitError{err: err, delay: w.busyDelay()}
		case !errors.As(err, &te):
			return nil, err
		}
		r.Lock.Waited += te.Waited
		if te.Retry > 0 {
			// The head failed and runs again later: so do we, just after,
			// unless its success calls us back first.
			return nil, &waitError{err: err, delay: w.park(te.Retry)}
		}
		if te.Age < w.cfg.GapWait || te.Head == checked {
			return nil, &waitError{err: err, delay: w.park(w.cfg.GapWait)}
		}
		res, err := w.resolveHead(ctx, orderNo, te)
		switch {
		case err != nil:
			return nil, err
		case res.skipped:
			r.Skipped++
			continue
		case res.delay > 0:
			return nil, &waitError{err: te, delay: w.park(res.delay)}
		}
		checked = te.Head
	}
}

// wake brings back the parked tasks whose positions of order orderNo's
// sequence a release, a skip or a settlement called (see lock.Lease.Wake):
// to the front of their queues. A failure only costs them their park
// delay, and is logged.
func (w *Worker) wake(ctx context.Context, orderNo string, labels []string) {
	if len(labels) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := requeue.Labels(ctx, w.rdb, orderNo, w.cfg.Shards, w.kinds, labels); err != nil {
		w.log.Warn("could not bring parked tasks back; they come back after their park delay",
			zap.Strings("labels", labels), zap.Error(err))
	}
}

// park returns the delay of a task that waits for a head that runs again
// only after d: just after it, but no later than GapWait, so that a head
// whose task is deleted meanwhile is found and skipped within about GapWait.
func (w *Worker) park(d time.Duration) time.Duration {
	return min(d, w.cfg.GapWait) + w.busyDelay()
}

// apply runs the kind's handler inside the lease, and releases it: passing
// the turn on when the task's work is done (applied, or archived), keeping
// it when the task will run again.
func (w *Worker) apply(ctx context.Context, k *Kind, p tasks.Payload, lease *lock.Lease, r *run, budget int) (err error) {
	h := p.Header()
	wctx := lease.Keep(ctx)
	defer func() {
		if v := recover(); v != nil {
			// A handler bug: a failure like any other, and the order's
			// lock is released now rather than at the end of its lease.
			w.log.Error("task handler panicked", zap.String("task_id", r.TaskID), zap.Any("panic", v), zap.Stack("stack"))
			err = fmt.Errorf("panic in the %s handler: %v", k.Kind.Type, v)
		}
		if cause := context.Cause(wctx); errors.Is(cause, lock.ErrLost) && err != nil && !errors.Is(err, lock.ErrLost) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		err = w.decide(ctx, err, r.Retried, budget)
		// When asynq's context for the run is done (its deadline, a
		// shutdown, a cancel from the dashboard), asynq decides what
		// becomes of the task without reading this error: the turn stays,
		// and the task, if it is archived, is skipped by the gap check.
		final := ctx.Err() == nil && (err == nil || errors.Is(err, asynq.SkipRetry))
		if final {
			lease.Finish()
		} else {
			var f *failure
			if errors.As(err, &f) {
				lease.RetryAt(time.Now().Add(f.delay))
			}
		}
		w.release(ctx, lease, err == nil)
		w.wake(ctx, h.OrderNo, lease.Wake())
		if final && err != nil {
			w.noteArchived(ctx, h.OrderNo, h.Seq, tasks.PositionLabel(k.Kind.Type, h.EventID), err)
		}
		if final {
			if c, ok := p.(tasks.Creator); ok {
				w.settleCreation(ctx, c.Creates(), h, err)
			}
		}
	}()
	wctx = orders.WithWrite(wctx, orders.Write{
		Fence:     lease.Fence(),
		Worker:    w.cfg.ID,
		StartedAt: time.Now(),
		Seq:       h.Seq,
		// Only a position applied in its turn moves the order on: a seq
		// that the order's sequence never handed out (a task enqueued by
		// hand, its sequence gone) is checked but not recorded.
		SeqOutOfTurn: lease.Mode() != lock.ModeTurn,
		NoResult:     true, // the worker reads only the error
	})
	// A Redis store on the lock's Redis also checks the lock's newest fence
	// and releases the lock, passing the turn on, with a modify's commit.
	wctx = lock.WithHold(wctx, lease)
	err = k.Apply(wctx, w.store, p)
	if errors.Is(err, orders.ErrNotFound) && h.Seq > 0 {
		err = w.whyNotFound(ctx, h.OrderNo, err)
	}
	return storeError(err)
}

// whyNotFound adds to a missing order's error the reason an exchange that
// was to create it did not, when the order's sequence logged one.
func (w *Worker) whyNotFound(ctx context.Context, orderNo string, err error) error {
	st, serr := w.seq.Status(ctx, orderNo)
	if serr != nil {
		return err
	}
	for i := len(st.Log) - 1; i >= 0; i-- {
		if e := st.Log[i]; e.Kind == "finish" && strings.HasPrefix(e.Reason, notCreated) {
			return fmt.Errorf("%w; it was to be created, but %s", err, strings.TrimPrefix(e.Reason, "not created: "))
		}
	}
	return err
}

// decide turns a handler error into what asynq gets: a failure within the
// budget carries its retry delay; one past it is archived with the reason.
// An error of a run whose context asynq ended passes as it is.
func (w *Worker) decide(ctx context.Context, err error, retried, budget int) error {
	if err == nil || errors.Is(err, asynq.SkipRetry) || !IsFailure(err) || ctx.Err() != nil {
		return err
	}
	if retried >= budget {
		return fmt.Errorf("failed %d times, out of its failure budget of %d retries: %w: %w", retried+1, budget, err, asynq.SkipRetry)
	}
	return &failure{err: err, delay: asynq.DefaultRetryDelayFunc(retried, err, nil)}
}

// release releases a lease, logging what goes wrong: the task's outcome
// stands either way.
func (w *Worker) release(ctx context.Context, lease *lock.Lease, ok bool) {
	switch err := lease.Release(ctx); {
	case err == nil:
	case errors.Is(err, lock.ErrNotHeld) && ok:
		w.log.Warn("lease ended before the work did", zap.String("key", lease.Key()), zap.Int64("fence", lease.Fence()))
	case !errors.Is(err, lock.ErrNotHeld):
		w.log.Warn("release failed; the lock expires with its lease",
			zap.String("key", lease.Key()), zap.Int64("fence", lease.Fence()), zap.Error(err))
	}
}

// settleTimeout bounds the sequence writes a task makes after its work.
const settleTimeout = 5 * time.Second

// settleCreation finishes the position that an exchange reserved in its
// replacement's sequence, so the changes of the replacement accepted after
// the exchange can go: the replacement exists now, or it never will (then
// the reason is logged in the replacement's sequence, where a modify of it
// finds it).
func (w *Worker) settleCreation(ctx context.Context, created string, h tasks.Header, err error) {
	outcome := "created by exchange " + h.EventID + " of " + h.OrderNo
	if err != nil {
		outcome = notCreated + h.EventID + " of " + h.OrderNo + " was rejected: " + clip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	st, serr := w.seq.Finish(ctx, created, 0, "", "c:"+h.EventID, outcome)
	if serr != nil {
		w.log.Warn("could not mark the replacement's creation; its next changes wait for the gap check",
			zap.String("order_no", created), zap.String("event_id", h.EventID), zap.Error(serr))
	}
	w.wake(ctx, created, st.Wake)
}

// noteArchived records in the order's sequence log that the task of
// position pos (0 for none) and label (its type and event ID) was archived,
// and why: a release passed its turn on like any finished work, and the
// order's status view finds archived tasks through this note, and keeps
// showing the event ID and the reason after asynq has dropped the task (it
// keeps at most 10,000 archived tasks per queue, for 90 days). The note
// lives with the sequence, for at least its retention (7 days by default);
// an order without a live sequence (one never changed through the
// producer, or idle) gets none. It costs a round trip on this rare path
// only; a failure loses the note (the task stays archived in asynq) and is
// logged.
func (w *Worker) noteArchived(ctx context.Context, orderNo string, pos int64, label string, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if nerr := w.seq.Note(ctx, orderNo, pos, label, clip("archived: "+err.Error())); nerr != nil {
		w.log.Warn("could not note the archived task in its order's sequence",
			zap.String("order_no", orderNo), zap.Int64("seq", pos), zap.Error(nerr))
	}
}

// notCreated starts the outcome of a creation that failed.
const notCreated = "not created: exchange "

// settleAhead uses up the position of a task that is archived without
// running in its turn (its work is done: it never will run).
func (w *Worker) settleAhead(ctx context.Context, h tasks.Header, turn lock.Turn, p tasks.Payload, outcome string) {
	if turn.Pos == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	st, err := w.seq.Finish(ctx, h.OrderNo, turn.Pos, turn.Label, "", clip(outcome))
	if err != nil {
		w.log.Warn("could not use up the position of an archived task; it is skipped after the gap check",
			zap.String("order_no", h.OrderNo), zap.Int64("seq", turn.Pos), zap.Error(err))
	}
	w.wake(ctx, h.OrderNo, st.Wake)
	if c, ok := p.(tasks.Creator); ok {
		w.settleCreation(ctx, c.Creates(), h, errors.New(outcome))
	}
}

// clip cuts a string from a task (type, ID, queue) to a length fit for a
// log line, an error or a lock's meta.
func clip(s string) string {
	const limit = lock.MaxMetaLen
	if len(s) > limit {
		return s[:limit]
	}
	return s
}
