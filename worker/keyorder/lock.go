package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/notice"
	"github.com/orderworker/orderworker/internal/tracing"
)

// Errors returned by the package. Match them with errors.Is.
var (
	// ErrBusy is matched by the [*BusyError] that Acquire returns when the
	// key was still held at the wait deadline.
	ErrBusy = errors.New("keyorder: key is held")
	// errNotHeld is returned by Release when the lock is no longer held by
	// the lease (it expired and may have been taken by someone else, or it
	// was already released). Nothing is deleted then.
	errNotHeld = errors.New("keyorder: not held")
	// ErrLost is the cause of a kept lease's context cancellation when a
	// renewal found the lock gone or taken, or when renewals kept failing
	// until the lease may have expired.
	ErrLost = errors.New("keyorder: lease lost")
	// ErrInvalidKey is returned for an empty or too long key, or one with a
	// brace (braces would break the Redis Cluster hash tag).
	ErrInvalidKey = errors.New("keyorder: invalid key")
	// errClosed is returned by Acquire after the locker was closed.
	errClosed = errors.New("keyorder: locker closed")
)

// DefaultPrefix is the default of SeqConfig.Prefix: neutral, the engine's
// name and no program's. Programs that share a Redis give each key space
// a prefix of its own.
const DefaultPrefix = "keyorder:"

// BusyError reports that a key was still held when the wait deadline came.
// errors.Is(err, ErrBusy) is true for it.
type BusyError struct {
	Key    string        // the key asked for
	Holder string        // the holder's meta, as given to Acquire
	TTL    time.Duration // the holder's remaining lease when last seen
	Waited time.Duration // how long Acquire waited
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("keyorder: %s held by %q (lease %v left) after waiting %v",
		e.Key, e.Holder, e.TTL.Round(time.Millisecond), e.Waited.Round(time.Millisecond))
}

// Is reports whether target is ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// MaxKeyLen and MaxMetaLen bound a key and a holder's meta, in bytes.
const (
	MaxKeyLen  = 256
	MaxMetaLen = 256
)

// Wait is a waiting policy for locker.Acquire. A zero field means the
// locker's default (lockConfig.Wait), and a zero lockConfig.Wait field means the
// package default.
type Wait struct {
	// MinDelay is the shortest random delay between two attempts.
	// Defaults to 50ms.
	MinDelay time.Duration
	// MaxDelay is the longest random delay between two attempts; a waiter
	// whose release notice was lost acquires at most this late.
	// Defaults to 500ms.
	MaxDelay time.Duration
	// Deadline is how long Acquire waits in all before it returns ErrBusy
	// (or AcquireTurn ErrNotYourTurn). Defaults to 5s.
	Deadline time.Duration
	// StuckAfter makes AcquireTurn stop waiting, with a [*TurnError], as
	// soon as the head position (the one whose turn it is) was reserved
	// more than StuckAfter ago, so that the caller can check whether the
	// head's holder will ever come (and [Sequencer.Skip] it if not).
	// Defaults to 0: wait to the deadline.
	StuckAfter time.Duration
}

// or returns w with each zero field taken from d: how a Wait's zero fields
// mean a default.
func (w Wait) or(d Wait) Wait {
	return Wait{
		MinDelay:   cmp.Or(w.MinDelay, d.MinDelay),
		MaxDelay:   cmp.Or(w.MaxDelay, d.MaxDelay),
		Deadline:   cmp.Or(w.Deadline, d.Deadline),
		StuckAfter: cmp.Or(w.StuckAfter, d.StuckAfter),
	}
}

// Validate returns an error for a negative field or a MinDelay above
// MaxDelay.
func (w Wait) validate() error {
	switch {
	case w.MinDelay < 0 || w.MaxDelay < 0 || w.Deadline < 0 || w.StuckAfter < 0:
		return fmt.Errorf("keyorder: negative wait %+v", w)
	case w.MinDelay > w.MaxDelay:
		return fmt.Errorf("keyorder: wait min delay %v above max delay %v", w.MinDelay, w.MaxDelay)
	}
	return nil
}

// DefaultWait is the package's default waiting policy, and the one home of
// these numbers: the worker's kinds take their waits from it (see
// worker.Kinds).
var DefaultWait = Wait{MinDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond, Deadline: 5 * time.Second}

// DefaultTTL is the default of lockConfig.TTL.
const DefaultTTL = 30 * time.Second

