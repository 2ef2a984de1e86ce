package keyorder

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A key's sequence orders the acquisitions of its lock. [Sequencer.Reserve]
// hands out positions (1, 2, 3, … above a starting point), and
// A run takes the turn of a position only once every position before it
// is finished: its holder's work was done, or the position was voided (an
// enqueue refused), skipped ([Sequencer.Skip], [Runner.Skip]) or finished
// without a hold (a creation, [Runner.Created]). A waiter is woken by the notice of the position
// before it, and only that waiter is.
//
// The sequence knows nothing of what a position stands for: each is
// reserved under a label (for orderworker "m <event ID>" and the like),
// which AcquireTurn checks, and which a caller that finds a position stuck
// reads to decide whether its holder will ever come (see [TurnError]).

// The defaults of [SeqConfig].
const (
	// DefaultSeqRetention is the default of SeqConfig.Retention.
	DefaultSeqRetention = 7 * 24 * time.Hour
	// DefaultStatusPage is the default of SeqConfig.StatusPage.
	DefaultStatusPage = 20
)

// MaxStatusPage bounds SeqConfig.StatusPage: [Sequencer.Status] reads the
// fields of at most this many positions.
const MaxStatusPage = 1000

// maxLabelLen bounds a position's label, in bytes.
const maxLabelLen = 256

// ErrNotYourTurn is matched by the [*TurnError] that AcquireTurn returns
// when the position was not yet next at the wait deadline, or when the head
// position looks stuck.
var ErrNotYourTurn = errors.New("keyorder: not this position's turn")

// ErrBadPosition is returned by AcquireTurn for a position that is not the
// caller's: never handed out, voided, or reserved under another label.
// Waiting cannot help.
var ErrBadPosition = errors.New("keyorder: not the caller's position")

// ErrFull is returned by a reservation refused because the sequence
// already has [SeqConfig.MaxWaiting] positions waiting (handed out and not
// finished); a *FullError carries the numbers.
var ErrFull = errors.New("keyorder: too many positions waiting")

// FullError is a reservation refused by [SeqConfig.MaxWaiting]. It matches
// [ErrFull] with errors.Is.
type FullError struct {
	Key string
	// Waiting is how many positions wait (the head included), Max the cap.
	Waiting, Max int64
}

func (e *FullError) Error() string {
	return fmt.Sprintf("keyorder: %s has %d positions waiting, the most allowed (%d)", e.Key, e.Waiting, e.Max)
}

// Is reports whether target is ErrFull.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// TurnError reports that a position was not yet next. It matches
// [ErrNotYourTurn] with errors.Is.
type TurnError struct {
	Key    string        // the lock key
	Pos    int64         // the position asked for
	Head   int64         // the position whose turn it is
	Label  string        // the head's label; "" when the head's record is missing
	Age    time.Duration // how long ago the head was reserved (Redis clock)
	Retry  time.Duration // when the head's holder runs again after a failure, from now; 0 when unknown
	Waited time.Duration // how long AcquireTurn waited
	// Record is the head's p: field as read, for [Sequencer.Skip].
	Record string
	// Paused, when not nil, says it is the position's turn (Head is Pos)
	// but the sequence is paused by an operator ([Sequencer.Pause]): the
	// position is marked parked, and [Sequencer.Resume] hands its label
	// back.
	Paused *Pause
	// Parked says the position is marked parked: whoever passes the turn
	// to it gets its label back (lease.Wake, Settlement.Wake) and must
	// bring its holder back. When Parked is false the position is marked
	// as waiting in place, which only a waiter that goes on waiting should
	// leave behind.
	Parked bool
}

