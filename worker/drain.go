package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/asynqwire"
	"github.com/orderworker/orderworker/internal/requeue"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// The drain of a hold.
//
// Only the head of an order waits in the queue: a change accepted behind
// unfinished changes of its order is parked (the producer puts its task in
// asynq's retry set, its position marked parked), and the change before it
// hands it the turn. When a run in its turn commits, and the order's next
// change is parked, the commit keeps the order's lock (keyorder.Lease.Drain):
// the Worker then takes that change's task out of asynq itself
// (asynqwire.Step, or in the commit's own round trip: see "The fold"
// below), runs it in the same hold, with the same fence, as its
// own run (its log line, metrics, span and OnDone), records its end in
// asynq as asynq's processor would (completed with its retention, retried
// with its backoff, or archived), and goes on, up to Config.DrainMax changes
// or Config.DrainFor of time (a quantum). Then, if another task waits in a
// queue it serves or more than half its slots are in use, it releases the
// lock and sends the next change to the back of its queue: other orders'
// changes go first, and hot orders spread over the workers. Otherwise the
// hold goes on for another quantum.
//
// A failure ends the hold (the commit of a failed run does not keep the
// lock), and the failed change backs off in asynq's retry set as a failing
// head does. A Worker killed mid-hold loses nothing: the changes it had
// taken are active in asynq with a lease, and the recoverer brings them
// back once the lease ends (Config.RecoverAfter past it); one it had
// applied replays (the store knows its event) and completes.

// The defaults of the drain's quantum.
const (
	// DefaultDrainMax is the default of Config.DrainMax.
	DefaultDrainMax = 100
	// DefaultDrainFor is the default of Config.DrainFor.
	DefaultDrainFor = time.Second
)

// leaseEvery is how often a drained hold extends the asynq leases of the
// tasks it has taken (asynq's heartbeat renews its own every 5 s; a lease
// lasts asynqwire.LeaseDuration).
const leaseEvery = asynqwire.LeaseDuration / 3

// hold is a drained hold: the lease kept for the order's next changes.
type hold struct {
	lease   *keyorder.Lease
	orderNo string
	started time.Time
	count   int           // changes run in the hold, the first included
	qstart  time.Time     // when the hold's quantum began
	qbase   int           // count when it began
	next    keyorder.Turn // the position the running change was taken for

	// fold reads the result of the step that the running change's commit
	// sent (see foldNext), nil when it sent none.
	fold func() (*asynqwire.Claimed, bool, error)

	mu     sync.Mutex
	leased []*asynqwire.Claimed // tasks taken and not yet ended in asynq
}

// drains reports whether the commit of run r should keep its lease for the
// order's next change (keyorder.Lease.Drain).
func (w *Worker) drains(*run) bool {
	return w.cfg.DrainMax > 1 && !w.stopping.Load()
}

