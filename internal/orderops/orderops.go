// Package orderops is the one home of the operator actions on an order:
// retry now, skip, hold and resume. The command line (`producer order
// retry|skip|hold|resume`), the intake's admin routes and the dashboard's
// order page all call [Ops.Do], so the three never differ in what an
// action does, what it refuses, or how it is recorded.
//
// Each action goes through the same rules as the workers: the order's
// sequence decides whose turn it is, asynq's own scripts decide whether a
// task may move (a task that runs now is never archived or run again), and
// a change that runs in its turn writes under its fence. No action writes
// the order itself.
//
// The actions on the head are keyorder's operator actions: an Ops builds
// on a keyorder.Runner whose keys are order numbers and which finds a
// position's task where the workers place it (RunnerConfig.Locate is
// orderkeys.Locate: the placements of the task's kind under Config.Shards,
// the exchanged order's for a creation). The Runner reads the head and its
// task (Runner.Head), runs it now (Runner.RetryHead), archives it and uses
// up its position (Runner.SkipHead), and wakes the parked changes
// (Runner.Wake); orderops adds what is the order domain's: the checks and
// refusals below, in its own words, the creation rules of an exchange, and
// the records. It never runs a task, so the Runner never subscribes to
// anything.
//
//   - Retry runs the head's task (the change whose turn it is) at once, when
//     it waits in asynq's retry or scheduled set: keyorder.Runner.RetryHead,
//     asynq's Inspector RunTask, which refuses an active or pending task
//     atomically. The task then takes its turn as any other run does.
//   - Skip archives the head's task with the operator's reason as its
//     last error ("skipped by <who>: <reason>"), then uses up its position
//     (keyorder.Runner.SkipHead: the archive, as asynq's Inspector
//     ArchiveTask does, refuses an active task atomically, so a head that
//     runs now is refused, and is never both applied and skipped; the skip
//     is of the exact record read first, so nothing is skipped if the head
//     moved on meanwhile), wakes the change parked behind it, and, for an
//     exchange, settles its replacement's creation (keyorder.Turns.Created,
//     the Runner's) so that the replacement's changes go on, rejected with
//     the skip's reason. A replacement's creation (the head of a
//     replacement order, held by an exchange of another order) is skipped
//     only when that exchange will never run (its task is gone, archived
//     or completed); otherwise the skip is refused, naming the exchange to
//     skip or hold instead: skipping the creation would not stop the
//     exchange, which would create the order after its changes were
//     rejected.
//   - Hold pauses the order's sequence (keyorder.Sequencer.Pause, the
//     Runner's Sequencer): changes are still accepted, and the head parks
//     instead of taking its turn. A change that runs when the hold is set
//     finishes. Changes without a position (enqueued by hand, not ordered)
//     are not held. A held sequence never expires, so hold refuses an
//     order that has no sequence (no change accepted, or none for 7 days)
//     unless the order store holds it: a hold never makes a key for an
//     order that exists nowhere.
//   - Resume ends the hold (keyorder.Sequencer.Resume) and brings the parked
//     head back at once (keyorder.Runner.Wake).
//
// Every action is recorded, with its principal and reason, in the order's
// sequence log (skip as the skip's own entry, the others as entries of
// kind "action"), in the process's log ("operator action"), and, when the
// Ops has an order store that implements orders.Annotator (the Redis
// store), in the order's history as a note (orders.TypeNote: the
// principal as the entry's worker, "<action> by <who>: <reason>" as its
// detail). Every record has one form: "<action> by <who>", followed by
// ": <reason>" when there is a reason (the note adds "position N" to the
// action of a retry or skip). The sequence log keeps the last 20 entries while the sequence
// lives (a held sequence does not expire); the history is the durable
// record. The note is written after the action took effect, at best
// effort: a failure is logged, not returned. An order the store does not
// hold (held before it exists, say) gets no note, and neither does any
// order of a store without notes (the HTTP store, whose upstream API has
// no place for one): the sequence log is then the only record.
//
// Each principal may take Config.Rate actions a second past a burst of
// Config.Burst (a token bucket per principal, in the process): past it an
// action is refused with [ErrRateLimited] before it reads anything, so a
// flood of actions cannot flood the audit trail. An action also checks
// first that its Redis user may act at all (it may write the index of held
// orders, which no user but intake-admin's, dashboard-write's and the
// worker's may): run as the plain intake user, every action is refused
// before anything is written.
//
// It is not on any hot path: each action costs a few round trips.
package orderops

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

// Action is an operator action.
type Action string

// The actions.
const (
	// Retry runs the head's task at once.
	Retry Action = "retry"
	// Skip archives the head's task and uses up its position.
	Skip Action = "skip"
	// Hold stops applying the order's changes; they are still accepted.
	Hold Action = "hold"
	// Resume ends a hold: the changes are applied again, in order.
	Resume Action = "resume"
)

// Actions returns every action, in the order the docs list them.
func Actions() []Action { return []Action{Retry, Skip, Hold, Resume} }

