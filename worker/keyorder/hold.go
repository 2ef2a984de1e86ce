package keyorder

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// The drain of a hot key.
//
// Only the head of a key waits in its queue: a task accepted behind
// unfinished tasks of its key is parked (in asynq's retry set, its
// position marked parked), and the task before it hands it the turn. When
// a run in its turn succeeds and the key's next task is parked, the turn
// passes on while the lock is kept (lease.Drain): turns.Drain then
// takes that task out of asynq itself, runs it in the same hold, with the
// same fence, as its own run, records its end in asynq as asynq's
// processor would (completed with its retention, retried with its
// backoff, or archived), and goes on for a quantum (holdConfig.Max and
// For; [RunnerConfig].DrainMax says how long it lasts and when the hold
// yields): hot keys then take turns with other keys' tasks and spread
// over the servers.
//
// A failure ends the hold (the commit of a failed run does not keep the
// lock), and the failed task backs off in asynq's retry set as a failing
// head does. A server killed mid-hold loses nothing: the tasks it had
// taken are active in asynq with a lease, and asynq's recoverer brings
// them back once the lease ends; one it had run runs again (asynq delivers
// at least once), in its turn or as a passed position.

// The defaults of a hold's quantum.
const (
	// DefaultDrainMax is the default of holdConfig.Max.
	DefaultDrainMax = 100
	// DefaultDrainFor is the default of holdConfig.For.
	DefaultDrainFor = time.Second
)

// leaseEvery is how often a hold extends the asynq leases of the tasks it
// has taken (asynq's heartbeat renews its own every 5 s; a lease lasts
// asynqwire.LeaseDuration).
const leaseEvery = asynqwire.LeaseDuration / 3

// holdConfig is how turns.Drain goes on with a hot key's tasks. Run and
// Locate are required; the rest defaults. Its functions are called from
// many holds at once.
type holdConfig struct {
	// Max and For are the hold's quantum, as [RunnerConfig].DrainMax and
	// DrainFor describe it. A Max of 1 turns the drain off (see
	// holdConfig.Drains). Default to DefaultDrainMax and DefaultDrainFor.
	Max int
	For time.Duration
	// Locate returns where the task of a position of key waits, given its
	// label (see RunnerConfig.Locate).
	Locate Locate
	// Run runs task t, which the hold took out of its queue, as its own
	// run in held.Turn: it moves the hold's lease on to that position
	// (lease.Next; an error there, or a task that holds another position,
	// is a wait: the task goes back to its queue, turns.Later), runs
	// the handler, and ends the run (turns.EndTask), with lease.Drain
	// set so that the hold goes on. Its error is read with the engine's
	// [IsFailure] and turns.RetryDelay, as the server's are
	// (Runner.ServerConfig). ctx ends with the task's timeout or deadline, and when
	// the hold's lease is lost; in it, asynq.GetTaskID, GetQueueName,
	// GetRetryCount and GetMaxRetry report t's, as in a run asynq started.
	// It returns the run's error, as an asynq handler would.
	Run func(ctx context.Context, t *asynq.Task, held held) error
	// Busy reports whether more than half of the server's slots are in
	// use: a busy server's holds yield at the end of their quantum even
	// when no task waits, so that hot keys spread over the servers.
	// Defaults to never busy.
	Busy func() bool
	// Queues returns the queues the server serves: a hold whose quantum
	// is spent yields when a task waits in one of them. Defaults to none
	// (the hold then yields only when Busy).
	Queues func() []string
	// Stopping reports that the server shuts down: the hold ends before
	// its next task. Defaults to never.
	Stopping func() bool
	// Failed, when set, is called with the error of each run of the hold
	// that failed (held tells its retries so far), before its end is
	// recorded in asynq, as asynq calls its Config.ErrorHandler; not for
	// a run that goes back to its queue because the hold's first run was
	// cancelled (a shutdown).
	Failed func(ctx context.Context, t *asynq.Task, held held, err error)
}

// held is what holdConfig.Run learns of a task that a hold took out of
// its queue.
type held struct {
	// lease is the hold's lease, kept for Turn by the run before.
	lease *lease
	// Turn is the position the hold passed the turn on to.
	Turn Turn
	// Queue and ID name the task; Retried and MaxRetry are asynq's.
	Queue, ID         string
	Retried, MaxRetry int
	// Runs counts the runs of the hold before this one.
	Runs int
}

