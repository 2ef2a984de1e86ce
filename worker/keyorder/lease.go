package keyorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/tracing"
)

// errReleased cancels a kept lease's context once the lease is released.
var errReleased = errors.New("keyorder: lease released")

// leaseStats describes how a lease was acquired.
type leaseStats struct {
	Waited        time.Duration // from the first attempt to the lock
	Attempts      int           // acquire scripts run
	WokenByNotice int           // waits ended by a release notice
	WokenByDelay  int           // waits ended by the random delay
	TurnWaits     int           // attempts that found it not yet the position's turn
}

// lease is a held lock. Its methods are safe for concurrent use. A lease must
// be released with Release; a lease that is never released expires after the
// locker's TTL (if it was not kept).
type lease struct {
	l     *locker
	key   string
	owner string
	meta  string
	// fence is the lease's fencing token; CatchUp raises it.
	fence atomic.Int64
	stats leaseStats
	turn  Turn
	mode  Mode
	// seqGone says the lease's position was granted without order
	// because its key's sequence does not exist (ModePassed).
	seqGone bool

	handingOff atomic.Bool // a store script may release the lock (Handoff)
	drain      atomic.Bool // Drain: keep the lock for a parked next holder

	mu       sync.Mutex
	wake     string    // the parked next holder's label, once released
	finished bool      // Finish: the turn is done
	retryAt  time.Time // RetryAt: when the holder runs again
	halt     string    // halt: the reason to halt the key at the turn
	released bool
	byStore  bool  // a store script released it (Handoff.Released), or passOn did
	kept     Turn  // the next position, when a commit kept the lock for it (Drain)
	offset   int64 // the key's position offset (see Seq)
	step     commitStep
	holdCtx  context.Context
	stop     chan struct{} // closed by Release to end the renewal
	done     chan struct{} // closed when the renewal goroutine has ended
	cancel   context.CancelCauseFunc
}

// Key returns the key the lease locks.
func (s *lease) Key() string { return s.key }

// Fence returns the lease's fencing token: strictly greater than that of
// every earlier lease on the key. Pass it with every write the lock guards.
// lease.CatchUp may raise it.
func (s *lease) Fence() int64 { return s.fence.Load() }

// FenceKey returns the Redis key that holds the newest fence handed out for
// the lease's key. A store on the same Redis can refuse a fence older than
// it, which shuts out a former holder as soon as the lock changes hands
// (see [Hold]). It carries the key's hash tag.
func (s *lease) FenceKey() string { return s.l.fenceKey(s.key) }

// SeqKey returns the Redis key of the key's sequence, whose fields
// "p:<position>" (the record "<taken at> <label>") and "k:<position>"
// (set while that position's holder is parked) tell who is behind the
// lease, or "" when the lease holds no turn (not ModeTurn).
func (s *lease) seqKey() string {
	if s.mode != ModeTurn {
		return ""
	}
	return s.l.seq.SeqKey(s.key)
}

// leaseStats returns how the lease was acquired.
func (s *lease) Stats() leaseStats { return s.stats }

// Mode returns how the lease was granted: ModeFree without a position,
// ModeTurn in its position's turn, ModePassed for a position that was
// already finished, or whose key's sequence does not exist
// (see sequenceGone).
func (s *lease) Mode() Mode { return s.mode }

// sequenceGone reports whether the lease was granted at once, without
// order (ModePassed), because its key has no sequence: it expired
// (SeqConfig.Retention) or was lost with its Redis, or the task's
// positions were handed out under another prefix than the locker's (a
// Client and a Runner built on Sequencers of two SeqConfig.Prefix, in two
// programs configured apart). turns.Take logs it.
func (s *lease) sequenceGone() bool { return s.seqGone }

// Turn returns the position the lease was acquired for (zero for none).
func (s *lease) Turn() Turn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turn
}

// Finish says that the work of the lease's position is done, whatever its
// outcome: Release then moves the sequence on to the next position. Without
// Finish, Release keeps the position next (the holder will run again).
// It matters only for a lease in ModeTurn, and is safe for concurrent use.
func (s *lease) Finish() {
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
}

