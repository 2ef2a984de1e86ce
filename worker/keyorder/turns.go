package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/tracing"
)

// taskSource is what a turns asks of the queue whose tasks hold a key's
// positions (asynq, in the worker). Its methods are called from many
// goroutines at once.
type taskSource interface {
	// HeadFate says why the task holding the head of key's sequence
	// (te.Head under te.Label) will never take its turn: a reason to skip
	// the position, or "" when it will come. When it exists and runs only
	// later (scheduled, backing off), delay says how long from now.
	HeadFate(ctx context.Context, key string, te *TurnError) (why string, delay time.Duration, err error)
	// Wake brings the parked holders of the labels a settlement handed
	// back (lease.Wake, settlement.Wake) to the front of their queues.
	Wake(ctx context.Context, key string, labels []string) error
}

// turnsConfig tunes a turns. The zero value means all defaults.
type turnsConfig struct {
	// GapWait is how long the head of a sequence may wait for its holder
	// before turns.Take asks taskSource.HeadFate whether it will come, and
	// the longest a parked waiter stays away. Defaults to 30 seconds.
	GapWait time.Duration
	// SettleTimeout bounds the sequence writes made after a holder's work
	// (passing the turn on, notes, settlements), which run on a context
	// that survives the work's cancellation. Defaults to 5 seconds.
	SettleTimeout time.Duration
	// Logger receives what goes wrong in those writes (the work's outcome
	// stands either way), the skips, and a warning for each lease granted
	// on a key whose sequence does not exist (Report.SequenceGone).
	// Defaults to discarding, except that warning: without a Logger it
	// goes to slog.Default, at most once a minute,
	// since a Client and a Runner on two key prefixes lose every task's
	// order without another sign.
	Logger *slog.Logger
	// KeyField names the key in those log lines. Defaults to "key" (the
	// order domain logs "order_no").
	KeyField string
	// RetryDelay is the backoff of a failed task after n failures, chosen
	// by turns.EndTask when it fails (the tasks behind it wait as long).
	// Defaults to asynq.DefaultRetryDelayFunc.
	RetryDelay asynq.RetryDelayFunc
	// BusyRetryMin and BusyRetryMax bound the random delay after which a
	// task that only waited, or lost its key, runs again (see
	// turns.TakeTask and turns.RetryDelay). Default 100 ms and 1 s.
	BusyRetryMin, BusyRetryMax time.Duration
	// MaxRetryWait is the longest backoff a failing head can have earned
	// (the retry policy's longest): a head's mark of when it runs again
	// further out than that is no failure's, but written by a Redis user
	// that may write the sequences, and is not waited for: the tasks
	// behind it look at the head as at any head that does not come (the
	// gap check). Defaults to DefaultMaxRetryWait.
	MaxRetryWait time.Duration
}

// DefaultMaxRetryWait is the default of turnsConfig.MaxRetryWait: the
// longest backoff asynq.DefaultRetryDelayFunc gives in asynq's default
// budget of 25 retries (25⁴ + 15 + 30·26 seconds, about 4.5 days).
const DefaultMaxRetryWait = (390625 + 15 + 780) * time.Second

// DefaultGapWait is the default of turnsConfig.GapWait.
const DefaultGapWait = 30 * time.Second

// defaultSettleTimeout is the default of turnsConfig.SettleTimeout.
const defaultSettleTimeout = 5 * time.Second

// defaultBusyRetryMin and defaultBusyRetryMax are the defaults of
// turnsConfig.BusyRetryMin and BusyRetryMax, and of a [Runner]'s.
const (
	defaultBusyRetryMin = 100 * time.Millisecond
	defaultBusyRetryMax = time.Second
)

// ParkError is returned by turns.Take for a holder that goes back to its
// queue for Delay without its turn: its position is too far back, its
// wait ran out, the head backs off after a failure, or the head's task
// runs only later. It matches [ErrNotYourTurn], and Delay is at most the
// GapWait, so that a head that will never come is found within about
// GapWait.
type ParkError struct {
	Err   *TurnError
	Delay time.Duration
}

func (e *ParkError) Error() string {
	return fmt.Sprintf("%v; parked for %v", e.Err, e.Delay.Round(time.Millisecond))
}
func (e *ParkError) Unwrap() error { return e.Err }