// Drains reports whether a run should ask its commit to keep the lock
// for the key's next task (lease.Drain): when the drain is on
// (Max above 1) and the server is not stopping.
func (c *holdConfig) Drains() bool {
	return c.max() > 1 && (c.Stopping == nil || !c.Stopping())
}

func (c *holdConfig) max() int               { return cmp.Or(c.Max, DefaultDrainMax) }
func (c *holdConfig) quantum() time.Duration { return cmp.Or(c.For, DefaultDrainFor) }
func (c *holdConfig) stopping() bool         { return c.Stopping != nil && c.Stopping() }
func (c *holdConfig) busy() bool             { return c.Busy != nil && c.Busy() }

// hold is a drained hold: the lease kept for the key's next tasks.
type hold struct {
	t       *turns
	cfg     *holdConfig
	lease   *lease
	key     string
	folds   bool
	started time.Time
	count   int       // runs in the hold, the first included
	qstart  time.Time // when the hold's quantum began
	qbase   int       // count when it began
	next    Turn      // the position the running task was taken for

	// fold reads the result of the step that the running task's commit
	// sent (see foldNext), nil when it sent none.
	fold func() (*asynqwire.Claimed, bool, error)

	mu     sync.Mutex
	leased []*asynqwire.Claimed // tasks taken and not yet ended in asynq
}

// Drain goes on with key's next tasks under lease, whose commit kept the
// lock for the next position (see turns.Pass and lease.Kept), as the
// comment at the top of hold.go tells, and ends the hold: the lease is
// released when Drain returns. ctx is the context of the hold's first
// run, which asynq ends at the task's deadline or a shutdown, and started
// is when that run began: the hold yields once half the time from started
// to ctx's deadline is spent, since asynq fails the first task at its
// deadline whatever the hold ran since. It returns how many runs the hold
// made, the first included, and whether it yielded with a task still
// waiting (its quantum spent while others waited, the server busy, or its
// time half spent). What goes wrong on the way is logged, and ends the
// hold: the next task then runs from its queue.
func (t *turns) Drain(ctx context.Context, lease *lease, started time.Time, cfg *holdConfig) (runs int, yielded bool) {
	_, folds := t.l.rdb.(*redis.Client)
	h := &hold{t: t, cfg: cfg, lease: lease, key: lease.Key(), folds: folds, started: started, count: 1, qstart: started}
	hctx := cmp.Or(lease.HoldContext(), ctx)
	stopLeases := h.keepLeases(hctx)
	var prev *asynqwire.Outcome
	var ready *asynqwire.Claimed // the next task, taken by the last commit's step
	for {
		next, kept := lease.Kept()
		if ready != nil && (!kept || ready.ID != h.taskID(next) || cfg.stopping() || hctx.Err() != nil) {
			h.putBack(ctx, ready)
			ready = nil
		}
		if !kept {
			break // released by the last run's commit
		}
		c := ready
		ready = nil
		if c == nil {
			spent := h.spent(0)
			if cfg.stopping() || hctx.Err() != nil || !h.renews(ctx) || spent && (cfg.busy() || h.othersWaiting(hctx)) {
				h.yield(ctx, next)
				yielded = true
				break
			}
			if spent {
				h.qstart, h.qbase = time.Now(), h.count // nothing else waits: another quantum
			}
			var err error
			c, err = h.claim(hctx, prev, next)
			prev = nil
			if err != nil {
				if nc := (*asynqwire.NotClaimedError)(nil); !errors.As(err, &nc) {
					tracing.Slog(ctx, t.log).Warn("could not take the key's next task in the hold; releasing it",
						slog.String(t.cfg.KeyField, h.key), slog.String("label", next.Label), errAttr(err))
				}
				t.Release(ctx, lease)
				break
			}
		}
		h.next = next
		h.foldNext(c, next)
		prev = h.run(ctx, hctx, c)
		lease.SetCommitStep(nil)
		h.count++
		if h.fold != nil {
			var err error
			ready, prev, err = h.folded(ctx, prev)
			if err != nil {
				t.Release(ctx, lease)
				break
			}
		}
		if k, still := lease.Kept(); still && k == next {
			// The run ended before it took its turn (a malformed or
			// misplaced task, or one that holds another position): the
			// lease is still kept for it.
			t.Release(ctx, lease)
			break
		}
	}
	stopLeases()
	if prev != nil {
		h.settle(ctx, prev)
	}
	return h.count, yielded
}