// Wake returns, after Release, the labels of the positions whose parked
// holders the release called (see [TurnError.Parked]): the one whose turn
// it now is, and the two after it, which are to wait in place. The caller
// must bring their holders back, since no waiter listens for them. It is
// empty otherwise. It is safe for concurrent use.
func (s *lease) Wake() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return splitWake(s.wake)
}

// splitWake splits the labels that the scripts return joined by newlines.
func splitWake(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// RetryAt says when the holder of an unfinished turn will run again, so that
// the positions waiting behind it can stop waiting until then (see
// TurnError.Retry). Release records it.
func (s *lease) RetryAt(t time.Time) {
	s.mu.Lock()
	s.retryAt = t
	s.mu.Unlock()
}

// haltTurn asks Release, for a turn that stays (not finished), to halt
// the key at the lease's position for why, in the release's own script
// (seq_halt): the key is then paused, and no position behind runs (see
// [FailureHalt]).
func (s *lease) haltTurn(why string) {
	s.mu.Lock()
	s.halt = why
	s.mu.Unlock()
}

// Drain asks the commit of the lease's turn (a store script's, see
// [Handoff], or turns.Pass's release) to keep the lock, rather than
// release it, when it passes the turn on to a holder that is parked: the
// holder of the lease then goes on with that position itself (see
// lease.Kept and lease.Next), in the same hold, with the same fence.
// The commit releases as usual when the next holder is not parked, the key
// is paused, or the work did not succeed. It matters only in ModeTurn and
// is safe for concurrent use.
func (s *lease) Drain(on bool) { s.drain.Store(on && s.mode == ModeTurn) }

// Kept returns the position whose turn the last commit passed on while it
// kept the lock (see lease.Drain): its holder is parked, and the lease's
// holder is to run it (or, failing that, release the lease and call the
// holder back). It returns false when the lock was not kept.
func (s *lease) Kept() (Turn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept, s.kept.Pos > 0
}

// Next moves a lease kept by its commit (see lease.Kept) on to the next
// position, turn, for the holder's next piece of work: the lease is then as
// if acquired in turn's turn, with the same fence and the same renewal.
// It returns an error when the lease was not kept for turn.
func (s *lease) Next(turn Turn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released || s.kept != turn || turn.Pos == 0 {
		return fmt.Errorf("keyorder: lease of %s was not kept for position %d", s.key, turn.Pos)
	}
	s.turn, s.kept = turn, Turn{}
	s.finished, s.retryAt, s.wake, s.halt = false, time.Time{}, "", ""
	s.drain.Store(false)
	s.handingOff.Store(false)
	return nil
}

// keptTurn reads lock_commit's "<pos> <label>" of a kept lock.
func keptTurn(wake string) Turn {
	p, label, ok := strings.Cut(wake, " ")
	pos, err := strconv.ParseInt(p, 10, 64)
	if !ok || err != nil || pos <= 0 {
		return Turn{}
	}
	return Turn{Pos: pos, Label: label}
}

// HoldContext returns the context that lease.Keep returned: the work of
// every position the lease goes on with (see lease.Next) derives from
// it, so that a lost lease cancels it. It returns nil before Keep.
func (s *lease) HoldContext() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdCtx
}

// Keep starts renewing the lease every TTL/3 and returns a context derived
// from ctx for the guarded work. That context is cancelled with cause
// [ErrLost] when a renewal finds the lock gone or owned by someone else, or
// when renewals fail (Redis unreachable) until the lease may have expired; a
// failed renewal is retried at a quarter of the time left. Renewal stops on Release, on ctx's end, or on
// loss; its goroutine never outlives Release. Keep may be called once; later
// calls, and calls after Release, return ctx unchanged.
func (s *lease) Keep(ctx context.Context) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil || s.released {
		return ctx
	}
	wctx, cancel := context.WithCancelCause(ctx)
	s.stop, s.done, s.cancel, s.holdCtx = make(chan struct{}), make(chan struct{}), cancel, wctx
	go s.renew(wctx, cancel)
	return wctx
}