// taken is what a turns.Take did before it returned, also on an error.
type taken struct {
	// Waited is how long it waited for the lock and the turn.
	Waited time.Duration
	// Skipped counts the head positions it skipped because their holders
	// will never come.
	Skipped int
}

// turns is the one owner of the per-key sequence's turns on the holders'
// side: it takes a key's lock in a position's turn (waiting, parking, and
// skipping a head whose holder will never come, which it learns from
// taskSource), passes the turn on when the work ends, and settles the
// positions of holders that end without their turn. A run of an asynq
// task reads as turns.TakeTask, run (the store's commit may pass the
// turn on, see [Commit]), turns.EndTask: the [Runner]'s, and the order
// domain's worker's, which adds its spans and metrics around them.
//
// A Turns is safe for concurrent use. It starts no goroutine; the locker's
// retries of releases whose reply was lost call back, through the last
// Turns built on it, the parked holders they find.
type turns struct {
	l     *locker
	seq   *Sequencer
	tasks taskSource
	cfg   turnsConfig
	log   *slog.Logger
	// loudGone says no Logger was given: a sequence found gone is warned
	// of through slog.Default, at most once per goneWarnEvery
	// (goneAt, Unix ns of the last warning).
	loudGone bool
	goneAt   atomic.Int64
}

// goneWarnEvery is how often, at most, a turns (a [Runner]'s)
// given no Logger warns through slog.Default of a lease granted on a key
// whose sequence does not exist (see TurnsConfig.Logger).
const goneWarnEvery = time.Minute

// newTurns returns the Turns of l's keys, asking tasks about their
// holders. It returns an error for a nil argument or a negative setting.
func newTurns(l *locker, tasks taskSource, cfg turnsConfig) (*turns, error) {
	if l == nil || tasks == nil {
		return nil, errors.New("keyorder: turns need a locker and tasks")
	}
	if cfg.GapWait < 0 || cfg.SettleTimeout < 0 {
		return nil, errors.New("keyorder: turns: GapWait and SettleTimeout must not be negative")
	}
	cfg.BusyRetryMin = cmp.Or(cfg.BusyRetryMin, defaultBusyRetryMin)
	cfg.BusyRetryMax = cmp.Or(cfg.BusyRetryMax, max(defaultBusyRetryMax, cfg.BusyRetryMin))
	if cfg.BusyRetryMin < 0 || cfg.BusyRetryMax < cfg.BusyRetryMin {
		return nil, fmt.Errorf("keyorder: turns: BusyRetryMin %v and BusyRetryMax %v must be 0 <= min <= max", cfg.BusyRetryMin, cfg.BusyRetryMax)
	}
	if cfg.RetryDelay == nil {
		cfg.RetryDelay = asynq.DefaultRetryDelayFunc
	}
	cfg.GapWait = cmp.Or(cfg.GapWait, DefaultGapWait)
	cfg.SettleTimeout = cmp.Or(cfg.SettleTimeout, defaultSettleTimeout)
	cfg.MaxRetryWait = cmp.Or(cfg.MaxRetryWait, DefaultMaxRetryWait)
	cfg.KeyField = cmp.Or(cfg.KeyField, "key")
	loud := cfg.Logger == nil
	if loud {
		cfg.Logger = discard
	}
	t := &turns{l: l, seq: l.Sequencer(), tasks: tasks, cfg: cfg, log: cfg.Logger, loudGone: loud}
	// The locker's retries of releases whose reply was lost call back
	// through the Turns the holders that those releases found parked.
	wake := t.wake
	l.onWake.Store(&wake)
	return t, nil
}

// warnGone warns that key's sequence does not exist, for the lease of
// position pos granted to meta: to the Logger, or, without one, to
// slog.Default at most once per goneWarnEvery.
func (t *turns) warnGone(ctx context.Context, key, meta string, pos int64) {
	log := t.log
	if t.loudGone {
		now, last := time.Now().UnixNano(), t.goneAt.Load()
		if last != 0 && now-last < int64(goneWarnEvery) || !t.goneAt.CompareAndSwap(last, now) {
			return
		}
		log = slog.Default()
	}
	tracing.Slog(ctx, log).Warn("the key's sequence does not exist: the task runs without order; it expired or was lost, or the task's positions were handed out under another key prefix than this worker's",
		slog.String(t.cfg.KeyField, key), slog.Int64("seq", pos), slog.String("holder", meta),
		slog.String("prefix", t.seq.prefix))
}