// spent reports whether the hold has used its quantum (Max runs or For of
// time) once ahead more runs have been made.
func (h *hold) spent(ahead int) bool {
	return h.count-h.qbase+ahead >= h.cfg.max() || time.Since(h.qstart) >= h.cfg.quantum()
}

// renews reports whether the hold may go on as far as its time allows:
// while more than half the time from its first run's start to that run's
// deadline (its task's asynq Timeout or Deadline, in ctx) is left. The
// hold runs inside the first run's asynq handler, so asynq fails that task
// at its deadline whatever the hold has run since, and the drained runs'
// contexts end there too; yielding at half of it (checked whenever the
// next task is taken apart, at least once a quantum) leaves the last runs
// of the hold at least as long.
func (h *hold) renews(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > dl.Sub(h.started)/2
}

// othersWaiting reports whether a task waits for a worker in the pending
// list of a queue the server serves, so that the hold, its quantum spent,
// yields to it. When none waits, the key is alone in the line, and its
// hold goes on for another quantum: releasing it would only cost the key
// a trip through the queue. A failed read counts as a task waiting.
func (h *hold) othersWaiting(ctx context.Context) bool {
	if h.cfg.Queues == nil {
		return false
	}
	waiting, err := asynqwire.AnyPending(ctx, h.t.l.rdb, h.cfg.Queues())
	if err != nil {
		tracing.Slog(ctx, h.t.log).Warn("could not read whether other tasks wait; the hold yields",
			slog.String(h.t.cfg.KeyField, h.key), errAttr(err))
		return true
	}
	return waiting
}

// yield ends a hold whose quantum is spent: it releases the lease, kept
// for next, and sends next's task to the back of its queue.
func (h *hold) yield(ctx context.Context, next Turn) {
	if _, _, ok := h.cfg.Locate(h.key, next.Label); !ok {
		h.t.Release(ctx, h.lease) // no task of a queue to send back: call its holder back
		return
	}
	h.t.ReleaseKept(ctx, h.lease)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.t.cfg.SettleTimeout)
	defer cancel()
	if err := moveLabels(sctx, h.t.l.rdb, h.cfg.Locate, h.key, []string{next.Label}, asynqwire.BackInTransit); err != nil {
		tracing.Slog(ctx, h.t.log).Warn("could not send the key's next task back to its queue; it comes back after its park delay",
			slog.String(h.t.cfg.KeyField, h.key), slog.String("label", next.Label), errAttr(err))
	}
}

// taskID returns the task ID of a position's label ("" for none).
func (h *hold) taskID(t Turn) string {
	_, id, _ := h.cfg.Locate(h.key, t.Label)
	return id
}