// ParseAction returns the action named s.
func ParseAction(s string) (Action, bool) {
	for _, a := range Actions() {
		if string(a) == s {
			return a, true
		}
	}
	return "", false
}

// NeedsReason reports whether the action requires a reason: skip and hold
// do (they stop or drop a customer's change); retry and resume take one
// optionally.
func (a Action) NeedsReason() bool { return a == Skip || a == Hold }

// MaxReasonLen bounds a reason, in bytes; MaxPrincipalLen a principal.
// They are the limits of a history note's.
const (
	MaxReasonLen    = orders.MaxNoteReason
	MaxPrincipalLen = orders.MaxNoteBy
)

// Errors of [Ops.Do]. Match them with errors.Is.
var (
	// ErrInvalid is returned for a request that no state of the order
	// could satisfy: an unknown action, a malformed order number, a
	// missing or too long reason, a missing principal, a principal or
	// reason with a control or format character (U+202E, say).
	ErrInvalid = errors.New("orderops: invalid request")
	// ErrRefused is returned when the order's state does not allow the
	// action now: nothing waits, the head runs right now, the order is
	// (not) on hold, the head's task is not in a state the action
	// applies to. The message says which, and what to do.
	ErrRefused = errors.New("orderops: action refused")
	// ErrRateLimited is returned when the principal's actions went past
	// Config.Rate and Config.Burst: nothing was read or done. A
	// *RateLimitError says when to try again.
	ErrRateLimited = errors.New("orderops: too many actions")
	// ErrNotAllowed is returned when the Redis user may not act on orders
	// (the plain intake user, say): nothing was written. Run the action as
	// the intake-admin or dashboard-write user (see internal/acl).
	ErrNotAllowed = errors.New("orderops: this Redis user may not act on orders")
)

// RateLimitError is the error of an action past its principal's limit. It
// matches [ErrRateLimited].
type RateLimitError struct {
	// By is the principal.
	By string
	// RetryAfter is how long until the principal's bucket holds a token
	// again: at least a second, whole seconds.
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("orderops: %s took too many actions; try again in %d s", e.By, int64(e.RetryAfter/time.Second))
}

// Is reports whether target is ErrRateLimited.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// Request is an action's input.
type Request struct {
	OrderNo string
	// By is the principal: the OS user, the API key's name, the dashboard
	// user. Required.
	By string
	// Reason is why; required for skip and hold.
	Reason string
}

// Result says what an action did.
type Result struct {
	OrderNo string `json:"order_no"`
	Action  Action `json:"action"`
	By      string `json:"by"`
	Reason  string `json:"reason,omitempty"`
	// Seq is the head acted on (retry, skip); 0 for hold and resume.
	Seq int64 `json:"seq,omitempty"`
	// TaskID and Queue name the head's task, when it has one.
	TaskID string `json:"task_id,omitempty"`
	Queue  string `json:"queue,omitempty"`
	// Detail says what was done, for people.
	Detail string `json:"detail"`
	// Warning, when not empty, says what did not go as it should although
	// the action took effect: the index of held orders could not be
	// written, so the blocked list does not show the hold.
	Warning string `json:"warning,omitempty"`
}

// Config tunes an [Ops]. The zero value means all defaults.
type Config struct {
	// KeyPrefix is the prefix of orderworker's Redis keys (KEY_PREFIX),
	// the workers'. Defaults to orderkeys.DefaultPrefix ("ow:").
	KeyPrefix string
	// Shards is the workers' queue sharding: where the head's task is
	// looked for. Defaults to one queue per task type.
	Shards tasks.Shards
	// Kinds are the task kinds the workers handle (worker.Config.Kinds):
	// the head's position label, its task's type and queue are read
	// against them, so that an action on the change of a kind of a
	// program's own finds its task as it finds the contract's. It must
	// pass tasks.Table.Validate. Defaults to tasks.Kinds(), the
	// contract's.
	Kinds tasks.Table
	// Logger receives the audit line of each action ("operator action")
	// and what goes wrong after an action took effect. Defaults to
	// discarding.
	Logger *zap.Logger
	// Store is the order store. When it implements orders.Annotator, each
	// action is also noted in the order's history. Hold asks it whether an
	// order without a sequence exists. Defaults to none: the actions are
	// recorded in the sequence log only, and hold refuses an order without
	// a sequence.
	Store orders.Store
	// Rate is how many actions a second each principal may take,
	// sustained, past a burst of Burst; [Unlimited] turns the limit off.
	// Defaults to DefaultRate.
	Rate rate.Limit
	// Burst is how many actions a principal may take at once after a
	// quiet spell. Defaults to DefaultBurst.
	Burst int
	// Now is the clock of the rate limit. Defaults to time.Now.
	Now func() time.Time
	// OrderRate and OrderBurst are the limit of one order's actions kept
	// in Redis, across every process and replica (the CLI's too): each
	// principal may take OrderBurst actions on an order at once, then
	// OrderRate an hour; every "cli:" principal counts as one (the CLI's
	// -by names whoever its user says). All principals together may take
	// 4 × OrderBurst at once, then 3 × OrderRate an hour. So the audit
	// trail of an order (its notes, NotesMax of them, and its sequence's
	// log of 20) is not erased by repeating actions in minutes: see
	// docs/operations.md. A Rate of [Unlimited] turns this limit off
	// too. Default DefaultOrderRate (10) and DefaultOrderBurst (5).
	OrderRate  float64
	OrderBurst int
}