func (s *lease) renew(ctx context.Context, cancel context.CancelCauseFunc) {
	defer close(s.done)
	ttl := s.l.cfg.TTL
	every := ttl / 3
	t := time.NewTimer(every)
	defer t.Stop()
	// The lease surely lasts until ttl after the start of the last renewal
	// that succeeded (Redis extended it after that start).
	expires := time.Now().Add(ttl)
	// The logger of the rare lines below, built when one is written: not
	// for every run (with tracing on it also formats the trace and span
	// IDs).
	log := func() *slog.Logger {
		return tracing.Slog(ctx, s.l.log).With(slog.String("key", s.key), slog.Int64("fence", s.fence.Load()))
	}
	for {
		select {
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		left := expires.Sub(start)
		if left <= 0 {
			log().Warn("lease lost: renewals failed until it expired")
			cancel(fmt.Errorf("%w: renewals failed until the lease expired", ErrLost))
			return
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), left)
		ok, err := s.refresh(rctx)
		rcancel()
		switch {
		case err == nil && ok:
			expires = start.Add(ttl)
			t.Reset(every)
		case err == nil && s.handingOff.Load():
			return // a store script may have released it with the work's commit
		case err == nil:
			log().Warn("lease lost: lock gone or taken")
			cancel(ErrLost)
			return
		case time.Now().After(expires):
			log().Warn("lease lost: renewals failing", errAttr(err))
			cancel(fmt.Errorf("%w: renewals failing: %w", ErrLost, err))
			return
		default:
			// Try again soon: the lease is still running.
			log().Info("lease renewal failed; retrying", errAttr(err))
			t.Reset(min(every, time.Until(expires)) / 4)
		}
	}
}

// refresh runs the renewal script once.
func (s *lease) refresh(ctx context.Context) (bool, error) {
	n, err := refreshScript.Run(ctx, s.l.rdb, []string{s.l.lockKey(s.key)},
		s.owner, s.l.cfg.TTL.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("renew %s: %w", s.key, err)
	}
	return n == 1, nil
}

// Refresh extends the lease to a full TTL once. It returns errNotHeld when
// the lock is gone or owned by someone else. Kept leases renew themselves
// and need no Refresh.
func (s *lease) Refresh(ctx context.Context) error {
	ok, err := s.refresh(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("renew %s: %w", s.key, errNotHeld)
	}
	return nil
}

// Handoff is what a store's script on the same Redis needs to release a
// lease itself, and pass its turn on, with [CommitLua]'s lock_commit, in the
// round trip that commits the work: one round trip fewer per hold. Call
// Released when the script reports that it released the lock, and Finished
// when it passed the turn on.
type Handoff struct {
	Key     string // the lock hash, with the key's hash tag
	Owner   string // the lease's owner token
	Channel string // the release notice channel
	// Keep is lock_commit's keep (see lease.Drain): when true, the script
	// may keep the lock for the next position; it then reports it with
	// [Handoff.Kept].
	Keep bool
	// SeqKey is the key's sequence and Pos the lease's position, when the
	// lease holds a turn (ModeTurn); "" and 0 otherwise.
	SeqKey string
	Pos    int64
	// Backlog and BacklogSum are the key space's index of backlogs (see
	// [Sequencer.Backlog]), which a script that passes the turn on must
	// name among its KEYS and give lock_commit (its ix and sum), so that
	// the index stays exact; "" when the lease holds no turn or the key
	// space keeps no index (a Cluster: they are in another slot).
	Backlog, BacklogSum string
	// Step, when not nil (with Keep), is the lease's commitStep: the
	// store sends it in a pipeline right after its script, in the same
	// round trip (see lease.SetCommitStep).
	Step  commitStep
	lease *lease
}

// commitStep is work that a draining lease's holder sends in the round
// trip of the commit that may keep the lock for the next position (a
// store's script with lock_commit, or the release script of
// turns.Pass): queued on pipe right after the commit, it runs right
// after it, on the same Redis, and can tell from what the commit wrote
// whether it kept the lock (h names the lock, its owner and the sequence).
// It must write nothing unless the commit kept the lock, and it must read
// its own result after pipe's execution: a failed step (a NOSCRIPT, say)
// must leave the commit's result alone.
type commitStep func(ctx context.Context, pipe redis.Pipeliner, h *Handoff)