// claim takes the task of position next out of its queue (the first of
// its Locate queues that holds it), ending prev's run in asynq in the same
// round trip where they share a queue.
func (h *hold) claim(ctx context.Context, prev *asynqwire.Outcome, next Turn) (*asynqwire.Claimed, error) {
	queues, id, ok := h.cfg.Locate(h.key, next.Label)
	if !ok || len(queues) == 0 {
		if prev != nil {
			h.settle(ctx, prev)
		}
		return nil, &asynqwire.NotClaimedError{ID: next.Label, State: "not a task's label"}
	}
	var err error
	for _, q := range queues {
		var c *asynqwire.Claimed
		c, _, err = asynqwire.StepWith(ctx, h.t.l.rdb, prev, q, id, h.peekBehind(next.Pos))
		prev = nil
		var nc *asynqwire.NotClaimedError
		if errors.As(err, &nc) && nc.State == "" {
			continue // not in this queue
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

// settle records the end of a run in asynq on its own.
func (h *hold) settle(ctx context.Context, o *asynqwire.Outcome) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.t.cfg.SettleTimeout)
	defer cancel()
	if _, _, err := asynqwire.Step(sctx, h.t.l.rdb, o, "", ""); err != nil {
		tracing.Slog(ctx, h.t.log).Warn("could not record a drained task's end in asynq; it runs again once Redis answers (or its lease ends), and replays",
			slog.String("task_id", o.Task.ID), errAttr(err))
		h.t.l.stuck(o.Task.Queue, o.Task.ID, err)
	}
}

// The fold. On a single Redis, the lock's keys, the sequence and asynq's
// queues are on one node, so the commit of a drained task can end its
// task in asynq and take the next task out of its queue in its own round
// trip: the hold sends the step ([asynqwire.PipeStep]) in a pipeline right
// after the commit (a store's commit script, or the release script of
// turns.Pass: commitStep), guarded so that it writes nothing unless
// that commit kept the lock for the next position (the lock still the
// lease's, the sequence done up to the task's position). A drained task
// then costs one round trip, the commit, instead of two. The step learns
// which task is next from what the step before it read of the sequence
// (Claimed.Peek: the record and the parked mark of the position after the
// one it took); when that is not known, or the next task is of another
// queue, or the hold's quantum ends with this task, the commit sends no
// step and the task after it is taken as before.

// peekBehind returns the step options that read, with the claim of
// position pos, the record and the parked mark of the position after it:
// none on a Cluster, where the sequence and the queue are in two slots.
func (h *hold) peekBehind(pos int64) asynqwire.StepOptions {
	if !h.folds || h.lease.seqKey() == "" {
		return asynqwire.StepOptions{}
	}
	n := strconv.FormatInt(pos+1, 10)
	return asynqwire.StepOptions{PeekKey: h.lease.seqKey(), PeekFields: []string{"p:" + n, "k:" + n}}
}

// foldNext sets the commit step of the run of c, claimed for position
// next, when the position after it is parked and its task can be taken in
// the commit's round trip (see the comment above); otherwise it leaves
// none.
func (h *hold) foldNext(c *asynqwire.Claimed, next Turn) {
	h.fold = nil
	if !h.folds || len(c.Peek) != 2 || c.Peek[0] == nil || c.Peek[1] == nil || h.spent(1) || h.cfg.stopping() {
		return
	}
	_, label, ok := strings.Cut(*c.Peek[0], " ") // "<taken at> <label>"
	if !ok {
		return
	}
	qs, id, ok := h.cfg.Locate(h.key, label)
	if !ok || len(qs) != 1 || qs[0] != c.Queue {
		return
	}
	pos := next.Pos
	h.lease.SetCommitStep(func(ctx context.Context, pipe redis.Pipeliner, hd *Handoff) {
		if hd.Pos != pos || hd.SeqKey == "" {
			return
		}
		d := strconv.FormatInt(pos, 10)
		opt := h.peekBehind(pos + 1)
		opt.Guards = []asynqwire.Guard{{Key: hd.Key, Field: "owner", Value: hd.Owner}, {Key: hd.SeqKey, Field: "d", Value: d}}
		result, err := asynqwire.PipeStep(ctx, pipe, &asynqwire.Outcome{Task: c}, c.Queue, id, opt)
		if err == nil {
			h.fold = result
		}
	})
}

// folded reads the result of the step that the last run's commit sent: it
// returns the next task when the step took it, and the outcome still to
// record in asynq for the last run (prev, or nil when the step recorded
// its end). A step that took nothing because the next task was in no
// state to take (an operator deleted it, say) has ended prev's task: the
// error then asks the caller to release the lease, as a failed claim does.
func (h *hold) folded(ctx context.Context, prev *asynqwire.Outcome) (*asynqwire.Claimed, *asynqwire.Outcome, error) {
	result := h.fold
	h.fold = nil
	c, _, err := result()
	switch {
	case errors.Is(err, asynqwire.ErrUnguarded):
		return nil, prev, nil // the commit did not keep the lock: nothing was written
	case errors.Is(err, asynqwire.ErrNotClaimed):
		return nil, nil, err
	case err != nil:
		// Refused: nothing was written; the next task is taken as
		// before. A NOSCRIPT (Redis restarted or flushed its scripts) is
		// expected once; anything else (a user without the queue's keys,
		// say) would cost a round trip per task.
		log := tracing.Slog(ctx, h.t.log).Warn
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			log = tracing.Slog(ctx, h.t.log).Debug
		}
		log("the commit's step failed; the next task is taken apart", slog.String(h.t.cfg.KeyField, h.key), errAttr(err))
		return nil, prev, nil
	}
	if prev != nil && prev.Err != nil {
		tracing.Slog(ctx, h.t.log).Warn("a drained task failed after its commit, which recorded it completed",
			slog.String("task_id", prev.Task.ID), errAttr(prev.Err))
	}
	h.mu.Lock()
	h.leased = append(h.leased, c)
	h.mu.Unlock()
	return c, nil, nil
}