// The defaults of the rate limit: a person acts a few times a minute; a
// script that floods the audit trail is stopped.
const (
	// DefaultRate is the default of Config.Rate: an action a second.
	DefaultRate rate.Limit = 1
	// DefaultBurst is the default of Config.Burst.
	DefaultBurst = 20
	// Unlimited is a Config.Rate that turns the limit off.
	Unlimited = rate.Inf
	// DefaultOrderRate is the default of Config.OrderRate: ten actions
	// an hour on one order, per principal.
	DefaultOrderRate = 10.0
	// DefaultOrderBurst is the default of Config.OrderBurst.
	DefaultOrderBurst = 5
)

// maxPrincipals bounds the buckets kept: past it, the full ones (of
// principals quiet for a while) are dropped, and if none is full, all.
const maxPrincipals = 1024

// Ops performs operator actions. It is safe for concurrent use; it holds
// no connection of its own and starts no goroutine. Close it when done.
type Ops struct {
	rdb    redis.UniversalClient
	cfg    Config
	run    *keyorder.Runner // the actions on the head; never runs a task
	seq    *keyorder.Sequencer
	locate func(orderNo, label string) ([]string, string, bool)
	notes  orders.Annotator // nil without a store that keeps notes
	log    *zap.Logger

	mu      sync.Mutex
	buckets map[string]*rate.Limiter // by principal
}

// New returns an Ops on rdb, the workers' Redis. It returns an error for a
// nil client, an invalid cfg (Kinds that do not validate: an error
// matching tasks.ErrKinds), and a program that links another asynq release
// than the one keyorder reads the Redis layout of (keyorder.NewRunner).
func New(rdb redis.UniversalClient, cfg Config) (*Ops, error) {
	if rdb == nil {
		return nil, errors.New("orderops: nil redis client")
	}
	cfg.KeyPrefix = cmp.Or(cfg.KeyPrefix, orderkeys.DefaultPrefix)
	if err := cfg.Shards.Validate(); err != nil {
		return nil, fmt.Errorf("orderops: %w", err)
	}
	if cfg.Kinds == nil {
		cfg.Kinds = tasks.Kinds()
	} else {
		cfg.Kinds = slices.Clone(cfg.Kinds)
	}
	if err := cfg.Kinds.Validate(); err != nil {
		return nil, fmt.Errorf("orderops: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cfg.Rate = cmp.Or(cfg.Rate, DefaultRate)
	cfg.Burst = cmp.Or(cfg.Burst, DefaultBurst)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.OrderRate = cmp.Or(cfg.OrderRate, DefaultOrderRate)
	cfg.OrderBurst = cmp.Or(cfg.OrderBurst, DefaultOrderBurst)
	if !(cfg.Rate > 0) || cfg.Burst < 1 || !(cfg.OrderRate > 0) || cfg.OrderBurst < 1 {
		return nil, fmt.Errorf("orderops: rates %v and %v an hour, bursts %d and %d must be positive",
			float64(cfg.Rate), cfg.OrderRate, cfg.Burst, cfg.OrderBurst)
	}
	log := cfg.Logger.Named("orderops")
	o := &Ops{rdb: rdb, cfg: cfg, locate: orderkeys.Locate(cfg.Shards, cfg.Kinds), log: log, buckets: make(map[string]*rate.Limiter)}
	o.notes, _ = cfg.Store.(orders.Annotator)
	// The Runner is only the home of the actions on the head and of the
	// settlements: Ops never runs a task, so it never subscribes to the
	// release notices. It finds a task where the workers place it.
	seq, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{})
	if err != nil {
		return nil, fmt.Errorf("orderops: %w", err)
	}
	run, err := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: orderkeys.OrderNo(cfg.Kinds), Locate: o.locate, Logger: logging.Slog(log), KeyField: "order_no"})
	if err != nil {
		return nil, fmt.Errorf("orderops: %w", err)
	}
	o.run, o.seq = run, run.Sequencer()
	return o, nil
}

// Close releases what Ops holds; the Redis client stays the caller's.
func (o *Ops) Close() error { return o.run.Close() }