// Take takes key's lock in turn's position (a zero turn: without order),
// waiting by policy w. A position more than two behind the head, or one
// that waited its deadline, is parked: Take returns a [*ParkError] with
// the delay after which its holder should look again (the call back of
// the release before it brings it back sooner, see taskSource.Wake). When
// the head has waited for its holder longer than GapWait, Take asks
// taskSource.HeadFate about it once, skips it when its holder will never
// come (the skip is logged in the sequence with the reason), and tries
// again. Sooner, the holder of the position next in line asks once, when
// the head was reserved more than a second ago (or GapWait, if shorter;
// it parks until then), whether the head's task has already ended
// (completed or archived: the end of its turn was lost in a failover of
// the key's master, while its queue's master kept the task's end) and
// skips it at once, so that a lost turn costs its key about a second
// rather than GapWait. When the key's sequence is paused and it is the position's turn,
// the holder parks for GapWait (Resume calls it back sooner).
//
// It returns a [*BusyError] when the lock stayed held past w's deadline,
// errors matching [ErrBadPosition] for a position that is not the
// caller's, and Redis and HeadFate errors, wrapped.
func (t *turns) Take(ctx context.Context, key, meta string, turn Turn, w Wait) (*lease, taken, error) {
	var done taken
	checked := int64(0) // the head found to exist: no need to look again
	probed := int64(0)  // the head asked once whether its task ended
	for {
		wt := w
		if turn.Pos > 0 && checked == 0 {
			wt.StuckAfter = t.cfg.GapWait
		}
		lease, err := t.l.AcquireTurn(ctx, key, meta, turn, wt)
		var te *TurnError
		var busy *BusyError
		switch {
		case err == nil:
			if lease.sequenceGone() {
				t.warnGone(ctx, key, meta, turn.Pos)
			}
			return lease, done, nil
		case errors.As(err, &busy):
			done.Waited += busy.Waited
			return nil, done, err
		case !errors.As(err, &te):
			return nil, done, err
		}
		done.Waited += te.Waited
		if te.Paused != nil {
			// On hold: Resume calls it back; until then it looks again
			// every GapWait, at the cost of one acquire.
			return nil, done, t.park(te, t.cfg.GapWait)
		}
		switch {
		case te.Retry > t.cfg.MaxRetryWait:
			// No failure earns that: look at the head as at one that
			// does not come (below).
			tracing.Slog(ctx, t.log).Warn("the head's retry mark is further out than any backoff; not waited for",
				slog.String(t.cfg.KeyField, key), slog.Int64("seq", te.Head), slog.Duration("retry_in", te.Retry),
				slog.Duration("max_retry_wait", t.cfg.MaxRetryWait))
		case te.Retry > 0:
			// The head failed and runs again later: so do we, just after,
			// unless its success calls us back first.
			return nil, done, t.park(te, te.Retry)
		}
		if te.Pos == te.Head+1 && te.Head != checked && te.Head != probed {
			// Next in line: has the head's task already ended?
			after := min(endedAfter, t.cfg.GapWait)
			if te.Age < after {
				return nil, done, t.park(te, after-te.Age)
			}
			probed = te.Head
			if t.endedHead(ctx, key, te) {
				done.Skipped++
				continue
			}
		}
		if te.Age < t.cfg.GapWait || te.Head == checked {
			return nil, done, t.park(te, t.cfg.GapWait)
		}
		skipped, delay, err := t.resolveHead(ctx, key, te)
		switch {
		case err != nil:
			return nil, done, err
		case skipped:
			done.Skipped++
			continue
		case delay > 0:
			return nil, done, t.park(te, delay)
		}
		checked = te.Head
	}
}