// putBack returns task c, taken by a commit's step, to the front of its
// queue, unrun (the hold ends before it: a shutdown, or the lease lost).
func (h *hold) putBack(ctx context.Context, c *asynqwire.Claimed) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.t.cfg.SettleTimeout)
	defer cancel()
	if _, _, err := asynqwire.Step(sctx, h.t.l.rdb, &asynqwire.Outcome{Task: c, Err: errHoldEnded, Requeue: true}, "", ""); err != nil {
		tracing.Slog(ctx, h.t.log).Warn("could not put a task taken for the hold back in its queue; it runs once Redis answers (or its lease ends)",
			slog.String("task_id", c.ID), errAttr(err))
		h.t.l.stuck(c.Queue, c.ID, err)
	}
}

// errHoldEnded is the end of a task taken for a hold that ended before it.
var errHoldEnded = errors.New("keyorder: the hold ended before the task ran")

// run runs claimed task c in the hold, whose context is hctx, as its own
// run (holdConfig.Run), and returns how it ended, for asynq, as asynq's
// processor decides it. ctx is the context of the hold's first run, which
// asynq ends at a shutdown.
func (h *hold) run(ctx, hctx context.Context, c *asynqwire.Claimed) *asynqwire.Outcome {
	rctx, cancel := runContext(hctx, c)
	defer cancel()
	// asynq's getters (asynq.GetTaskID, ...) report c, not the hold's
	// first task, whose run's context this derives from.
	rctx, _ = asynqwire.TaskContext(rctx, c)
	t := asynq.NewTask(c.Type, c.Payload)
	held := held{lease: h.lease, Turn: h.next, Queue: c.Queue, ID: c.ID, Retried: c.Retried, MaxRetry: c.MaxRetry, Runs: h.count}
	err := h.cfg.Run(rctx, t, held)
	if err != nil && ctx.Err() == nil && h.cfg.Failed != nil {
		h.cfg.Failed(rctx, t, held, err)
	}
	out := &asynqwire.Outcome{Task: c, Err: err}
	switch {
	case err == nil, errors.Is(err, asynq.RevokeTask):
		// asynq marks a revoked task done, as a task that succeeded.
		out.Err = nil
	case ctx.Err() != nil:
		// asynq ended the hold's first run (a shutdown): back to the
		// front of its queue, as asynq does with such a run. (The hold's
		// own context ends with every release, and a lost lease is no
		// failure: it is retried below, without counting.)
		out.Requeue = true
	case Archives(err, c.Retried, c.MaxRetry):
		out.Archive = true
	default:
		// The server's IsFailure and RetryDelayFunc are the engine's
		// (Runner.ServerConfig): a wait is no failure, and backs off as
		// long as its run chose.
		out.Failure = IsFailure(err)
		out.RetryAt = time.Now().Add(h.t.RetryDelay(c.Retried, err, t))
	}
	return out
}

// Archives reports whether asynq archives a task whose run returned err
// after retried failures of its maxRetry, as asynq v0.25.1's processor
// decides (handleFailedMessage): on asynq.SkipRetry, or once its retries
// are spent; never a task that succeeded, a revoked one (asynq drops it),
// nor one whose lease expired (asynq's recoverer retries it).
func Archives(err error, retried, maxRetry int) bool {
	if err == nil || errors.Is(err, asynq.RevokeTask) || errors.Is(err, asynq.ErrLeaseExpired) {
		return false
	}
	return errors.Is(err, asynq.SkipRetry) || retried >= maxRetry
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

// keepLeases extends the asynq leases of the tasks the hold has taken,
// every leaseEvery, until the returned function is called (which waits
// for it).
func (h *hold) keepLeases(ctx context.Context) (stop func()) {
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
				if err := asynqwire.ExtendLease(ctx, h.t.l.rdb, c.Queue, c.ID, time.Now().Add(asynqwire.LeaseDuration)); err != nil && ctx.Err() == nil {
					tracing.Slog(ctx, h.t.log).Warn("could not extend a drained task's asynq lease", slog.String("task_id", c.ID), errAttr(err))
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