// check validates req for a.
func check(a Action, req Request) error {
	switch {
	case a != Retry && a != Skip && a != Hold && a != Resume:
		return fmt.Errorf("%w: unknown action %q (want retry, skip, hold or resume)", ErrInvalid, a)
	case !tasks.ValidOrderNo(req.OrderNo):
		return fmt.Errorf("%w: order number %q: 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'", ErrInvalid, req.OrderNo)
	case strings.TrimSpace(req.By) == "" || len(req.By) > MaxPrincipalLen || !text(req.By):
		return fmt.Errorf("%w: a principal (who acts) of 1 to %d bytes is required, without control or format characters", ErrInvalid, MaxPrincipalLen)
	case a.NeedsReason() && strings.TrimSpace(req.Reason) == "":
		return fmt.Errorf("%w: %s needs a reason", ErrInvalid, a)
	case len(req.Reason) > MaxReasonLen || !text(req.Reason):
		return fmt.Errorf("%w: the reason must be UTF-8 of at most %d bytes, without control or format characters (such as U+202E)", ErrInvalid, MaxReasonLen)
	}
	return nil
}

// text reports whether s is UTF-8 without control or format characters
// (unicode.Cc and Cf: the bidirectional overrides and isolates among the
// latter, which reorder what a reader sees), as a history note needs
// (orders.CheckNote).
func text(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) })
}

// Do performs action a on order req.OrderNo (see the package comment) and
// records it. It returns errors matching [ErrInvalid], [ErrRateLimited] (a
// *RateLimitError), [ErrNotAllowed] and [ErrRefused], and Redis' and
// asynq's errors, wrapped.
func (o *Ops) Do(ctx context.Context, a Action, req Request) (Result, error) {
	if err := check(a, req); err != nil {
		return Result{}, err
	}
	if err := o.allow(req.By); err != nil {
		return Result{}, err
	}
	if err := o.mayAct(ctx); err != nil {
		return Result{}, err
	}
	if err := o.allowOrder(ctx, req); err != nil {
		return Result{}, err
	}
	req.Reason = strings.TrimSpace(req.Reason)
	res := Result{OrderNo: req.OrderNo, Action: a, By: req.By, Reason: req.Reason}
	var err error
	switch a {
	case Retry:
		err = o.retry(ctx, req, &res)
	case Skip:
		err = o.skip(ctx, req, &res)
	case Hold:
		err = o.hold(ctx, req, &res)
	case Resume:
		err = o.resume(ctx, req, &res)
	}
	if err != nil {
		return Result{}, err
	}
	logging.WithTrace(ctx, o.log).Info("operator action", zap.String("action", string(a)), zap.String("order_no", req.OrderNo),
		zap.String("principal", req.By), zap.String("reason", req.Reason), zap.Int64("seq", res.Seq),
		zap.String("task_id", res.TaskID), zap.String("detail", res.Detail))
	o.annotate(ctx, a, req, res)
	return res, nil
}

// allow takes a token of principal by's bucket, or returns a
// *RateLimitError when it is empty.
func (o *Ops) allow(by string) error {
	if o.cfg.Rate == Unlimited {
		return nil
	}
	now := o.cfg.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.buckets[by]
	if b == nil {
		if len(o.buckets) >= maxPrincipals {
			for k, v := range o.buckets {
				if v.TokensAt(now) >= float64(o.cfg.Burst) {
					delete(o.buckets, k)
				}
			}
			if len(o.buckets) >= maxPrincipals {
				clear(o.buckets)
			}
		}
		b = rate.NewLimiter(o.cfg.Rate, o.cfg.Burst)
		o.buckets[by] = b
	}
	if b.AllowN(now, 1) {
		return nil
	}
	secs := math.Ceil((1 - b.TokensAt(now)) / float64(b.Limit()))
	return &RateLimitError{By: by, RetryAfter: time.Duration(max(1, min(secs, 24*60*60))) * time.Second}
}

// actsScript takes a token of two buckets of an order's actions kept in
// Redis (GCRA: each field holds the bucket's theoretical arrival time in
// ms): the principal's and the order's total.
//
// KEYS[1] the order's action buckets (a hash)
// ARGV[1] the principal's field, ARGV[2] its emission interval in ms,
// ARGV[3] its burst, ARGV[4] the total's emission interval in ms, ARGV[5]
// the total's burst
//
// Returns 0 when both had a token (both taken), or the ms until both
// have one (nothing taken).
var actsScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function next_tat(f, T, B)
  local tat = tonumber(redis.call('HGET', KEYS[1], f) or '0') or 0
  if tat < now then tat = now end
  local new = tat + T
  return new, new - now - T * B