// lockConfig tunes a locker. The zero value is valid and means all defaults.
// The key space (the keys' prefix, the notice channel, the sequences'
// retention) is the [Sequencer]'s the locker is built on.
type lockConfig struct {
	// TTL is the lease: how long a lock outlives a holder that died without
	// releasing it. A kept lease renews every TTL/3. Defaults to 30s.
	TTL time.Duration
	// Wait is the default waiting policy of Acquire. Defaults to
	// DefaultWait, field by field.
	Wait Wait
	// FenceRetention is how long the newest fencing token of a key is kept
	// after its last acquire. Within it, tokens increase even if the Redis
	// clock steps back; past it, Redis TIME alone keeps them increasing.
	// Defaults to 24h.
	FenceRetention time.Duration
	// ReleaseTimeout bounds a release, which runs on a context that
	// survives the caller's cancellation. Defaults to 5s.
	ReleaseTimeout time.Duration
	// Logger receives renewal problems and release failures of Do.
	// Defaults to a no-op logger.
	Logger *slog.Logger
	// OnWait, when set, is called once per Acquire that finds the key held
	// (or, for AcquireTurn, not yet its turn) and starts waiting, with the
	// key, the waiter's meta and the holder's (for a turn, the head's
	// label). It runs on the waiter's goroutine and must not block.
	// Defaults to nil.
	OnWait func(key, meta, holder string)
	// Jitter returns a random duration in [lo, hi]. Tests can make it
	// deterministic. Defaults to a uniform pick from math/rand/v2.
	Jitter func(lo, hi time.Duration) time.Duration
	// WaitReplicas is how many replicas of the key's master must have the
	// key's state before a lease's write to its store goes out
	// (lease.WriteCaughtUp): its lock and fence, its positions (their
	// offset after a catch-up), and, where the queue shares the master,
	// the task. A failover then cannot hand out again a fence or a
	// position that a store has seen, and a task that only the old master
	// had (a change whose acceptance a replica never confirmed) is not
	// applied from it. A write not confirmed is not sent: it returns an
	// error matching [ErrNotReplicated], which is no failure. It must not
	// exceed the replicas each master has, or no write goes out. It costs
	// one round trip and the replicas' acknowledgement per write. Defaults
	// to 0: no wait.
	WaitReplicas int
	// WaitTimeout bounds each WAIT of WaitReplicas; keep it below the Redis
	// client's read timeout (3 s by default). Defaults to
	// DefaultWaitTimeout (1 s).
	WaitTimeout time.Duration
}

// locker hands out leases on keys. It is safe for concurrent use. It owns
// one pub/sub subscription, started by the first Acquire and stopped by
// Close; the Redis client stays the caller's to close.
type locker struct {
	rdb     redis.UniversalClient
	cfg     lockConfig
	channel string
	log     *slog.Logger

	seq     *Sequencer
	notices *notice.Channel // the release notices, fanned out to the waiters
	closed  atomic.Bool

	// The releases whose outcome is unknown, tried again (redo.go), and
	// the call back of the parked holders they find (set by the Turns
	// built on the locker).
	redoMu      sync.Mutex
	redos       []redo
	redoRunning bool
	redoStopped bool
	redoStop    chan struct{}
	redoWG      sync.WaitGroup
	// The turns ended lately, ended again after Redis was unreachable
	// (reassert.go), and whether their probing goroutine runs; under
	// redoMu, stopped with the redos.
	endedTurns []endedTurn
	stuckTasks []stuckTask
	probing    bool
	onWake     atomic.Pointer[func(ctx context.Context, key string, labels []string)]
}