// drain goes on with the order's next changes under the lease that the
// commit of run first kept (see the comment above), and ends the hold.
func (w *Worker) drain(ctx context.Context, first *run) {
	lease := first.kept
	h := &hold{lease: lease, orderNo: first.OrderNo, started: first.Started, count: 1, qstart: first.Started}
	hctx := cmp.Or(lease.HoldContext(), ctx)
	stopLeases := w.keepLeases(hctx, h)
	var prev *asynqwire.Outcome
	var ready *asynqwire.Claimed // the next change, taken by the last commit's step
	yielded := false
	for {
		next, kept := lease.Kept()
		if ready != nil && (!kept || ready.ID != labelID(w.kinds, next) || w.stopping.Load() || hctx.Err() != nil) {
			w.putBack(ctx, ready)
			ready = nil
		}
		if !kept {
			break // released by the last run's commit
		}
		c := ready
		ready = nil
		if c == nil {
			spent := w.spent(h, 0)
			if w.stopping.Load() || hctx.Err() != nil || !renews(ctx, h) || spent && (w.busy() || w.othersWaiting(hctx, h)) {
				w.yield(ctx, h, next)
				yielded = true
				break
			}
			if spent {
				h.qstart, h.qbase = time.Now(), h.count // nothing else waits: another quantum
			}
			var err error
			c, err = w.claim(hctx, h, prev, next)
			prev = nil
			if err != nil {
				if nc := (*asynqwire.NotClaimedError)(nil); !errors.As(err, &nc) {
					tracing.Log(ctx, w.log).Warn("could not take the order's next change in the hold; releasing it",
						zap.String("order_no", h.orderNo), zap.String("label", next.Label), zap.Error(err))
				}
				w.turns.Release(ctx, lease)
				break
			}
		}
		h.next = next
		w.foldNext(h, c, next)
		prev = w.runHeld(ctx, hctx, h, c)
		lease.SetCommitStep(nil)
		h.count++
		if h.fold != nil {
			var err error
			ready, prev, err = w.folded(ctx, h, prev)
			if err != nil {
				w.turns.Release(ctx, lease)
				break
			}
		}
		if k, still := lease.Kept(); still && k == next {
			// The run ended before it took its turn (a malformed or
			// misplaced task, or one that holds another position): the
			// lease is still kept for it.
			w.turns.Release(ctx, lease)
			break
		}
	}
	stopLeases()
	if prev != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyorder.DefaultSettleTimeout)
		if _, _, err := asynqwire.Step(sctx, w.rdb, prev, "", ""); err != nil {
			tracing.Log(ctx, w.log).Warn("could not record a drained change's end in asynq; it runs again once its lease ends, and replays",
				zap.String("task_id", prev.Task.ID), zap.Error(err))
		}
		cancel()
	}
	w.cfg.Metrics.observeHold(h.count, yielded)
}

// spent reports whether hold h has used its quantum (Config.DrainMax
// changes or Config.DrainFor of time) once ahead more changes have run.
func (w *Worker) spent(h *hold, ahead int) bool {
	return h.count-h.qbase+ahead >= w.cfg.DrainMax || time.Since(h.qstart) >= w.cfg.DrainFor
}

// renews reports whether hold h may go on as far as its time allows:
// while more than half the time from its first run's start to that run's
// deadline (its task's asynq Timeout or Deadline, in ctx) is left. The
// hold runs inside the first run's asynq handler, so asynq fails that task
// at its deadline whatever the hold has applied since, and the drained
// changes' contexts end there too; yielding at half of it (checked
// whenever the next change is taken apart, at least once a quantum)
// leaves the last changes of the hold at least as long.
func renews(ctx context.Context, h *hold) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > dl.Sub(h.started)/2
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

// othersWaiting reports whether a task waits for a worker in the pending
// list of a queue the Worker serves, so that hold h, its quantum spent,
// yields to it. When none waits, the order is alone in the line, and its
// hold goes on for another quantum: releasing it would only cost the order
// a trip through the queue (up to TaskCheckInterval·1.5 while asynq's
// processor idles). A failed read counts as a task waiting.
func (w *Worker) othersWaiting(ctx context.Context, h *hold) bool {
	waiting, err := asynqwire.AnyPending(ctx, w.rdb, w.served)
	if err != nil {
		tracing.Log(ctx, w.log).Warn("could not read whether other changes wait; the hold yields",
			zap.String("order_no", h.orderNo), zap.Error(err))
		return true
	}
	return waiting
}

// yield ends a hold whose quantum is spent: it releases the lease, kept for
// next, and sends next's task to the back of its queue.
func (w *Worker) yield(ctx context.Context, h *hold, next keyorder.Turn) {
	w.turns.ReleaseKept(ctx, h.lease)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyorder.DefaultSettleTimeout)
	defer cancel()
	if err := requeue.Back(sctx, w.rdb, h.orderNo, w.cfg.Shards, w.kinds, next.Label); err != nil {
		tracing.Log(ctx, w.log).Warn("could not send the order's next change back to its queue; it comes back after its park delay",
			zap.String("order_no", h.orderNo), zap.String("label", next.Label), zap.Error(err))
	}
}

