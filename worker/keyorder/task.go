package keyorder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/tracing"
)

// The run of an asynq task in its key's turn: what turns.TakeTask and
// turns.EndTask decide for asynq. A [Runner] is built on them, and so is
// a program that wraps its handlers itself (the order domain's worker,
// which adds its spans, metrics and settlements around the same steps):
// what a wait, a failure within its budget and one past it become is
// decided here once.

// ErrOutOfBudget is matched by the error of a task that failed more times
// than its failure budget (its asynq MaxRetry less one, see taskRun):
// the error also matches asynq.SkipRetry, and asynq archives the task.
var ErrOutOfBudget = errors.New("keyorder: out of its failure budget")

// taskRun is one run of an asynq task in its key's turn, for
// turns.TakeTask and turns.EndTask.
type taskRun struct {
	// Key is the task's key, Turn its position (zero for a task without
	// one, which runs under the lock but without order), Meta what the
	// lock records of its holder (see locker.Acquire).
	Key  string
	Turn Turn
	Meta string
	// Label is what a task that ends for good without its work (archived
	// or revoked) is noted under in its key's sequence log (turns.Note):
	// Turn's label, or the caller's own for a task without a position;
	// with neither, nothing is noted.
	Label string
	// Task is the asynq task, for the failure's RetryDelay.
	Task *asynq.Task
	// Retried and MaxRetry are asynq's: the task's retry count before
	// this run, and its MaxRetry.
	Retried, MaxRetry int
	// Halt says the task's key halts when the task fails past its budget
	// in its turn ([FailureHalt]).
	Halt bool
}

// Budget is the run's failure budget: how many failures asynq retries
// before the task is archived, its MaxRetry less one. One try is kept for
// a wait, which asynq would otherwise archive once its retries are spent
// (a [Client] sets a task's asynq MaxRetry one above the budget asked for).
func (tr *taskRun) Budget() int { return max(tr.MaxRetry-1, 0) }

// laterError is a run that goes back to its queue for delay: a wait (no
// failure), or a failure within its budget. turns.RetryDelay reads the
// delay.
type laterError struct {
	err   error
	delay time.Duration
	text  string // the error's text, when not err's
}

func (e *laterError) Error() string {
	if e.text != "" {
		return e.text
	}
	return e.err.Error()
}
func (e *laterError) Unwrap() error { return e.err }

// budgetError is the error of a task past its failure budget: its text is
// the failure's with the count, and it matches ErrOutOfBudget and
// asynq.SkipRetry.
type budgetError struct {
	err              error
	failed, budget   int
	deadlineOutlived bool
}

func (e *budgetError) Error() string {
	if e.deadlineOutlived {
		return fmt.Sprintf("keyorder: failed %d times (a run that outlived its deadline included), out of its failure budget of %d retries: %v", e.failed, e.budget, asynq.SkipRetry)
	}
	return fmt.Sprintf("failed %d times, out of its failure budget of %d retries: %v: %v", e.failed, e.budget, e.err, asynq.SkipRetry)
}
func (e *budgetError) Is(target error) bool { return target == ErrOutOfBudget }
func (e *budgetError) Unwrap() []error {
	if e.err == nil {
		return []error{asynq.SkipRetry}
	}
	return []error{e.err, asynq.SkipRetry}
}

// OutOfBudget returns the error of a run that is archived in its turn
// without running: its task failed past its budget already, in runs that
// asynq counted without the handler seeing them end (runs that outlived
// their deadline). It matches ErrOutOfBudget and asynq.SkipRetry; nil when
// the task is within its budget or has no position.
func (tr *taskRun) OutOfBudget() error {
	if tr.Turn.Pos == 0 || tr.Retried <= tr.Budget() {
		return nil
	}
	return &budgetError{failed: tr.Retried, budget: tr.Budget(), deadlineOutlived: true}
}