// newLocker returns a locker of seq's keys, on seq's Redis: lockers that should
// exclude each other, and the Clients whose positions AcquireTurn honours,
// are built on Sequencers of the same SeqConfig.Prefix. It returns an
// error when seq is nil or cfg is invalid.
func newLocker(seq *Sequencer, cfg lockConfig) (*locker, error) {
	if !seq.valid() {
		return nil, errors.New("keyorder: a locker needs a Sequencer from NewSequencer")
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultTTL)
	cfg.Wait = cfg.Wait.or(DefaultWait)
	cfg.FenceRetention = cmp.Or(cfg.FenceRetention, 24*time.Hour)
	cfg.ReleaseTimeout = cmp.Or(cfg.ReleaseTimeout, 5*time.Second)
	cfg.WaitTimeout = cmp.Or(cfg.WaitTimeout, DefaultWaitTimeout)
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	if cfg.Jitter == nil {
		cfg.Jitter = uniform
	}
	switch {
	case cfg.TTL < 3*time.Millisecond:
		return nil, fmt.Errorf("keyorder: TTL %v too short", cfg.TTL)
	case cfg.FenceRetention < cfg.TTL:
		return nil, fmt.Errorf("keyorder: fence retention %v shorter than TTL %v", cfg.FenceRetention, cfg.TTL)
	case cfg.ReleaseTimeout < 0:
		return nil, fmt.Errorf("keyorder: negative release timeout %v", cfg.ReleaseTimeout)
	case cfg.WaitReplicas < 0:
		return nil, fmt.Errorf("keyorder: negative WaitReplicas %d", cfg.WaitReplicas)
	case cfg.WaitTimeout < time.Millisecond:
		return nil, fmt.Errorf("keyorder: WaitTimeout %v below a millisecond", cfg.WaitTimeout)
	}
	if err := cfg.Wait.validate(); err != nil {
		return nil, err
	}
	return &locker{
		rdb:      seq.rdb,
		cfg:      cfg,
		channel:  seq.channel,
		log:      cfg.Logger,
		seq:      seq,
		notices:  notice.New(seq.rdb, seq.channel, notice.Config{}),
		redoStop: make(chan struct{}),
	}, nil
}

func uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo+1)
}

// TTL returns the lease length of this locker's locks.
func (l *locker) TTL() time.Duration { return l.cfg.TTL }

// Sequencer returns the Sequencer the locker was built on.
func (l *locker) Sequencer() *Sequencer { return l.seq }

// lockKey and fenceKey build the two keys of a lock; both carry the hash tag
// {key}.
func (l *locker) lockKey(key string) string  { return l.seq.lockKey(key) }
func (l *locker) fenceKey(key string) string { return l.seq.lockKey(key) + ":fence" }

// checkKey refuses a key the engine cannot carry: empty, longer than
// MaxKeyLen, with braces (the hash tag), or with what is not printable
// UTF-8 without spaces (the release notices and the wake lists are split
// at spaces and newlines).
func checkKey(key, meta string) error {
	switch {
	case key == "" || len(key) > MaxKeyLen || strings.ContainsAny(key, "{}") || !printable(key):
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	case len(meta) > MaxMetaLen:
		return fmt.Errorf("keyorder: meta of %d bytes, at most %d", len(meta), MaxMetaLen)
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters
// (unicode.Cc and Cf) or spaces.
func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
	})
}

// maxReasonLen bounds the reason of a hold or a skip, and the name of who
// holds, in bytes.
const maxReasonLen = 1024

// checkReason refuses a reason (or a principal) longer than maxReasonLen
// or with control or format characters: it is stored in the key's
// sequence, and shown to people.
func checkReason(what, s string) error {
	if len(s) > maxReasonLen || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
	}) {
		return fmt.Errorf("keyorder: %s must be UTF-8 of at most %d bytes without control or format characters", what, maxReasonLen)
	}
	return nil
}

// Turn is a position in a key's sequence, whose turn a run takes (see
// [Report].Prev). The zero Turn means no position: the lock alone.
type Turn struct {
	// Pos is the position, as [Sequencer.Reserve] handed it out.
	Pos int64
	// Label is the label it was reserved under; a run refuses a position
	// reserved under another label ([ErrBadPosition]).
	Label string
}

// Mode says how a run's lock was granted ([Run].Mode).
type Mode string

// The modes of a run's lock.
const (
	// ModeFree is a lock taken without a position (a task enqueued
	// without the engine's Client).
	ModeFree Mode = "free"
	// ModeTurn is a lock taken in its position's turn; the run's end
	// passes the turn on.
	ModeTurn Mode = "turn"
	// ModePassed is a lock whose position was already finished (or whose
	// sequence is gone): it was granted at once, like ModeFree, and the
	// run's end moves nothing.
	ModePassed Mode = "passed"
)

// attempt is what one acquire script run found.
type attempt struct {
	lease *lease
	// held: the lock is held by someone else.
	heldTTL time.Duration
	holder  string
	held    bool
	notTurn *TurnError // not the position's turn
	badPos  string     // the position is not the caller's
}