// SetCommitStep sets the step to send with the lease's next commit that
// may keep the lock (nil for none), in place of the one set before. The
// step only makes sense on a single Redis, where the lock's keys and the
// step's are on one node. It is safe for concurrent use.
func (s *lease) SetCommitStep(step commitStep) {
	s.mu.Lock()
	s.step = step
	s.mu.Unlock()
}

// commitStep returns the step of a commit that may keep the lock: nil
// unless the lease drains.
func (s *lease) commitStep() commitStep {
	if !s.drain.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.step
}

// Committing tells the lease that the store is about to run the script
// that may release it: from then on a renewal that finds the lock gone stops
// quietly instead of cancelling the work with ErrLost (the script's fence
// check still refuses a late write). Call it right before that script.
func (h *Handoff) Committing() { h.lease.handingOff.Store(true) }

// Released tells the lease that a store script released it (and, when
// finished is true, passed its turn on; wake is lock_commit's second value):
// Release then only stops the renewal and returns nil, without a round
// trip. It is safe for concurrent use.
func (h *Handoff) Released(finished bool, wake string) {
	h.lease.mu.Lock()
	h.lease.byStore = true
	if finished {
		h.lease.finished = true
	}
	h.lease.wake = wake
	h.lease.mu.Unlock()
}

// Kept tells the lease that a store script passed its turn on and kept the
// lock (lock_commit returned 2, with wake "<position> <label>" of the next
// position, whose parked holder the lease's holder is to run: see
// lease.Kept). A wake that does not read as a position is taken for a
// release of the lock by the script. It is safe for concurrent use.
func (h *Handoff) Kept(wake string) {
	t := keptTurn(wake)
	if t.Pos == 0 {
		h.Released(true, "")
		return
	}
	h.lease.mu.Lock()
	h.lease.finished, h.lease.kept = true, t
	h.lease.mu.Unlock()
	h.lease.handingOff.Store(false)
}

// Handoff returns what a store script needs to release the lease with the
// work's commit. Handing it out changes nothing until the store calls
// Committing.
func (s *lease) Handoff() *Handoff {
	h := &Handoff{Key: s.l.lockKey(s.key), Owner: s.owner, Channel: s.l.channel, lease: s}
	if s.mode == ModeTurn {
		h.SeqKey, h.Pos = s.l.seq.SeqKey(s.key), s.Turn().Pos
		if s.l.seq.counted {
			h.Backlog, h.BacklogSum = s.l.seq.backlogKey(), s.l.seq.backlogSumKey()
		}
		h.Keep = s.drain.Load()
		if h.Keep {
			h.Step = s.commitStep()
		}
	}
	return h
}

// passOn finishes the lease's turn with the release script and keeps the
// lock when the next holder is parked (see lease.Drain), while the
// renewal goes on. It reports whether it kept the lock; when it did not,
// the lock is released (or was not held) and lease.Release then only
// stops the renewal. An error leaves everything to Release.
func (s *lease) passOn(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.l.cfg.ReleaseTimeout)
	defer cancel()
	s.handingOff.Store(true)
	keys := append([]string{s.l.lockKey(s.key)}, s.l.seq.withBacklog(s.l.seq.SeqKey(s.key))...)
	args := []any{s.owner, s.l.channel, s.Turn().Pos, "1", "", "1"}
	var res []any
	var err error
	if step := s.commitStep(); step != nil {
		// The step rides in the release script's round trip.
		pipe := s.l.rdb.Pipeline()
		cmd := releaseScript.EvalSha(ctx, pipe, keys, args...)
		h := s.Handoff()
		step(ctx, pipe, h)
		_, _ = pipe.Exec(ctx) // each command's error is read from it
		res, err = cmd.Slice()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = releaseScript.Run(ctx, s.l.rdb, keys, args...).Slice()
		}
	} else {
		res, err = releaseScript.Run(ctx, s.l.rdb, keys, args...).Slice()
	}
	if err != nil {
		s.handingOff.Store(false)
		return false, fmt.Errorf("pass %s on: %w", s.key, err)
	}
	n, _ := res[0].(int64)
	wake := ""
	if len(res) > 1 {
		wake, _ = res[1].(string)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished = true // the script passed the turn on in every case
	switch {
	case n == 2 && keptTurn(wake).Pos > 0:
		s.kept = keptTurn(wake)
		s.handingOff.Store(false)
		return true, nil
	case n != 1:
		// Not held any more (0: the lease ended first), or kept with a
		// reply that names no position: Release runs the script again,
		// which releases a lock still ours and reports errNotHeld
		// otherwise, so that a late end is logged as without a drain.
		s.handingOff.Store(false)
		return false, nil
	}
	s.byStore, s.wake = true, wake
	return false, nil
}