// park is the ParkError of a waiter for a head that runs again only after
// d: no later than GapWait, so that a head whose task is deleted meanwhile
// is found and skipped within about GapWait.
func (t *turns) park(te *TurnError, d time.Duration) *ParkError {
	return &ParkError{Err: te, Delay: min(d, t.cfg.GapWait)}
}

// resolveHead skips the head of te, which has waited for its holder longer
// than GapWait, when taskSource.HeadFate says it will never come. It reports
// whether the head was skipped (by this call or, meanwhile, another), or
// how long before its holder runs.
func (t *turns) resolveHead(ctx context.Context, key string, te *TurnError) (skipped bool, delay time.Duration, err error) {
	why, delay, err := t.tasks.HeadFate(ctx, key, te)
	if err != nil || why == "" {
		return false, delay, err
	}
	if err := t.skipHead(ctx, key, te, why); err != nil {
		return false, 0, err
	}
	// Skipped by us or, meanwhile, by someone else, or its holder came:
	// try again either way.
	return true, 0, nil
}

// endedAfter is how long after its reservation a head is asked, by the
// holder of the position next in line, whether its task has already
// ended (headEnder); GapWait when that is shorter. That holder parks
// until then, when the head is younger: a younger head's task is most
// likely on its way (its end calls the holder back sooner), and the
// question costs a read.
const endedAfter = time.Second

// headEnder is implemented by the tasks that can say at once, with no
// GapWait, that the head of key's sequence will never take its turn
// because its task has ended: it completed or was archived without the
// end of its turn, which a failover can lose with the key's master while
// the task's end, recorded on its queue's master, survives. why is "" for
// a task that has not ended or that no queue holds (that one may still be
// on its way: HeadFate decides after GapWait). queueTasks and the
// Runner's Tasks implement it.
type headEnder interface {
	headEnded(ctx context.Context, key string, te *TurnError) (why string, err error)
}

// endedHead skips te's head of key when the Tasks say its task has ended
// (headEnder), and reports whether the head is gone (skipped by this
// call or meanwhile by someone else). A failed read or skip is logged and
// reported as false: the waiter waits as it would have, GapWait at most.
func (t *turns) endedHead(ctx context.Context, key string, te *TurnError) bool {
	he, ok := t.tasks.(headEnder)
	if !ok {
		return false
	}
	why, err := he.headEnded(ctx, key, te)
	if err == nil && why != "" {
		err = t.skipHead(ctx, key, te, why)
	}
	if err != nil {
		if ctx.Err() == nil {
			tracing.Slog(ctx, t.log).Warn("could not ask whether the head's task ended; waiting for it",
				slog.String(t.cfg.KeyField, key), slog.Int64("seq", te.Head), errAttr(err))
		}
		return false
	}
	return why != ""
}

// skipHead skips te's head of key for why, logs the skip and wakes the
// holders it hands the turn to. A head skipped meanwhile by someone else,
// or whose holder came, is no error (the caller tries again either way).
func (t *turns) skipHead(ctx context.Context, key string, te *TurnError, why string) error {
	st, err := t.seq.Skip(ctx, key, te.Head, te.Record, why)
	if err != nil {
		return fmt.Errorf("skip position %d of %s: %w", te.Head, key, err)
	}
	if st.Done {
		tracing.Slog(ctx, t.log).Warn("position skipped", slog.String(t.cfg.KeyField, key), slog.Int64("seq", te.Head),
			slog.String("label", te.Label), slog.String("reason", why))
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(tracing.EventSkipped, trace.WithAttributes(tracing.AttrHeadSeq.Int64(te.Head),
			tracing.AttrHead.String(te.Label), tracing.AttrReason.String(why), attribute.Bool("orderworker.by_this_run", st.Done)))
	}
	t.wake(ctx, key, st.Wake)
	return nil
}