// TakeTask takes tr.Key's lock in tr.Turn's position (see turns.Take),
// waiting by policy w, and says what asynq gets when it does not:
//
//   - a wait that ran out, or a park, is an error that spends no retry
//     ([IsFailure] is false) and that turns.RetryDelay turns into the
//     park's delay plus a random busy delay (turnsConfig.BusyRetryMin
//     and BusyRetryMax); it matches [ErrBusy] or [ErrNotYourTurn], and
//     [*ParkError] or [*BusyError];
//   - a position that is not the task's ([ErrBadPosition]) is noted in the
//     key's sequence log and archived (asynq.SkipRetry);
//   - an error that says the key's Redis is unreachable or between two
//     masters (a connection refused, reset or timed out; CLUSTERDOWN,
//     READONLY, LOADING, MASTERDOWN, TRYAGAIN, MOVED) is no failure
//     either: the task comes back after a busy delay, its retries kept,
//     so that a failover does not hold its key back for a failure's
//     backoff;
//   - other errors (Redis's refusals) are returned wrapped, and asynq
//     retries them as failures.
//
// A task on its last try (Retried at MaxRetry: asynq archives it on any
// error, a wait included) waits for its turn until a second before its
// context's deadline.
func (t *turns) TakeTask(ctx context.Context, tr *taskRun, w Wait) (*lease, taken, error) {
	if tr.Retried >= tr.MaxRetry {
		if dl, ok := ctx.Deadline(); ok {
			w.Deadline = max(time.Until(dl)-time.Second, w.Deadline)
		}
	}
	lease, taken, err := t.Take(ctx, tr.Key, tr.Meta, tr.Turn, w)
	var park *ParkError
	switch {
	case err == nil:
		return lease, taken, nil
	case errors.Is(err, ErrBusy):
		return nil, taken, t.Later(err)
	case errors.As(err, &park):
		// The park stays in the chain (errors.As finds it, for a span's
		// event); asynq records the wait's own text as the task's last
		// error, without the park's delay, which RetryDelay reads.
		return nil, taken, &laterError{err: park, delay: park.Delay + t.busyDelay(), text: park.Err.Error()}
	case errors.Is(err, ErrBadPosition):
		err = fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		t.Note(ctx, tr.Key, tr.Turn.Pos, tr.Turn.Label, "archived: "+err.Error())
	case ctx.Err() == nil && unavailable(err):
		// The key's Redis is down or switching (a failover): no failure
		// of the task's, which comes back within the busy delay rather
		// than after a failure's backoff (asynq's is 15 s and more), so
		// that its key goes on about a second after the promotion.
		return nil, taken, &laterError{err: &unavailableError{err: err}, delay: t.busyDelay()}
	}
	return nil, taken, err
}

// unavailableError is the error of a run whose key's Redis did not answer
// before the run took its turn: it is no failure ([IsFailure]).
type unavailableError struct{ err error }

func (e *unavailableError) Error() string {
	return "keyorder: the key's Redis is unavailable: " + e.err.Error()
}
func (e *unavailableError) Unwrap() error { return e.err }