end
local p, pw = next_tat(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
local a, aw = next_tat('*', tonumber(ARGV[4]), tonumber(ARGV[5]))
local wait = math.max(pw, aw)
if wait > 0 then return wait end
redis.call('HSET', KEYS[1], ARGV[1], p, '*', a)
redis.call('PEXPIREAT', KEYS[1], math.max(p, a))
return 0
`)

// allowOrder takes a token of the Redis-kept buckets of req's order (see
// Config.OrderRate), or returns a *RateLimitError.
func (o *Ops) allowOrder(ctx context.Context, req Request) error {
	if o.cfg.Rate == Unlimited {
		return nil
	}
	by := req.By
	if strings.HasPrefix(by, CLIPrefix) {
		by = CLIPrefix // the CLI's -by is its user's word: one bucket for all
	}
	interval := func(perHour float64) int64 { return max(1, int64(3_600_000/perHour)) }
	wait, err := actsScript.Run(ctx, o.rdb, []string{o.actsKey(req.OrderNo)}, "p:"+by,
		interval(o.cfg.OrderRate), o.cfg.OrderBurst, interval(3*o.cfg.OrderRate), 4*o.cfg.OrderBurst).Int64()
	if err != nil {
		return fmt.Errorf("orderops: the order's action limit: %w", err)
	}
	if wait <= 0 {
		return nil
	}
	secs := (wait + 999) / 1000
	return &RateLimitError{By: req.By, RetryAfter: time.Duration(max(1, secs)) * time.Second}
}

// actsKey is the Redis key of the action buckets of order no: in the
// order's slot, among its lock's keys.
func (o *Ops) actsKey(no string) string {
	return strings.TrimSuffix(o.seq.SeqKey(no), ":seq") + ":acts"
}

// mayAct checks that the Redis user may write the index of held orders,
// which every action's user needs and the plain intake user lacks: a ZADD
// with XX of a member that no key name can be (not a valid order number)
// writes nothing, but Redis checks the right to write first.
func (o *Ops) mayAct(ctx context.Context) error {
	err := o.rdb.ZAddXX(ctx, o.seq.PausedKey(), redis.Z{Score: 0, Member: " probe"}).Err()
	switch {
	case err == nil:
		return nil
	case redis.HasErrorPrefix(err, "NOPERM"):
		return fmt.Errorf("%w (run it as the intake-admin or dashboard-write user; see producer acl): %w", ErrNotAllowed, err)
	}
	return fmt.Errorf("orderops: %w", err)
}

// verbs are the actions as their records name them: "retry now by carol:
// upstream fixed".
var verbs = map[Action]string{Retry: "retry now", Skip: "skipped", Hold: "hold", Resume: "resume"}

// audit is the text an action leaves in the sequence log.
func audit(a Action, req Request) string {
	return clip(note(verbs[a], req).Detail())
}

func note(action string, req Request) orders.Note {
	return orders.Note{By: req.By, Action: action, Reason: req.Reason}
}

// noteTimeout bounds the writing of a note, which outlives a cancelled
// request: the action it records took effect already.
const noteTimeout = 5 * time.Second

// annotate notes the action in the order's history, when the store keeps
// notes: "skipped position 3 by dave: bad address". The action took effect
// already: a failure is logged (the sequence log and the audit line keep
// it), and an order the store does not hold gets no note.
func (o *Ops) annotate(ctx context.Context, a Action, req Request, res Result) {
	if o.notes == nil {
		return
	}
	action := verbs[a]
	if res.Seq > 0 {
		action += fmt.Sprintf(" position %d", res.Seq)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), noteTimeout)
	defer cancel()
	err := o.notes.Annotate(ctx, req.OrderNo, note(action, req))
	switch {
	case errors.Is(err, orders.ErrNotFound):
		logging.WithTrace(ctx, o.log).Debug("no note of the action in the order's history: the store has no such order", zap.String("order_no", req.OrderNo))
	case err != nil:
		logging.WithTrace(ctx, o.log).Warn("could not note the action in the order's history; the sequence log keeps it",
			zap.String("order_no", req.OrderNo), zap.String("action", string(a)), zap.Error(err))
	}
}

func clip(s string) string {
	if len(s) > keyorder.MaxMetaLen {
		return s[:keyorder.MaxMetaLen]
	}
	return s
}

// head reads the head of orderNo's sequence and looks its task up
// (keyorder.Runner.Head). It returns ErrRefused when nothing waits.
func (o *Ops) head(ctx context.Context, orderNo string) (keyorder.Head, error) {
	h, err := o.run.Head(ctx, orderNo)
	switch {
	case errors.Is(err, keyorder.ErrNothingToDo):
		return h, fmt.Errorf("%w: no change of order %s waits: nothing to act on", ErrRefused, orderNo)
	case err != nil:
		return h, fmt.Errorf("orderops: %w", err)
	}
	return h, nil
}

// result names head h and its task in res: the queue that holds the task,
// or, when none does, its first placement (keyorder.Head.Queue).
func (o *Ops) result(h keyorder.Head, res *Result) {
	res.Seq, res.TaskID, res.Queue = h.Pos, h.TaskID, h.Queue
}

// retry runs the head's task now.
func (o *Ops) retry(ctx context.Context, req Request, res *Result) error {
	h, err := o.head(ctx, req.OrderNo)
	if err != nil {
		return err
	}
	o.result(h, res)
	halted := h.Held != nil && h.Held.Halted != "" && h.Held.Halted == h.Label
	if p := h.Held; p != nil && !halted {
		return fmt.Errorf("%w: order %s is on hold (by %s: %s): resume it, and its head runs at once", ErrRefused, req.OrderNo, p.By, p.Reason)
	}
	switch h.State {
	case asynq.TaskStateRetry.String(), asynq.TaskStateScheduled.String():
	case asynq.TaskStateArchived.String():
		// A halted order's head runs again in its place, and the halt
		// ends (keyorder.Runner.RetryHead).
		if !halted {
			return fmt.Errorf("%w: the head's task %s is %s: it will not run again; skip it so the order goes on", ErrRefused, h.TaskID, h.State)
		}
	case keyorder.StateMissing:
		return fmt.Errorf("%w: the head (position %d, %s) has no task: it will not come; skip it", ErrRefused, h.Pos, h.Label)
	case asynq.TaskStateActive.String():
		return fmt.Errorf("%w: the head's task %s runs right now", ErrRefused, h.TaskID)
	case asynq.TaskStatePending.String():
		return fmt.Errorf("%w: the head's task %s is already due: it runs as soon as a worker is free", ErrRefused, h.TaskID)
	default:
		return fmt.Errorf("%w: the head's task %s is %s: it will not run again; skip it so the order goes on", ErrRefused, h.TaskID, h.State)
	}
	if err := o.run.RetryHead(ctx, h); err != nil {
		if errors.Is(err, asynq.ErrTaskNotFound) {
			return fmt.Errorf("%w: the head's task %s is gone", ErrRefused, h.TaskID)
		}
		// asynq refuses an active or pending task atomically: it started
		// meanwhile.
		return fmt.Errorf("%w: the head's task %s could not be run now (it may have started meanwhile): %w", ErrRefused, h.TaskID, err)
	}
	res.Detail = fmt.Sprintf("task %s (position %d) moved from %s to pending: it runs next", h.TaskID, h.Pos, h.State)
	o.record(ctx, req.OrderNo, h.Pos, h.Label, audit(Retry, req))
	return nil
}

// skip archives the head's task and uses up its position
// (keyorder.Runner.SkipHead), once the order's rules allow it.
func (o *Ops) skip(ctx context.Context, req Request, res *Result) error {
	h, err := o.head(ctx, req.OrderNo)
	if err != nil {
		return err
	}
	o.result(h, res)
	why := audit(Skip, req)
	typ, _, from, _ := o.cfg.Kinds.ParseLabel(h.Label)
	switch {
	case from != "":
		// A replacement's creation: its task is the exchange of another
		// order, which a skip here would not stop.
		if err := o.creationSkippable(ctx, req.OrderNo, h, typ, from); err != nil {
			return err
		}
	case h.State == asynq.TaskStateActive.String():
		return fmt.Errorf("%w: the head's task %s runs right now; wait for it to end (or cancel it in asynqmon) and skip again if it fails", ErrRefused, h.TaskID)
	}
	// The archive refuses an active task in the same script that moves
	// it, as asynq's does: once archived, the task never runs, so the
	// position is never both applied and skipped. The reason becomes the
	// archived task's last error.
	sk, err := o.run.SkipHead(ctx, h, why)
	var se *keyorder.StateError
	switch {
	case errors.As(err, &se) && se.State == asynq.TaskStateActive.String():
		return fmt.Errorf("%w: the head's task %s started meanwhile and runs right now; wait for it to end and skip again if it fails", ErrRefused, h.TaskID)
	case errors.As(err, &se):
		return fmt.Errorf("%w: the head's task %s could not be archived: asynq has it %s", ErrRefused, h.TaskID, se.State)
	case err != nil:
		return fmt.Errorf("orderops: %w", err)
	}
	if !sk.Done {
		// The head moved on between the read and the skip: settled by
		// someone else (the gap check, which skips an archived head, or
		// another operator). Its task, if archived above, stays archived.
		res.Detail = fmt.Sprintf("position %d was settled meanwhile; nothing more to skip", h.Pos)
		return nil
	}
	o.wake(ctx, req.OrderNo, sk.Wake)
	res.Detail = fmt.Sprintf("position %d skipped", h.Pos)
	if sk.Archived {
		res.Detail = fmt.Sprintf("task %s archived and position %d skipped", h.TaskID, h.Pos)
	}
	if k := o.cfg.Kinds.Of(h.Type); k != nil && from == "" {
		if p, err := k.Parse(h.Payload); err == nil {
			if c, ok := p.(tasks.Creator); ok {
				o.run.Created(ctx, c.Creates(), h.TaskID, "exchange "+h.TaskID+" of "+req.OrderNo, errors.New(why))
				res.Detail += "; the creation of " + c.Creates() + " it was to make is settled as not made"
			}
		}
	}
	return nil
}

// creationSkippable refuses the skip of h, the head of orderNo that is its
// creation by exchange h.TaskID (of type typ) of order from, while that
// exchange's task may still run: skipping the creation would not stop the
// exchange, which would create orderNo after the changes waiting for it
// had been rejected as changes of an unknown order. The exchange is what
// to skip or hold. A creation whose exchange will never run (its task is
// gone, archived or completed) may be skipped: the workers' gap check
// would skip it too.
func (o *Ops) creationSkippable(ctx context.Context, orderNo string, h keyorder.Head, typ, from string) error {
	if SkipsCreation(h.State) {
		return nil
	}
	where := ""
	if st, err := o.seq.Status(ctx, from); err == nil && len(st.Pending) > 0 && st.Pending[0].Pos == st.Done+1 &&
		st.Pending[0].Label != tasks.PositionLabel(typ, h.TaskID) {
		where = fmt.Sprintf(" (it is not at the head of %s yet: that is position %d, %s)", from, st.Pending[0].Pos, st.Pending[0].Label)
	}
	return fmt.Errorf("%w: position %d of %s is its creation by exchange %s of order %s, whose task is %s: skipping the creation would not stop the exchange, which would still create %s after the changes waiting for it were rejected; skip or hold that exchange (order %s) instead%s",
		ErrRefused, h.Pos, orderNo, h.TaskID, from, h.State, orderNo, from, where)
}

// SkipsCreation reports whether a skip of a replacement's creation goes
// ahead, given the asynq state (asynq.TaskState's String) of the task of
// the exchange that makes it: only when that exchange will never run
// ("archived", "completed", or any other text, such as orderview's
// "missing", for a task asynq does not have). For "pending", "active",
// "scheduled", "retry" and "aggregating" the skip is refused (see
// [Skip]), and the blocked-orders page does not offer it.
func SkipsCreation(exchangeState string) bool {
	for _, s := range []asynq.TaskState{asynq.TaskStatePending, asynq.TaskStateActive, asynq.TaskStateScheduled,
		asynq.TaskStateRetry, asynq.TaskStateAggregating} {
		if exchangeState == s.String() {
			return false
		}
	}
	return true
}

// holdLabel labels the log entries of the actions on a whole sequence.
const holdLabel = "operator"

// hold pauses the order's sequence.
func (o *Ops) hold(ctx context.Context, req Request, res *Result) error {
	if err := o.known(ctx, req.OrderNo); err != nil {
		return err
	}
	p, err := o.seq.Pause(ctx, req.OrderNo, req.By, req.Reason)
	switch {
	case errors.Is(err, keyorder.ErrPaused):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, keyorder.ErrPauseIndex):
		res.Warning = "the order is held, but the index of held orders could not be written: the blocked list does not show the hold (" + err.Error() + ")"
		logging.WithTrace(ctx, o.log).Warn("order held, but not listed among the held orders", zap.String("order_no", req.OrderNo), zap.Error(err))
	case err != nil:
		return fmt.Errorf("orderops: %w", err)
	}
	res.Detail = "on hold since " + p.At.Format(time.RFC3339) + ": changes are accepted, none is applied until resumed"
	o.record(ctx, req.OrderNo, 0, holdLabel, audit(Hold, req))
	return nil
}

// known returns nil when order orderNo has a sequence or the store holds
// it, and an error matching ErrRefused when neither: a held sequence never
// expires, so a hold must not make one for an order that exists nowhere.
func (o *Ops) known(ctx context.Context, orderNo string) error {
	st, err := o.seq.Status(ctx, orderNo)
	if err != nil {
		return fmt.Errorf("orderops: %w", err)
	}
	if st.Exists {
		return nil
	}
	if o.cfg.Store != nil {
		_, err := o.cfg.Store.Get(ctx, orderNo)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, orders.ErrNotFound):
			return fmt.Errorf("orderops: order %s: %w", orderNo, err)
		}
	}
	return fmt.Errorf("%w: order %s is unknown: no change of it was accepted recently and the order store does not hold it; nothing to hold", ErrRefused, orderNo)
}

// resume ends the hold and brings the parked head back.
func (o *Ops) resume(ctx context.Context, req Request, res *Result) error {
	if h, err := o.head(ctx, req.OrderNo); err == nil && h.Held != nil && h.Held.Halted != "" && h.State == asynq.TaskStateArchived.String() {
		// It would only halt again (the gap check halts an archived head
		// of a halting kind).
		o.result(h, res)
		return fmt.Errorf("%w: order %s is halted: its change %s failed past its retries (%s); retry it in its place or skip it", ErrRefused, req.OrderNo, h.TaskID, h.Held.Reason)
	}
	p, st, err := o.seq.Resume(ctx, req.OrderNo)
	switch {
	case errors.Is(err, keyorder.ErrNotPaused):
		return fmt.Errorf("%w: order %s is not on hold", ErrRefused, req.OrderNo)
	case errors.Is(err, keyorder.ErrPauseIndex):
		res.Warning = "the order is resumed, but the index of held orders could not be written: the blocked list still shows the hold (" + err.Error() + ")"
		logging.WithTrace(ctx, o.log).Warn("order resumed, but still listed among the held orders", zap.String("order_no", req.OrderNo), zap.Error(err))
	case err != nil:
		return fmt.Errorf("orderops: %w", err)
	}
	o.wake(ctx, req.OrderNo, st.Wake)
	res.Detail = fmt.Sprintf("the hold (%s) ended; changes are applied again, in order", note(verbs[Hold], Request{By: p.By, Reason: p.Reason}).Detail())
	o.record(ctx, req.OrderNo, 0, holdLabel, audit(Resume, req))
	return nil
}

// wake brings the parked changes a settlement called back to the front of
// their queues; a failure only costs them their park delay, and is logged.
func (o *Ops) wake(ctx context.Context, orderNo string, labels []string) {
	if len(labels) == 0 {
		return
	}
	if err := o.run.Wake(ctx, orderNo, labels); err != nil {
		logging.WithTrace(ctx, o.log).Warn("could not bring the parked changes back; they come back after their park delay",
			zap.String("order_no", orderNo), zap.Error(err))
	}
}

// record writes the action's entry in the sequence log. The action took
// effect already: a failure is logged (the audit line keeps it).
func (o *Ops) record(ctx context.Context, orderNo string, pos int64, label, text string) {
	if err := o.seq.Record(ctx, orderNo, pos, label, text); err != nil {
		logging.WithTrace(ctx, o.log).Warn("could not record the action in the order's sequence log", zap.String("order_no", orderNo), zap.Error(err))
	}
}

// Body is the JSON body of an action over HTTP (the intake's and the
// dashboard's): {"reason": "..."}.
type Body struct {
	// Reason is why; required for skip and hold.
	Reason string `json:"reason"`
}

// MaxBodyLen bounds an action's body, in bytes.
const MaxBodyLen = 4 << 10

// DecodeBody decodes an action's body strictly, as the intake decodes an
// enqueue's: one JSON object in valid UTF-8 of at most MaxBodyLen bytes,
// with nothing but white space after it, whose only field is "reason" (a
// string or null), named exactly and at most once. An empty body (or only
// white space) is an empty Body. Every error matches [ErrInvalid] and
// says what is wrong, without quoting the body.
func DecodeBody(b []byte) (Body, error) {
	var body Body
	if len(b) > MaxBodyLen {
		return Body{}, fmt.Errorf("%w: the body is larger than %d bytes", ErrInvalid, MaxBodyLen)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return body, nil
	}
	const want = `the body must be one JSON object, {"reason": "..."}`
	if !utf8.Valid(b) {
		return Body{}, fmt.Errorf("%w: %s in UTF-8", ErrInvalid, want)
	}
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	if dec.PeekKind() != '{' {
		return Body{}, fmt.Errorf("%w: %s", ErrInvalid, want)
	}
	if err := json.UnmarshalDecode(dec, &body, json.RejectUnknownMembers(true)); err != nil {
		var se *json.SemanticError
		var syn *jsontext.SyntacticError
		switch {
		case errors.As(err, &syn) && errors.Is(err, jsontext.ErrDuplicateName):
			return Body{}, fmt.Errorf("%w: %s: a field is repeated", ErrInvalid, want)
		case errors.As(err, &se) && errors.Is(err, json.ErrUnknownName):
			return Body{}, fmt.Errorf("%w: %s: unknown field %s (only reason is)", ErrInvalid, want, se.JSONPointer)
		case errors.As(err, &se) && se.JSONPointer == "/reason":
			return Body{}, fmt.Errorf("%w: %s: reason must be a string", ErrInvalid, want)
		}
		return Body{}, fmt.Errorf("%w: %s", ErrInvalid, want)
	}
	if rest := bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return Body{}, fmt.Errorf("%w: %s, with nothing after it", ErrInvalid, want)
	}
	return body, nil
}

// CLIPrefix marks the principal of an action taken from the command line:
// "cli:alice". It is taken from the environment or a flag, never
// authenticated, and the mark keeps it apart from the principals the intake
// and the dashboard authenticate ("admin#N", a dashboard user).
const CLIPrefix = "cli:"

// CLIPrincipal returns the principal of an action taken from the command
// line by name: CLIPrefix + name. It returns an error matching
// [ErrInvalid] for an empty name, one that already carries the mark, or
// one that looks like a principal the intake gives ("admin#N", "key#N",
// "anonymous"), which a reader of the audit trail would take for an
// authenticated caller.
func CLIPrincipal(name string) (string, error) {
	name = strings.TrimSpace(name)
	lower := strings.ToLower(name)
	switch {
	case name == "":
		return "", fmt.Errorf("%w: a principal (-by, or the OS user) is required", ErrInvalid)
	case strings.HasPrefix(lower, CLIPrefix):
		return "", fmt.Errorf("%w: principal %q: the command line adds %q itself", ErrInvalid, name, CLIPrefix)
	case lower == "anonymous" || serverPrincipal(lower, "admin#") || serverPrincipal(lower, "key#"):
		return "", fmt.Errorf("%w: principal %q looks like one the intake authenticates (admin#N, key#N, anonymous); give your own name", ErrInvalid, name)
	}
	return CLIPrefix + name, nil
}

// serverPrincipal reports whether s is prefix followed by digits only.
func serverPrincipal(s, prefix string) bool {
	n, ok := strings.CutPrefix(s, prefix)
	return ok && n != "" && strings.Trim(n, "0123456789") == ""
}