// Pass ends the holder's work under lease. When done (the position's work
// ended: applied, or given up for good), the release passes the turn on;
// otherwise the turn stays, and with retryAt set the positions behind wait
// until then. It releases the lease (a failed release is logged: the
// lock then expires with its lease; ok says the work succeeded, for the
// log) and wakes the parked holders the release handed back, on contexts
// that survive ctx's cancellation (the release's bounded by
// lockConfig.ReleaseTimeout, the wake's by SettleTimeout).
//
// With lease.Drain set, a turn that is done after work that succeeded
// passes on to the next position while the lock is kept, when that
// position's holder is parked and the key is not paused: Pass then returns
// that position and true, and the caller goes on with it in the same hold
// (lease.Next), or releases the lease and calls its holder back
// (turns.Release). A store's commit may have kept it already (see
// [Handoff.Kept]).
func (t *turns) Pass(ctx context.Context, lease *lease, done bool, retryAt time.Time, ok bool) (Turn, bool) {
	switch {
	case done:
		lease.Finish()
		if lease.mode == ModeTurn {
			// Kept to be ended again if Redis loses it (reassert.go).
			t.l.ended(lease.key, lease.owner, lease.Turn().Pos)
		}
	case !retryAt.IsZero():
		lease.RetryAt(retryAt)
	}
	if next, kept := lease.Kept(); kept {
		return next, true // the store's commit kept it
	}
	lease.mu.Lock()
	byStore := lease.byStore
	lease.mu.Unlock()
	if done && ok && !byStore && lease.drain.Load() {
		kept, err := lease.passOn(ctx)
		if err != nil {
			tracing.Slog(ctx, t.log).Warn("could not pass the turn on in the hold; releasing", slog.String("key", lease.key), errAttr(err))
		}
		if next, ok := lease.Kept(); kept && ok {
			return next, true
		}
	}
	t.l.release(ctx, lease, ok) // on its own context: see lease.Release
	t.wake(ctx, lease.key, lease.Wake())
	return Turn{}, false
}

// ReleaseKept releases a lease that a commit kept for the next position
// (see turns.Pass) without calling that position's holder back: the
// caller sends it to its queue itself.
func (t *turns) ReleaseKept(ctx context.Context, lease *lease) {
	t.l.release(ctx, lease, true)
}

// Release releases a lease that a commit kept for the next position (see
// turns.Pass) when its holder does not go on with it, and calls that
// position's holder back, as a release would have.
func (t *turns) Release(ctx context.Context, lease *lease) {
	next, kept := lease.Kept()
	t.l.release(ctx, lease, true)
	if kept {
		t.wake(ctx, lease.key, []string{next.Label})
	}
}

// Abandon uses up position turn of key, whose holder ends without running
// in its turn (its work is given up for good: it never will run), with the
// outcome logged in the sequence, and wakes the holders that called
// back. A failure is logged: the position is then skipped by the gap
// check.
func (t *turns) Abandon(ctx context.Context, key string, turn Turn, outcome string) {
	if turn.Pos == 0 {
		return
	}
	ctx, cancel := t.settleCtx(ctx)
	defer cancel()
	st, err := t.seq.finish(ctx, key, turn.Pos, turn.Label, "", clip(outcome))
	if err != nil {
		tracing.Slog(ctx, t.log).Warn("could not use up the position of an archived task; it is skipped after the gap check",
			slog.String(t.cfg.KeyField, key), slog.Int64("seq", turn.Pos), errAttr(err))
	}
	t.wake(ctx, key, st.Wake)
}

// Note records in key's sequence log that the holder of position pos (0
// for none) under label ended for good without its work, and why (see
// [Sequencer.Note]): the note outlives the holder's own record. A failure
// loses the note and is logged.
func (t *turns) Note(ctx context.Context, key string, pos int64, label, reason string) {
	ctx, cancel := t.settleCtx(ctx)
	defer cancel()
	if err := t.seq.noteAt(ctx, key, pos, label, clip(reason)); err != nil {
		tracing.Slog(ctx, t.log).Warn("could not note the archived task in its order's sequence",
			slog.String(t.cfg.KeyField, key), slog.Int64("seq", pos), errAttr(err))
	}
}

// CreationRef is the reference of the position that creator, the ID of a
// task that creates a key, reserves in the created key's sequence: the
// tasks of the created key accepted after it wait for the creation.
func CreationRef(creator string) string { return "c:" + creator }

// notCreated starts the outcome of a creation that did not happen.
const notCreated = "not created: "