func (e *TurnError) Error() string {
	if p := e.Paused; p != nil {
		return fmt.Sprintf("keyorder: %s position %d is next, but the sequence is on hold since %s by %s: %s",
			e.Key, e.Pos, p.At.Format(time.RFC3339), p.By, p.Reason)
	}
	s := fmt.Sprintf("keyorder: %s position %d waits for position %d (%q, reserved %v ago)",
		e.Key, e.Pos, e.Head, e.Label, e.Age.Round(time.Millisecond))
	if e.Retry > 0 {
		s += fmt.Sprintf(", which runs again in %v", e.Retry.Round(time.Millisecond))
	}
	return s + fmt.Sprintf(" after waiting %v", e.Waited.Round(time.Millisecond))
}

// Is reports whether target is ErrNotYourTurn.
func (e *TurnError) Is(target error) bool { return target == ErrNotYourTurn }

// SeqConfig tunes a [Sequencer]: the key space of the Clients, lockers and
// Runners built on it. The zero value is valid and means all defaults.
type SeqConfig struct {
	// Prefix starts every Redis key of the key space (the sequences, the
	// locks, their fences, the index of holds) and its notice channel
	// (Prefix+"released"). Programs that enqueue and run the same tasks
	// must use the same one: a Runner whose prefix is not its Clients'
	// finds no sequence, and runs every task unordered (and logs a
	// warning for each). Give each program's
	// key space its own, so that two programs on one Redis do not share
	// sequences and locks by chance. It must not contain a brace.
	// Defaults to DefaultPrefix ("keyorder:").
	Prefix string
	// Retention is how long a sequence outlives the last position handed
	// out (or settled without its turn: voided, skipped, finished ahead).
	// A turn that ends does not renew it, which saves a command per task:
	// the positions still waiting were all handed out within it. A
	// sequence that expired starts again above every earlier position; a
	// holder of a position of the expired sequence is then admitted at
	// once, unordered, and a store that keeps the newest position
	// applied still refuses it if a later task was applied. Keep it above the longest time a position may wait for
	// its holder (retries and scheduled tasks). Defaults to 7 days.
	Retention time.Duration
	// MaxWaiting caps the positions of one sequence waiting at once
	// (handed out and not yet finished, the head included): a reservation
	// past it (a [Client.Enqueue]) is refused with a *FullError and writes
	// nothing, atomically with the count, so that racing reservations never
	// pass it together. 0 means no cap.
	// Defaults to 0.
	MaxWaiting int64
	// StatusPage is how many of the positions after the cursor
	// [Sequencer.Status] reads (Status.Pending); Status.Waiting counts
	// them all. 1 to MaxStatusPage. Defaults to 20.
	StatusPage int
}

// Sequencer is a key space: the per-key sequences under one prefix, on one
// Redis, with their retention and their cap. It is the one owner of the
// sequences: the [Client] that reserves positions at acceptance, the
// locker whose scripts (and a store's commit, through [Commit]) pass a
// turn on and hand the lock off, the turns and the [Runner] are all
// built on one, and take their prefix, notice channel, retention and cap
// from it, so that they cannot disagree. Build one per key space and
// share it; a producer and a worker in two processes each build theirs
// from the same SeqConfig.
//
// It also reads and settles positions directly (Status, Void, Skip,
// Finish, Pause). It is safe for concurrent use, holds no connection of
// its own and starts no goroutine; the Redis client stays the caller's.
type Sequencer struct {
	rdb        redis.UniversalClient
	prefix     string
	channel    string
	retention  time.Duration
	maxWaiting int64
	statusPage int
	counted    bool // the key space keeps the index of backlogs (not on a Cluster)
}