// claim takes the task of position next out of its queue (its order's
// placements under Config.Shards), ending prev's run in asynq in the same
// round trip where they share a queue.
func (w *Worker) claim(ctx context.Context, h *hold, prev *asynqwire.Outcome, next keyorder.Turn) (*asynqwire.Claimed, error) {
	typ, id, from, ok := w.kinds.ParseLabel(next.Label)
	if !ok || from != "" {
		return nil, &asynqwire.NotClaimedError{ID: next.Label, State: "not a task's label"}
	}
	var err error
	for _, q := range w.cfg.Shards.Placements(w.kinds.Of(typ), h.orderNo) {
		var c *asynqwire.Claimed
		c, _, err = asynqwire.StepWith(ctx, w.rdb, prev, q, id, w.peekBehind(h.lease, next.Pos))
		prev = nil
		var nc *asynqwire.NotClaimedError
		if errors.As(err, &nc) && nc.State == "" {
			continue // not in this placement
		}
		if err == nil {
			h.mu.Lock()
			h.leased = append(h.leased, c)
			h.mu.Unlock()
		}
		return c, err
	}
	return nil, err
}

// The fold. On a single Redis, the lock's keys, the sequence and asynq's
// queues are on one node, so the commit of a drained change can end its
// task in asynq and take the next change's task out of its queue in its
// own round trip: the worker sends the step ([asynqwire.PipeStep]) in a
// pipeline right after the store's commit script ([keyorder.CommitStep]),
// guarded so that it writes nothing unless that commit kept the lock for
// the next position (the lock still the lease's, the sequence done up to
// the change's position). A drained change then costs one round trip, the
// commit, instead of two. The step learns which task is next from what the
// step before it read of the sequence (Claimed.Peek: the record and the
// parked mark of the position after the one it took); when that is not
// known, or the next change is of another queue, or the hold's quantum
// ends with this change, the commit sends no step and the change after it
// is taken as before.

// peekBehind returns the step options that read, with the claim of
// position pos, the record and the parked mark of the position after it:
// none on a Cluster, where the sequence and the queue are in two slots.
func (w *Worker) peekBehind(lease *keyorder.Lease, pos int64) asynqwire.StepOptions {
	if !w.folds || lease.SeqKey() == "" {
		return asynqwire.StepOptions{}
	}
	n := strconv.FormatInt(pos+1, 10)
	return asynqwire.StepOptions{PeekKey: lease.SeqKey(), PeekFields: []string{"p:" + n, "k:" + n}}
}

// foldNext sets the commit step of the run of c, claimed for position
// next, when the position after it is parked and its task can be taken in
// the commit's round trip (see the comment above); otherwise it leaves
// none.
func (w *Worker) foldNext(h *hold, c *asynqwire.Claimed, next keyorder.Turn) {
	h.fold = nil
	if !w.folds || len(c.Peek) != 2 || c.Peek[0] == nil || c.Peek[1] == nil ||
		w.spent(h, 1) || w.stopping.Load() {
		return
	}
	_, label, ok := strings.Cut(*c.Peek[0], " ") // "<taken at> <label>"
	if !ok {
		return
	}
	typ, id, from, ok := w.kinds.ParseLabel(label)
	if !ok || from != "" {
		return
	}
	k := w.kinds.Of(typ)
	if k == nil {
		return
	}
	if qs := w.cfg.Shards.Placements(k, h.orderNo); len(qs) != 1 || qs[0] != c.Queue {
		return
	}
	pos := next.Pos
	h.lease.SetCommitStep(func(ctx context.Context, pipe redis.Pipeliner, hd *keyorder.Handoff) {
		if hd.Pos != pos || hd.SeqKey == "" {
			return
		}
		d := strconv.FormatInt(pos, 10)
		opt := w.peekBehind(h.lease, pos+1)
		opt.Guards = []asynqwire.Guard{{Key: hd.Key, Field: "owner", Value: hd.Owner}, {Key: hd.SeqKey, Field: "d", Value: d}}
		result, err := asynqwire.PipeStep(ctx, pipe, &asynqwire.Outcome{Task: c}, c.Queue, id, opt)
		if err == nil {
			h.fold = result
		}
	})
}