// Created finishes the position that creator (an event ID, described as
// by in the log, e.g. "exchange E of SO1") reserved in created's sequence:
// created exists now, or, when err is not nil, never will (the reason is
// logged in created's sequence, where turns.NotCreated finds it). The
// changes of created accepted after the creator can then go. A failure is
// logged: they then wait for the gap check.
func (t *turns) Created(ctx context.Context, created, creator, by string, err error) {
	outcome := "created by " + by
	if err != nil {
		outcome = notCreated + by + " was rejected: " + clip(err.Error())
	}
	ctx, cancel := t.settleCtx(ctx)
	defer cancel()
	st, serr := t.seq.finish(ctx, created, 0, "", CreationRef(creator), outcome)
	if serr != nil {
		tracing.Slog(ctx, t.log).Warn("could not mark the replacement's creation; its next changes wait for the gap check",
			slog.String(t.cfg.KeyField, created), slog.String("event_id", creator), errAttr(serr))
	}
	t.wake(ctx, created, st.Wake)
}

// NotCreated returns why key was to be created and was not ("" when its
// sequence logged no such outcome), for the error of a change of a key
// that does not exist: the outcome turns.Created logged for a creation
// that did not happen ("exchange E of SO1 was rejected: ..."), or, for a
// position whose label creation reports true for (the position a creator
// reserved in key's sequence; nil: none) that was skipped or voided,
// "position N (label) was skipped: why" (the skip's reason: an operator's
// names who and why). The newest such entry of the log wins; the log keeps
// the latest 20 entries. A read error is returned, wrapped.
func (t *turns) NotCreated(ctx context.Context, key string, creation func(label string) bool) (string, error) {
	st, err := t.seq.Status(ctx, key)
	if err != nil {
		return "", fmt.Errorf("why %s was not created: %w", key, err)
	}
	for i := len(st.Log) - 1; i >= 0; i-- {
		e := st.Log[i]
		switch {
		case e.Kind == "finish" && strings.HasPrefix(e.Reason, notCreated):
			return strings.TrimPrefix(e.Reason, notCreated), nil
		case e.Skipped() && creation != nil && creation(e.Label):
			return settledText(e), nil
		}
	}
	return "", nil
}

// Skipped returns why position pos of key, reserved under label, was
// given up without its turn (skipped or voided: "position N (label) was
// skipped: why"), or "" when key's sequence log has no such entry (the log
// keeps the latest 20), for the error of a holder that comes after its
// position was passed. A read error is returned, wrapped.
func (t *turns) Skipped(ctx context.Context, key string, pos int64, label string) (string, error) {
	st, err := t.seq.Status(ctx, key)
	if err != nil {
		return "", fmt.Errorf("why %s position %d was passed: %w", key, pos, err)
	}
	for i := len(st.Log) - 1; i >= 0; i-- {
		if e := st.Log[i]; e.Skipped() && e.Pos == pos && e.Label == label {
			return settledText(e), nil
		}
	}
	return "", nil
}

// settledText describes a skipped or voided position of a sequence's log.
func settledText(e Settled) string {
	verb := "skipped"
	if e.Kind == "void" {
		verb = "voided"
	}
	return fmt.Sprintf("position %d (%s) was %s at %s: %s", e.Pos, e.Label, verb, e.At.Format(time.RFC3339), e.Reason)
}

// wake hands labels to taskSource.Wake; a failure only costs those holders
// their park delay, and is logged.
func (t *turns) wake(ctx context.Context, key string, labels []string) {
	if len(labels) == 0 {
		return
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(tracing.EventWoken, trace.WithAttributes(tracing.AttrWoken.StringSlice(labels)))
	}
	ctx, cancel := t.settleCtx(ctx)
	defer cancel()
	if err := t.tasks.Wake(ctx, key, labels); err != nil {
		tracing.Slog(ctx, t.log).Warn("could not bring parked tasks back; they come back after their park delay",
			slog.String(t.cfg.KeyField, key), slog.Any("labels", labels), errAttr(err))
	}
}

// settleCtx is a context for the writes after a holder's work: it
// survives ctx's cancellation and ends after SettleTimeout.
func (t *turns) settleCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), t.cfg.SettleTimeout)
}

// clip cuts an outcome to the length a sequence's log keeps.
func clip(s string) string {
	if len(s) > MaxMetaLen {
		return s[:MaxMetaLen]
	}
	return s
}