// NewSequencer returns a Sequencer on rdb. It returns an error when rdb is
// nil or cfg is invalid.
func NewSequencer(rdb redis.UniversalClient, cfg SeqConfig) (*Sequencer, error) {
	if rdb == nil {
		return nil, errors.New("keyorder: nil redis client")
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, DefaultPrefix)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultSeqRetention)
	cfg.StatusPage = cmp.Or(cfg.StatusPage, DefaultStatusPage)
	switch {
	case strings.ContainsAny(cfg.Prefix, "{}"):
		return nil, fmt.Errorf("keyorder: prefix %q has a brace", cfg.Prefix)
	case cfg.Retention < time.Second:
		return nil, fmt.Errorf("keyorder: sequence retention %v is under 1s", cfg.Retention)
	case cfg.MaxWaiting < 0:
		return nil, fmt.Errorf("keyorder: MaxWaiting %d is negative", cfg.MaxWaiting)
	case cfg.StatusPage < 1 || cfg.StatusPage > MaxStatusPage:
		return nil, fmt.Errorf("keyorder: StatusPage %d, want 1 to %d", cfg.StatusPage, MaxStatusPage)
	}
	_, cluster := rdb.(*redis.ClusterClient)
	_, ring := rdb.(*redis.Ring)
	return &Sequencer{rdb: rdb, prefix: cfg.Prefix, channel: cfg.Prefix + "released", retention: cfg.Retention,
		maxWaiting: cfg.MaxWaiting, statusPage: cfg.StatusPage, counted: !cluster && !ring}, nil
}

// valid reports whether q is a Sequencer from NewSequencer (not nil, and
// not a zero value).
func (q *Sequencer) valid() bool { return q != nil && q.rdb != nil }

// paged returns a copy of q whose Status reads n positions after the
// cursor.
func (q *Sequencer) paged(n int) *Sequencer {
	c := *q
	c.statusPage = n
	return &c
}

// SeqKey returns the Redis key of key's sequence. It carries the key's hash
// tag.
func (q *Sequencer) SeqKey(key string) string { return q.prefix + "{" + key + "}:seq" }

func (q *Sequencer) lockKey(key string) string { return q.prefix + "{" + key + "}" }

func checkLabel(key, label, ref string) error {
	switch {
	case checkKey(key, "") != nil:
		return checkKey(key, "")
	case label == "" || len(label) > maxLabelLen:
		return fmt.Errorf("keyorder: label of %d bytes, want 1 to %d", len(label), maxLabelLen)
	case len(ref) > maxLabelLen:
		return fmt.Errorf("keyorder: reference of %d bytes, at most %d", len(ref), maxLabelLen)
	}
	return nil
}

// reserveCmd is a reservation queued on a pipeline by
// Sequencer.reserveIn; read it after the pipeline ran.
type reserveCmd struct {
	cmd *redis.Cmd
	key string
}

// Pos returns the position handed out, or the reservation's error. An
// error that starts with NOSCRIPT means Redis did not have the script
// loaded; see Sequencer.reserveIn.
func (c *reserveCmd) Pos() (int64, error) {
	s, err := c.cmd.Text()
	if err != nil {
		if full := fullError(c.key, err); full != nil {
			return 0, full
		}
		return 0, fmt.Errorf("reserve %s: %w", c.key, err)
	}
	pos, err := strconv.ParseInt(s, 10, 64)
	if err != nil || pos <= 0 {
		return 0, fmt.Errorf("reserve %s: bad position %q", c.key, s)
	}
	return pos, nil
}

// fullError reads the FULL error reply of seq_reserve (see reserveLua):
// "FULL <waiting> <max>". It returns nil for any other error.
func fullError(key string, err error) *FullError {
	if !redis.HasErrorPrefix(err, "FULL") {
		return nil
	}
	e := &FullError{Key: key}
	if n, _ := fmt.Sscanf(strings.TrimPrefix(err.Error(), "FULL "), "%d %d", &e.Waiting, &e.Max); n != 2 {
		return nil // another error that happens to start with FULL
	}
	return e
}