// try makes one attempt; park asks to be marked parked when it is not the
// position's turn.
func (l *locker) try(ctx context.Context, key, meta string, turn Turn, park bool) (attempt, error) {
	owner := uuid.NewString()
	keys := []string{l.lockKey(key), l.fenceKey(key)}
	args := []any{owner, l.cfg.TTL.Milliseconds(), meta, l.cfg.FenceRetention.Milliseconds()}
	if turn.Pos > 0 {
		parkArg := "0"
		if park {
			parkArg = "1"
		}
		keys = append(keys, l.seq.SeqKey(key))
		args = append(args, turn.Pos, turn.Label, l.seq.retention.Milliseconds(), parkArg)
	}
	res, err := acquireScript.Run(ctx, l.rdb, keys, args...).Slice()
	if err != nil {
		return attempt{}, fmt.Errorf("acquire %s: %w", key, err)
	}
	code, _ := res[0].(int64)
	switch {
	case code == 1 && len(res) == 4:
		fence, err := parseFence(res[1])
		if err != nil {
			return attempt{}, fmt.Errorf("acquire %s: %w", key, err)
		}
		mode, _ := res[2].(string)
		os, _ := res[3].(string)
		offset, err := strconv.ParseInt(os, 10, 64)
		if err != nil || offset < 0 {
			return attempt{}, fmt.Errorf("acquire %s: bad position offset %q", key, os)
		}
		lease := &lease{l: l, key: key, owner: owner, meta: meta, turn: turn, mode: Mode(mode), offset: offset}
		lease.fence.Store(fence)
		if mode == "gone" {
			lease.mode, lease.seqGone = ModePassed, true
		}
		return attempt{lease: lease}, nil
	case code == 0 && len(res) == 3:
		a := attempt{held: true}
		if ms, ok := res[1].(int64); ok && ms > 0 {
			a.heldTTL = time.Duration(ms) * time.Millisecond
		}
		a.holder, _ = res[2].(string)
		return a, nil
	case code == 2 && len(res) == 6:
		return attempt{notTurn: turnError(key, turn.Pos, res)}, nil
	case code == 4 && len(res) == 3:
		h, _ := res[1].(string)
		pause, err := parsePause(h)
		if err != nil {
			return attempt{}, fmt.Errorf("acquire %s: %w", key, err)
		}
		rec, _ := res[2].(string)
		label, _ := splitRecord(rec)
		return attempt{notTurn: &TurnError{Key: key, Pos: turn.Pos, Head: turn.Pos, Label: label, Record: rec,
			Paused: &pause, Parked: true}}, nil
	case code == 3 && len(res) == 2:
		why, _ := res[1].(string)
		return attempt{badPos: why}, nil
	}
	return attempt{}, fmt.Errorf("acquire %s: unexpected reply %v", key, res)
}

// turnError reads {2, head, record, retry at, now, parked}.
func turnError(key string, pos int64, res []any) *TurnError {
	str := func(v any) string { s, _ := v.(string); return s }
	e := &TurnError{Key: key, Pos: pos}
	e.Head, _ = strconv.ParseInt(str(res[1]), 10, 64)
	now, _ := strconv.ParseInt(str(res[4]), 10, 64)
	label, reserved := splitRecord(str(res[2]))
	e.Label = label
	if !reserved.IsZero() {
		e.Age = max(0, time.Duration(now-reserved.UnixMilli())*time.Millisecond)
	}
	if r, err := strconv.ParseInt(str(res[3]), 10, 64); err == nil && r > now {
		e.Retry = time.Duration(r-now) * time.Millisecond
	}
	e.Record = str(res[2])
	e.Parked = res[5] == int64(1)
	return e
}

func parseFence(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("fence of type %T", v)
	}
	f, err := strconv.ParseInt(s, 10, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("bad fence %q", s)
	}
	return f, nil
}

// TryAcquire makes one attempt to take the lock of key. When the key is held
// it returns a [*BusyError] at once (Waited is zero). meta describes the
// holder to waiters and in logs (at most MaxMetaLen bytes). It costs one
// Redis round trip.
func (l *locker) TryAcquire(ctx context.Context, key, meta string) (*lease, error) {
	if err := checkKey(key, meta); err != nil {
		return nil, err
	}
	a, err := l.try(ctx, key, meta, Turn{}, false)
	if err != nil {
		return nil, err
	}
	if a.lease == nil {
		return nil, &BusyError{Key: key, Holder: a.holder, TTL: a.heldTTL}
	}
	a.lease.stats.Attempts = 1
	return a.lease, nil
}