// unavailable reports whether err says that Redis could not be reached or
// cannot serve for now (a connection refused, reset or timed out; a
// Cluster or a replica between two masters), rather than refusing the
// call (an ACL, a key of the wrong type, a script's error), which stays a
// failure.
func unavailable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	for _, prefix := range []string{"CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN", "MOVED", "ASK"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// Later returns err, which must match [ErrBusy] or [ErrNotYourTurn], as
// the error of a run that goes back to its queue after a random busy delay
// without spending a retry (a task that a hold passed the turn to and that
// cannot take it, say).
func (t *turns) Later(err error) error {
	return &laterError{err: err, delay: t.busyDelay()}
}

// EndTask ends tr's run under lease, given the handler's error (a panic
// made into one) and runCtx, the context the handler ran with
// (lease.Keep's): it decides what asynq gets, passes the turn on when
// the task's work is done, and returns that error and whether the work
// is done (final):
//
//   - a success, an archive (asynq.SkipRetry) and a revoke
//     (asynq.RevokeTask: asynq deletes the task) are final: the turn
//     passes on, and an archived or revoked task is noted under tr.Label;
//   - a failure within the budget goes back with the backoff of
//     turnsConfig.RetryDelay, chosen now so that the positions behind it
//     wait just as long (turns.Pass's retryAt); one past it is archived
//     with an error that matches [ErrOutOfBudget];
//   - an error that is no failure (a wait, a lost lease: [IsFailure]),
//     and any error of a run whose context asynq ended (its deadline, a
//     shutdown: asynq decides without reading it), keep the turn.
//
// A handler error of a run that lost its lease is wrapped to match
// [ErrLost].
func (t *turns) EndTask(ctx, runCtx context.Context, lease *lease, tr *taskRun, err error) (_ error, final bool) {
	if cause := context.Cause(runCtx); errors.Is(cause, ErrLost) && err != nil && !errors.Is(err, ErrLost) {
		err = fmt.Errorf("%w: %w", cause, err)
	}
	gone := errors.Is(err, asynq.SkipRetry) || errors.Is(err, asynq.RevokeTask)
	if err != nil && !gone && IsFailure(err) && ctx.Err() == nil {
		if budget := tr.Budget(); tr.Retried >= budget {
			err = &budgetError{err: err, failed: tr.Retried + 1, budget: budget}
			gone = true
		} else {
			err = &laterError{err: err, delay: t.cfg.RetryDelay(tr.Retried, err, tr.Task)}
		}
	}
	final = ctx.Err() == nil && (err == nil || gone)
	if final && tr.Halt && lease.Mode() == ModeTurn && errors.Is(err, ErrOutOfBudget) {
		// The halt rides in the release, before asynq archives the task:
		// a crash after it leaves the key halted, and one before it
		// leaves the task to asynq's recoverer, which retries it within
		// the try a Client keeps (see taskRun.Budget); an archived head
		// found by the gap check halts its key too (Runner.haltArchived).
		lease.haltTurn(clip(err.Error()))
		t.Pass(ctx, lease, false, time.Time{}, false)
		t.Note(ctx, tr.Key, tr.Turn.Pos, tr.Label, "halted: "+err.Error())
		sctx, cancel := t.settleCtx(ctx)
		defer cancel()
		if ierr := t.seq.indexHalt(sctx, tr.Key); ierr != nil {
			tracing.Slog(ctx, t.log).Warn("key halted, but not listed in the index of paused keys", slog.String(t.cfg.KeyField, tr.Key), errAttr(ierr))
		}
		tracing.Slog(ctx, t.log).Warn("key halted: its head failed past its budget", slog.String(t.cfg.KeyField, tr.Key),
			slog.Int64("seq", tr.Turn.Pos), slog.String("label", tr.Turn.Label), errAttr(err))
		return err, false
	}
	var retryAt time.Time
	var later *laterError
	if !final && errors.As(err, &later) {
		retryAt = time.Now().Add(later.delay)
	}
	t.Pass(ctx, lease, final, retryAt, err == nil)
	if final && err != nil && (tr.Turn.Pos > 0 || tr.Label != "") {
		outcome := "archived: "
		if errors.Is(err, asynq.RevokeTask) {
			outcome = "revoked: "
		}
		t.Note(ctx, tr.Key, tr.Turn.Pos, tr.Label, outcome+err.Error())
	}
	return err, final
}

// RetryDelay is asynq's Config.RetryDelayFunc for tasks run through
// turns.TakeTask and turns.EndTask (a [Runner]'s): the delay the run
// chose (how long a parked task stays away, the backoff of a failure,
// taken when it failed so that the tasks behind it wait as long), a
// random busy delay for another error that is no failure (a lost lease, a
// stale fence, asynq's expired lease), or turnsConfig.RetryDelay.
func (t *turns) RetryDelay(n int, err error, task *asynq.Task) time.Duration {
	var later *laterError
	switch {
	case errors.As(err, &later):
		return later.delay
	case !IsFailure(err):
		return t.busyDelay()
	}
	return t.cfg.RetryDelay(n, err, task)
}

// busyDelay is a random delay between BusyRetryMin and BusyRetryMax.
func (t *turns) busyDelay() time.Duration {
	lo, hi := t.cfg.BusyRetryMin, t.cfg.BusyRetryMax
	return lo + rand.N(hi-lo+1)
}