// Release stops the renewal (waiting for its goroutine), cancels the kept
// context, and deletes the lock if this lease still holds it, waking the
// waiters. For a lease in its turn (ModeTurn) it also passes the turn on
// when the lease was finished (lease.Finish), even if the lock was lost
// meanwhile (the work is done either way), and otherwise records
// lease.RetryAt for the waiters behind it. It runs on a context that
// survives ctx's cancellation, bounded by lockConfig.ReleaseTimeout, so a
// cancelled task still releases its lock. It costs one round trip.
//
// It returns errNotHeld when the lock was no longer held by this lease (it
// expired, was taken over, or was already released); nothing of the lock is
// deleted then. After Handoff.Released it only stops the renewal and
// returns nil. Other errors are Redis errors; the lock then expires with its
// lease, and a finished turn stays next until its holder's work is found
// done (see [Sequencer.Skip]).
func (s *lease) Release(ctx context.Context) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return fmt.Errorf("release %s: %w", s.key, errNotHeld)
	}
	s.released = true
	stop, done, cancel, byStore := s.stop, s.done, s.cancel, s.byStore
	finished, retryAt, halt := s.finished, s.retryAt, s.halt
	s.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
		defer cancel(errReleased)
	}
	if byStore {
		return nil
	}

	ctx, cancelTimeout := context.WithTimeout(context.WithoutCancel(ctx), s.l.cfg.ReleaseTimeout)
	defer cancelTimeout()
	keys := []string{s.l.lockKey(s.key)}
	args := []any{s.owner, s.l.channel}
	if s.mode == ModeTurn {
		adv, at := "0", ""
		if finished {
			adv = "1"
		} else if !retryAt.IsZero() {
			at = strconv.FormatInt(retryAt.UnixMilli(), 10)
		}
		keys = append(keys, s.l.seq.withBacklog(s.l.seq.SeqKey(s.key))...)
		args = append(args, s.turn.Pos, adv, at)
		if halt != "" && !finished {
			args = append(args, "", halt, s.turn.Label)
		}
	}
	res, err := releaseScript.Run(ctx, s.l.rdb, keys, args...).Slice()
	if err != nil {
		if s.mode == ModeTurn && finished && unknownOutcome(err) {
			// It may have run, its reply lost: try again until Redis
			// answers, and call the next holder back then.
			s.l.redoLater(redo{key: s.key, owner: s.owner, pos: s.turn.Pos, until: time.Now().Add(redoFor * s.l.cfg.TTL)})
		}
		return fmt.Errorf("release %s: %w", s.key, err)
	}
	n, _ := res[0].(int64)
	wake := ""
	if len(res) > 1 {
		wake, _ = res[1].(string)
	}
	if n == 0 && wake == "" && s.mode == ModeTurn && finished {
		// Not held, and nobody to call back: a commit that passed the
		// turn on (a store's script, an earlier try of this release) may
		// have run with its reply lost, calling the next holder back to
		// nobody. Call it back now if it waits for that.
		if wake, err = s.l.rewake(ctx, s.key, s.turn.Pos); err != nil {
			s.l.log.Info("could not call the next holder back after a release found its lock gone", slog.String("key", s.key), errAttr(err))
		}
	}
	s.mu.Lock()
	s.wake = wake
	s.mu.Unlock()
	if n == 0 {
		return fmt.Errorf("release %s: %w", s.key, errNotHeld)
	}
	return nil
}