// Acquire takes the lock of key, waiting by policy w (zero fields mean the
// locker's defaults) while someone else holds it. meta describes the holder
// to waiters and in logs, e.g. "order:exchange <task id>".
//
// It returns a [*BusyError] (errors.Is ErrBusy) when the key is still held at
// the deadline, the context's cause when ctx ends first, errClosed after
// Close, and Redis errors wrapped with the key. An uncontended Acquire costs
// one round trip.
func (l *locker) Acquire(ctx context.Context, key, meta string, w Wait) (*lease, error) {
	return l.AcquireTurn(ctx, key, meta, Turn{}, w)
}

// AcquireTurn takes the lock of key in the turn of position turn.Pos of the
// key's sequence: once every earlier position is finished (see
// [Sequencer]). It waits by policy w, as Acquire does, both for its turn and
// for the lock; the notice of the turn before it wakes it. A zero turn is
// Acquire. A position that is already finished, or whose sequence expired,
// is granted at once, without order ([ModePassed]); see lease.Mode.
//
// The two positions right after the head (the one whose turn it is) wait
// in place. A position further back is parked at once: AcquireTurn returns
// a [*TurnError] (errors.Is ErrNotYourTurn) with Parked set, and when it
// comes within two of the head, the release that passes the turn on hands
// its label back (lease.Wake, Settlement.Wake) so that the caller brings
// its holder back. A waiter in place parks too, with a last attempt,
// when the deadline passes, when the head's holder runs again only after
// the deadline, and when the head was reserved more than w.StuckAfter ago.
// When it is the position's turn but the sequence is paused
// ([Sequencer.Pause]), it returns at once a parked [*TurnError] with
// Paused set. It also returns an error matching [ErrBadPosition] when the
// position is not the caller's. An uncontended AcquireTurn in turn costs one round trip.
func (l *locker) AcquireTurn(ctx context.Context, key, meta string, turn Turn, w Wait) (*lease, error) {
	if err := checkKey(key, meta); err != nil {
		return nil, err
	}
	if turn.Pos < 0 || (turn.Pos > 0 && (turn.Label == "" || len(turn.Label) > maxLabelLen)) {
		return nil, fmt.Errorf("%w: position %d with a label of %d bytes", ErrBadPosition, turn.Pos, len(turn.Label))
	}
	w = w.or(l.cfg.Wait)
	if err := w.validate(); err != nil {
		return nil, err
	}
	wake, err := l.register(ctx, key, turn.Pos)
	if err != nil {
		return nil, err
	}
	defer wake.Stop()
	start := time.Now()
	deadline := start.Add(w.Deadline)

	var st leaseStats
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	park := false  // the next attempt parks the position if not its turn
	lastWait := "" // what the caller's span was last told it waits for
	for {
		st.Attempts++
		a, err := l.try(ctx, key, meta, turn, park)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("acquire %s: %w", key, context.Cause(ctx))
			}
			return nil, err
		}
		switch {
		case a.lease != nil:
			st.Waited = time.Since(start)
			a.lease.stats = st
			return a.lease, nil
		case a.badPos != "":
			return nil, fmt.Errorf("acquire %s: %w: %s", key, ErrBadPosition, a.badPos)
		}
		if st.Attempts == 1 && l.cfg.OnWait != nil {
			holder := a.holder
			if a.notTurn != nil {
				holder = a.notTurn.Label
			}
			l.cfg.OnWait(key, meta, holder)
		}
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			lastWait = traceWait(span, a, lastWait)
		}
		left := time.Until(deadline)
		if t := a.notTurn; t != nil {
			if t.Parked {
				t.Waited = time.Since(start)
				return nil, t
			}
			if left <= 0 || t.Retry > left || (w.StuckAfter > 0 && t.Age > w.StuckAfter) {
				park = true // give up: once more, parking this time
				continue
			}
			st.TurnWaits++
		} else if left <= 0 {
			return nil, &BusyError{Key: key, Holder: a.holder, TTL: a.heldTTL, Waited: time.Since(start)}
		}
		d := l.cfg.Jitter(w.MinDelay, w.MaxDelay)
		if a.held && a.heldTTL > 0 && a.heldTTL < d {
			d = a.heldTTL + time.Millisecond // the lease ends before our delay would
		}
		d = min(d, left)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-wake.C:
			st.WokenByNotice++
		case <-timer.C:
			st.WokenByDelay++
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire %s: %w", key, context.Cause(ctx))
		}
	}
}