// folded reads the result of the step that the last run's commit sent: it
// returns the next change's task when the step took it, and the outcome
// still to record in asynq for the last run (prev, or nil when the step
// recorded its end). A step that took nothing because the next task was in
// no state to take (an operator deleted it, say) has ended prev's task: the
// error then asks the caller to release the lease, as a failed claim does.
func (w *Worker) folded(ctx context.Context, h *hold, prev *asynqwire.Outcome) (*asynqwire.Claimed, *asynqwire.Outcome, error) {
	result := h.fold
	h.fold = nil
	c, _, err := result()
	switch {
	case errors.Is(err, asynqwire.ErrUnguarded):
		return nil, prev, nil // the commit did not keep the lock: nothing was written
	case errors.Is(err, asynqwire.ErrNotClaimed):
		return nil, nil, err
	case err != nil:
		// Refused: nothing was written; the next change is taken as
		// before. A NOSCRIPT (Redis restarted or flushed its scripts) is
		// expected once; anything else (a user without the queue's keys,
		// say) would cost a round trip per change.
		log := tracing.Log(ctx, w.log).Warn
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			log = tracing.Log(ctx, w.log).Debug
		}
		log("the commit's step failed; the next change is taken apart", zap.String("order_no", h.orderNo), zap.Error(err))
		return nil, prev, nil
	}
	if prev != nil && prev.Err != nil {
		tracing.Log(ctx, w.log).Warn("a drained change failed after its commit, which recorded it completed",
			zap.String("task_id", prev.Task.ID), zap.Error(prev.Err))
	}
	h.mu.Lock()
	h.leased = append(h.leased, c)
	h.mu.Unlock()
	return c, nil, nil
}

// putBack returns task c, taken by a commit's step, to the front of its
// queue, unrun (the hold ends before it: a shutdown, or the lease lost).
func (w *Worker) putBack(ctx context.Context, c *asynqwire.Claimed) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyorder.DefaultSettleTimeout)
	defer cancel()
	if _, _, err := asynqwire.Step(sctx, w.rdb, &asynqwire.Outcome{Task: c, Err: errHoldEnded, Requeue: true}, "", ""); err != nil {
		tracing.Log(ctx, w.log).Warn("could not put a change taken for the hold back in its queue; it runs once its lease ends",
			zap.String("task_id", c.ID), zap.Error(err))
	}
}

// errHoldEnded is the end of a task taken for a hold that ended before it.
var errHoldEnded = errors.New("the hold ended before the change ran")

// labelID returns the task ID of a position's label ("" for none).
func labelID(kinds tasks.Table, t keyorder.Turn) string {
	_, id, _, _ := kinds.ParseLabel(t.Label)
	return id
}

// runHeld runs claimed task c in hold h, whose context is hctx, as its own
// run, and returns how it ended, for asynq. ctx is the context of the
// hold's first run, which asynq ends at a shutdown.
func (w *Worker) runHeld(ctx, hctx context.Context, h *hold, c *asynqwire.Claimed) *asynqwire.Outcome {
	w.inflight.Add(1)
	defer w.inflight.Done()
	r := &run{hold: h, maxRetry: c.MaxRetry}
	r.Started, r.Type, r.TaskID, r.Queue, r.Retried, r.Drained = time.Now(), c.Type, c.ID, c.Queue, c.Retried, true
	rctx, cancel := runContext(hctx, c)
	t := asynq.NewTask(c.Type, c.Payload)
	err := w.observed(rctx, t, r, asynq.HandlerFunc(w.process))
	cancel()
	out := &asynqwire.Outcome{Task: c, Err: err}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// asynq ended the hold's first run (a shutdown): back to the front
		// of its queue, as asynq does with such a run. (The hold's own
		// context ends with every release, and a lost lease is no
		// failure: it is retried below, without counting.)
		out.Requeue = true
	case archives(err, c.Retried, c.MaxRetry):
		out.Archive = true
		w.cfg.Metrics.observeArchived(w.taskTypeLabel(c.Type), archiveReason(err))
	default:
		out.Failure = IsFailure(err)
		out.RetryAt = time.Now().Add(w.retryDelay(c.Retried, err, t))
	}
	return out
}