// noScriptErr reports whether err says that Redis lacked a script that a
// pipelined call ran by its SHA; run Sequencer.loadScripts and the
// pipeline again.
func noScriptErr(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// loadScripts loads the scripts that reserveIn runs by SHA. A
// plain [Sequencer.Reserve] loads them by itself.
func (q *Sequencer) loadScripts(ctx context.Context) error {
	if err := reserveScript.Load(ctx, q.rdb).Err(); err != nil {
		return fmt.Errorf("keyorder: load scripts: %w", err)
	}
	return nil
}

// reserveIn queues on pipe the reservation of the next position of key's
// sequence under a label and ref already checked, by the script's SHA.
func (q *Sequencer) reserveIn(ctx context.Context, pipe redis.Pipeliner, key, label, ref string) *reserveCmd {
	cmd := reserveScript.EvalSha(ctx, pipe, q.withBacklog(q.SeqKey(key)), label, q.retention.Milliseconds(), ref, q.maxWaiting)
	return &reserveCmd{cmd: cmd, key: key}
}

// reserveArgs checks a reservation of key's sequence under label and ref,
// as Sequencer.reserveIn does, and returns what a script that calls
// seq_reserve (see reserveLua) passes it: the sequence's Redis key, to
// put among the script's KEYS, its retention in milliseconds and the cap
// of positions waiting ([SeqConfig.MaxWaiting], 0 for none). Such a script
// turns seq_reserve's FULL error into [ErrFull] with reserveError.
func (q *Sequencer) reserveArgs(key, label, ref string) (seqKey string, ttlMS, maxWaiting int64, err error) {
	if err := checkLabel(key, label, ref); err != nil {
		return "", 0, 0, err
	}
	return q.SeqKey(key), q.retention.Milliseconds(), q.maxWaiting, nil
}

// reserveError returns the *FullError that err, the error of a script
// calling seq_reserve on key's sequence, carries, or err itself.
func reserveError(key string, err error) error {
	if full := fullError(key, err); full != nil {
		return full
	}
	return err
}

// Reserve hands out the next position of key's sequence under label, as
// reserveIn does, in one round trip. Positions of one key strictly increase
// in the order the reservations reach Redis. A position reserved here has
// no task: it is a gap until the Runners skip it (tests and tools make
// gaps so); a program that accepts tasks reserves with a [Client].
func (q *Sequencer) Reserve(ctx context.Context, key, label, ref string) (int64, error) {
	if err := checkLabel(key, label, ref); err != nil {
		return 0, err
	}
	c := &reserveCmd{cmd: reserveScript.Run(ctx, q.rdb, q.withBacklog(q.SeqKey(key)), label, q.retention.Milliseconds(), ref, q.maxWaiting), key: key}
	return c.Pos()
}

// settlement is what settling a position did.
type settlement struct {
	// Done is false when the position was not in the expected state and
	// nothing changed.
	Done bool
	// Wake are the labels of the positions whose parked holders were
	// called (see lease.Wake): the caller must bring them back.
	Wake []string
}

// settle runs settleScript.
func (q *Sequencer) settle(ctx context.Context, key string, pos int64, ref, want, kind, why string) (settlement, error) {
	p := ""
	if pos > 0 {
		p = strconv.FormatInt(pos, 10)
	}
	res, err := settleScript.Run(ctx, q.rdb, append([]string{q.SeqKey(key), q.lockKey(key)}, q.backlogKeys(q.SeqKey(key))...),
		p, ref, want, kind, why, q.channel, q.retention.Milliseconds()).Slice()
	if err != nil {
		return settlement{}, fmt.Errorf("settle %s position %s: %w", key, cmp.Or(p, "ref "+ref), err)
	}
	n, _ := res[0].(int64)
	wake, _ := res[1].(string)
	return settlement{Done: n == 1, Wake: splitWake(wake)}, nil
}

// voidPos gives up position pos of key, reserved under label, because its
// holder will never come (its task was refused). The cursor passes it
// without waiting; the reason is logged. Nothing changes (Done is false)
// when the position is not pending under label.
func (q *Sequencer) voidPos(ctx context.Context, key string, pos int64, label, reason string) (settlement, error) {
	return q.settle(ctx, key, pos, "", "~"+label, "v", reason)
}

// Skip passes the head position pos of key, whose p: record is exactly
// record (as [TurnError] and [Status] report it), because its holder is
// gone. The reason is logged. It returns false, and changes nothing, when
// pos is no longer the head or its record changed: someone else settled it,
// or its holder finished.
func (q *Sequencer) Skip(ctx context.Context, key string, pos int64, record, reason string) (settlement, error) {
	return q.settle(ctx, key, pos, "", "="+record, "s", reason)
}

// finish marks position pos of key (reserved under label), or, with pos 0,
// the position reserved under ref, as finished with outcome, by a holder
// that did its work without taking the lock in turn (or could not take it
// at all). The cursor passes it when it gets there. Nothing changes (Done
// is false) when the position is not pending (under label, when given).
func (q *Sequencer) finish(ctx context.Context, key string, pos int64, label, ref, outcome string) (settlement, error) {
	want := ""
	if label != "" {
		want = "~" + label
	}
	return q.settle(ctx, key, pos, ref, want, "f", outcome)
}

// noteAt records, in the log of key's sequence (see [Status].Log), an
// outcome that the holder of position pos, reserved under label, wants kept
// after its turn (that its task was archived, say), which the
// turn's release passes on like any finished work. pos 0 notes the outcome
// of work without a position (a task enqueued without one). It moves
// nothing, keeps the sequence (and so the note) for at least the
// retention, and costs one round trip, so it is meant for rare outcomes,
// not for every turn. It does nothing, and returns nil, when the sequence
// does not exist: a note never creates one. It returns an error for a bad
// key, label or position and Redis errors, wrapped.
func (q *Sequencer) noteAt(ctx context.Context, key string, pos int64, label, outcome string) error {
	if err := checkLabel(key, label, ""); err != nil {
		return err
	}
	if pos < 0 {
		return fmt.Errorf("%w: position %d", ErrBadPosition, pos)
	}
	return q.note(ctx, key, pos, label, outcome, "note")
}

// note runs noteScript with kind.
func (q *Sequencer) note(ctx context.Context, key string, pos int64, label, outcome, kind string) error {
	if err := noteScript.Run(ctx, q.rdb, []string{q.SeqKey(key)}, pos, label, outcome, q.retention.Milliseconds(), kind).Err(); err != nil {
		return fmt.Errorf("note %s position %d: %w", key, pos, err)
	}
	return nil
}

// Record logs an operator's action on key (see [Settled], kind "action")
// in its sequence's log: what was done, by whom and why, in text. pos and
// label name the position acted on (the head), or 0 and a description of
// the action for one that acts on the whole sequence (a pause). Like Note
// it moves nothing, keeps the sequence for at least the retention, never
// creates one, and returns an error for a bad key, label or position and
// Redis errors, wrapped.
func (q *Sequencer) Record(ctx context.Context, key string, pos int64, label, text string) error {
	if err := checkLabel(key, label, ""); err != nil {
		return err
	}
	if pos < 0 {
		return fmt.Errorf("%w: position %d", ErrBadPosition, pos)
	}
	return q.note(ctx, key, pos, label, text, "action")
}

// Settled is an entry of a sequence's log: a position that was settled
// without its turn (voided, skipped or finished), or an outcome its holder
// noted after its turn.
type Settled struct {
	Pos int64 `json:"pos"`
	// At is when (Redis clock).
	At time.Time `json:"at"`
	// Kind is "void" (an enqueue refused), "skip" ([Sequencer.Skip]),
	// "finish" (a turn's work done, a creation), "note" (an outcome kept
	// after the turn) or "action" ([Sequencer.Record]).
	Kind string `json:"kind"`
	// Label is the label the position was reserved under.
	Label string `json:"label"`
	// Reason is the reason or outcome given.
	Reason string `json:"reason"`
}

// Skipped reports whether the position was given up (voided or skipped)
// rather than finished.
func (s Settled) Skipped() bool { return s.Kind == "void" || s.Kind == "skip" }

// Pending is a position after the cursor.
type Pending struct {
	Pos int64
	// Record is the position's p: field: "<ms> <label>" while its holder
	// is awaited, "v <reason>" voided, "f <outcome>" finished ahead.
	Record string
	// Label is the label of a pending record, "" otherwise.
	Label string
	// Reserved is when the position was handed out (pending records only).
	Reserved time.Time
	// RetryAt is when the holder of the head runs again after a failure,
	// when it said so.
	RetryAt time.Time
	// Waiting says a waiter for the position is marked.
	Waiting bool
}

// Status is the state of one key's sequence.
type Status struct {
	// Exists is false when the key has no sequence (never used, or
	// expired); the other fields are then zero.
	Exists bool
	// Last is the last position handed out, Done the cursor: every
	// position up to Done is finished.
	Last, Done int64
	// Waiting is how many positions are after the cursor (Last - Done):
	// handed out and not yet passed, the head included.
	Waiting int64
	// Pending are the first positions after Done, in order: those of
	// Done+1 to Done+min(Waiting, SeqConfig.StatusPage) that have a
	// record, so at most StatusPage (default 20) of them, whatever
	// Waiting is.
	Pending []Pending
	// Log holds the latest positions settled without their turn (voided,
	// skipped or finished ahead) and the latest notes, oldest first; at
	// most 20 entries.
	Log []Settled
	// TTL is how long the sequence lives without further use; negative
	// while it is paused (it does not expire then).
	TTL time.Duration
	// Paused is the sequence's pause, nil when it is not paused (see
	// [Sequencer.Pause]).
	Paused *Pause
}

// Status reads key's sequence, for operators, tests and checks: its
// counters, its log and the first SeqConfig.StatusPage positions after the
// cursor (see [Status]). It costs one round trip (two while Redis lacks
// the script) running a read-only script (EVALSHA_RO, which a user that
// may only read the sequence may run) of three commands, and its reply is
// bounded by the page: a view costs the same whatever the backlog. It is
// not for the hot path. It returns ctx's error when ctx is done, an error
// matching [ErrMalformed] for a malformed sequence, and Redis errors,
// wrapped.
func (q *Sequencer) Status(ctx context.Context, key string) (Status, error) {
	if err := ctx.Err(); err != nil {
		return Status{}, fmt.Errorf("sequence %s: %w", key, err)
	}
	res, err := statusScript.RunRO(ctx, q.rdb, []string{q.SeqKey(key)}, q.statusPage).Slice()
	if err != nil {
		return Status{}, fmt.Errorf("sequence %s: %w", key, err)
	}
	st, err := parseStatus(res, q.statusPage)
	if err != nil {
		return Status{}, fmt.Errorf("sequence %s: %w: %w", key, ErrMalformed, err)
	}
	return st, nil
}

// ErrMalformed is matched by the error of [Sequencer.Status] for a
// sequence whose hash it cannot read (written by hand, or by a version
// that wrote it otherwise).
var ErrMalformed = errors.New("keyorder: malformed sequence")

// parseStatus reads the reply of statusScript, run with page.
func parseStatus(res []any, page int) (Status, error) {
	if len(res) == 0 {
		return Status{}, errors.New("sequence: empty status reply")
	}
	ttl, _ := res[0].(int64)
	if len(res) == 1 && ttl == -2 {
		return Status{}, nil
	}
	if len(res) < 5 || (len(res)-5)%3 != 0 || (len(res)-5)/3 > page {
		return Status{}, fmt.Errorf("sequence: status reply of %d values, want 5 and 3 per position, at most %d positions", len(res), page)
	}
	st := Status{Exists: true, TTL: time.Duration(ttl)}
	if ttl >= 0 {
		st.TTL = time.Duration(ttl) * time.Millisecond
	}
	n, _ := res[1].(string)
	d, _ := res[2].(string)
	var err error
	if h, _ := res[4].(string); h != "" {
		p, err := parsePause(h)
		if err != nil {
			return Status{}, err
		}
		st.Paused = &p
	}
	if n == "" && d == "" {
		return st, nil // paused before any change was accepted
	}
	if st.Last, err = strconv.ParseInt(n, 10, 64); err != nil {
		return Status{}, fmt.Errorf("sequence: bad n %q", n)
	}
	if st.Done, err = strconv.ParseInt(d, 10, 64); err != nil {
		return Status{}, fmt.Errorf("sequence: bad d %q", d)
	}
	st.Waiting = max(st.Last-st.Done, 0)
	for i, f := 0, res[5:]; i < len(f); i += 3 {
		rec, ok := f[i].(string)
		if !ok {
			continue
		}
		pe := Pending{Pos: st.Done + 1 + int64(i/3), Record: rec}
		pe.Label, pe.Reserved = splitRecord(rec)
		if r, ok := f[i+1].(string); ok {
			if ms, err := strconv.ParseInt(r, 10, 64); err == nil {
				pe.RetryAt = time.UnixMilli(ms).UTC()
			}
		}
		_, pe.Waiting = f[i+2].(string)
		st.Pending = append(st.Pending, pe)
	}
	if log, _ := res[3].(string); log != "" {
		var raw []struct{ Pos, At, Kind, Label, Why string }
		if err := json.Unmarshal([]byte(log), &raw); err != nil {
			return Status{}, fmt.Errorf("sequence: bad log: %w", err)
		}
		for _, r := range raw {
			pos, _ := strconv.ParseInt(r.Pos, 10, 64)
			at, _ := strconv.ParseInt(r.At, 10, 64)
			st.Log = append(st.Log, Settled{Pos: pos, At: time.UnixMilli(at).UTC(), Kind: r.Kind, Label: r.Label, Reason: r.Why})
		}
	}
	return st, nil
}

// Holder is who holds a key's lock, as [Sequencer.Holder] reads it.
type Holder struct {
	// Held is false when the lock is free; the other fields are then zero.
	Held bool
	// Meta describes the holder: for a Runner's task, "<task type>
	// <task ID>".
	Meta string
	// Fence is the holder's fencing token.
	Fence int64
	// TTL is the lease left when it was read.
	TTL time.Duration
}

// Holder reads who holds key's lock, for operators: its meta, fencing token
// and lease left (never its owner token). It lives on the Sequencer, which
// holds no subscription, so that a reader of a key's sequence can read its
// lock too. It costs one round trip and returns Redis errors, wrapped.
func (q *Sequencer) Holder(ctx context.Context, key string) (Holder, error) {
	if err := checkKey(key, ""); err != nil {
		return Holder{}, err
	}
	lk := q.lockKey(key)
	var fields *redis.SliceCmd
	var ttl *redis.DurationCmd
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		fields = p.HMGet(ctx, lk, "owner", "meta", "fence")
		ttl = p.PTTL(ctx, lk)
		return nil
	}); err != nil {
		return Holder{}, fmt.Errorf("lock %s: %w", key, err)
	}
	v := fields.Val()
	if owner, _ := v[0].(string); owner == "" {
		return Holder{}, nil
	}
	h := Holder{Held: true, TTL: max(ttl.Val(), 0)}
	h.Meta, _ = v[1].(string)
	if f, _ := v[2].(string); f != "" {
		fence, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return Holder{}, fmt.Errorf("lock %s: bad fence %q", key, f)
		}
		h.Fence = fence
	}
	return h, nil
}

// splitRecord reads a pending record "<ms> <label>"; it returns "" and the
// zero time for a voided or finished one.
func splitRecord(rec string) (string, time.Time) {
	ms, label, ok := strings.Cut(rec, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return "", time.Time{}
	}
	return label, time.UnixMilli(n).UTC()
}