// traceWait adds an event to span when an attempt finds the key held by
// another holder than last (a label of the position it waits behind, or
// the holder of the lock), and returns what it waits for now: a waiter
// whose head moves on (its predecessor done, the next one not) shows each
// change it waited behind.
func traceWait(span trace.Span, a attempt, last string) string {
	if t := a.notTurn; t != nil {
		if t.Label == last || t.Paused != nil {
			return t.Label
		}
		span.AddEvent(tracing.EventWaiting, trace.WithAttributes(
			tracing.AttrHeadSeq.Int64(t.Head),
			tracing.AttrHead.String(t.Label),
			tracing.AttrSeq.Int64(t.Pos)))
		return t.Label
	}
	if a.holder == last {
		return last
	}
	span.AddEvent(tracing.EventBusy, trace.WithAttributes(
		tracing.AttrHolder.String(a.holder),
		tracing.AttrLeaseLeft.Int64(a.heldTTL.Milliseconds())))
	return a.holder
}

// register adds a local waiter for the notices of key (and position pos,
// when not 0): a notice "<lock key>" wakes it, and "<lock key> <next
// position>" wakes it when it has no position or when its position is that
// one or an earlier one (already passed). It then waits briefly for the
// shared subscription to be confirmed, so that no notice sent after its
// first look is missed; if Redis does not confirm in time the waiter goes
// on without notices, which only costs the random delays. Starting the
// subscription does no I/O here: a stalled Redis stalls no Acquire.
func (l *locker) register(ctx context.Context, key string, pos int64) (*notice.Waiter, error) {
	if l.closed.Load() {
		return nil, errClosed
	}
	w := l.notices.Wait(l.lockKey(key), func(next string) bool {
		n, err := strconv.ParseInt(next, 10, 64)
		return err == nil && pos <= n
	})
	if err := w.Ready(ctx, time.Second); err != nil {
		w.Stop()
		return nil, fmt.Errorf("acquire %s: %w", key, err)
	}
	return w, nil
}

// CheckNotices makes sure that the Redis user may publish and subscribe to
// the notice channel. When it may not, waiters cannot be woken by notices:
// CheckNotices then turns the subscription off for this locker (waiters
// poll with their random delays, which is slower but correct) and returns
// an error matching [ErrNoNotices] that names the channel the user's ACL
// needs (for example `&keyorder:released`). Call it before the first
// Acquire; later calls only report.
func (l *locker) CheckNotices(ctx context.Context) error {
	if err := l.notices.Check(ctx); err != nil {
		return fmt.Errorf("keyorder: %w", err)
	}
	return nil
}

// ErrNoNotices is matched by CheckNotices' error when the Redis user may not
// use the notice channel. It is notice.ErrNoPermission.
var ErrNoNotices = notice.ErrNoPermission

// Close stops the shared subscription and the retries of releases whose
// outcome is unknown, and waits for their goroutines. Leases already handed
// out stay valid and can still be released. Close is safe to call more
// than once; Acquire after Close returns errClosed.
func (l *locker) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.stopRedo()
	if err := l.notices.Close(); err != nil {
		return fmt.Errorf("keyorder: %w", err)
	}
	return nil
}

// release releases lease after its holder's work (Turns.Pass), logging
// what goes wrong. ok says whether
// the work ended without an error.
func (l *locker) release(ctx context.Context, lease *lease, ok bool) {
	switch rerr := lease.Release(ctx); {
	case rerr == nil:
	case errors.Is(rerr, errNotHeld) && ok:
		// The work finished, but the lease had ended first (a stall past
		// the TTL): only the fence kept a newer holder safe.
		tracing.Slog(ctx, l.log).Warn("lease ended before the work did", slog.String("key", lease.key), slog.Int64("fence", lease.Fence()))
	case !errors.Is(rerr, errNotHeld):
		tracing.Slog(ctx, l.log).Warn("release failed; the lock expires with its lease",
			slog.String("key", lease.key), slog.Int64("fence", lease.Fence()), errAttr(rerr))
	}
}