// runContext bounds a drained run as asynq bounds one: by the task's
// timeout and its deadline, whichever comes first.
func runContext(ctx context.Context, c *asynqwire.Claimed) (context.Context, context.CancelFunc) {
	var dl time.Time
	if c.Timeout > 0 {
		dl = time.Now().Add(c.Timeout)
	}
	if !c.Deadline.IsZero() && (dl.IsZero() || c.Deadline.Before(dl)) {
		dl = c.Deadline
	}
	if dl.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, dl)
}

// applyHeld applies payload p of a run of a drained hold, at position turn,
// under the hold's lease, which its last commit kept for that position.
func (w *Worker) applyHeld(ctx context.Context, k *Kind, p tasks.Payload, r *run, turn keyorder.Turn, budget int) error {
	h := r.hold
	if turn != h.next {
		// Not the position the hold passed on to (the task was refused as
		// a duplicate and holds another): back to its queue, where it
		// takes its own turn.
		return &waitError{err: fmt.Errorf("task holds position %d, not %d, which the hold passed on to: %w", turn.Pos, h.next.Pos, keyorder.ErrNotYourTurn), delay: w.busyDelay()}
	}
	prev := h.lease.Turn()
	if err := h.lease.Next(turn); err != nil {
		return &waitError{err: fmt.Errorf("%w: %w", keyorder.ErrNotYourTurn, err), delay: w.busyDelay()}
	}
	r.Locked, r.Fence, r.Mode = true, h.lease.Fence(), ModeTurn
	// Its "order lock" span: taken in the hold, kept for it by the change
	// before, with the hold's fence; no wait.
	if _, span := w.startSpan(ctx, tracing.SpanLock); span.IsRecording() {
		span.SetAttributes(tracing.AttrOrderNo.String(h.orderNo), tracing.AttrSeq.Int64(turn.Pos),
			tracing.AttrFence.Int64(r.Fence), tracing.AttrLockMode.String(string(ModeTurn)),
			attribute.Int64("orderworker.lock.waited_ms", 0), attribute.Int("orderworker.hold.changes", h.count))
		span.AddEvent(tracing.EventInHold, trace.WithAttributes(tracing.AttrHeadSeq.Int64(prev.Pos), tracing.AttrHead.String(prev.Label)))
		span.End()
	}
	return w.apply(ctx, k, p, h.lease, r, budget)
}

// keepLeases extends the asynq leases of the tasks hold h has taken, every
// leaseEvery, until the returned function is called (which waits for it).
func (w *Worker) keepLeases(ctx context.Context, h *hold) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(leaseEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			h.mu.Lock()
			leased := h.leased
			if len(leased) > 2 {
				leased = leased[len(leased)-2:] // the running one and the one before, whose end is not yet recorded
				h.leased = leased
			}
			leased = append([]*asynqwire.Claimed(nil), leased...)
			h.mu.Unlock()
			for _, c := range leased {
				if err := asynqwire.ExtendLease(ctx, w.rdb, c.Queue, c.ID, time.Now().Add(asynqwire.LeaseDuration)); err != nil && ctx.Err() == nil {
					tracing.Log(ctx, w.log).Warn("could not extend a drained change's asynq lease", zap.String("task_id", c.ID), zap.Error(err))
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
