// Package ledger is an account ledger built on the engine alone
// (github.com/orderworker/orderworker/worker/keyorder): entries posted to an
// account are applied one at a time, in the order they were accepted, each
// at most once, under the account's lock and with its fencing token checked
// by the store.
//
// Order matters here because of the overdraft rule: a post that would take
// an account's balance below zero is refused for good. "Deposit 100,
// withdraw 80, withdraw 50" refuses the second withdrawal; run in another
// order, it would refuse another entry. keyorder runs an account's entries
// in the order [Poster.Post] returned them, whatever the number of workers.
//
// The pieces:
//
//   - [Entry] is the task's payload, of type [TypePost].
//   - [Poster] enqueues an entry through a [keyorder.Client], with the
//     account as the key and the entry's ID as the asynq task ID.
//   - [Store] keeps the accounts on Redis and applies an entry in one Lua
//     script: fence check, at most once per entry ID, overdraft rule,
//     append and balance.
//   - [Store.Handler] is the asynq handler, to register wrapped by
//     [keyorder.Runner.Handler], with [Key] as the Runner's
//     RunnerConfig.Key.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// TypePost is the asynq task type of a post: its payload is an [Entry] in
// JSON (plus the "seq" member that keyorder adds).
const TypePost = "ledger:post"

// DefaultQueue is the asynq queue of posts when PosterConfig.Queue is
// empty. The asynq server that runs them must serve it.
const DefaultQueue = "ledger"

// MaxAmount bounds an entry's amount, in cents, either way: 10^15 cents
// (10 trillion units), far below the int64 range, so that no single entry
// can overflow a balance.
const MaxAmount = 1_000_000_000_000_000

// MaxIDLen bounds an entry's ID, in bytes.
const MaxIDLen = 128

// Errors of the package. Match them with errors.Is.
var (
	// ErrInvalid is matched by the error for an entry that can never be
	// posted: no account, an account keyorder refuses as a key, no ID,
	// a zero amount or one past MaxAmount.
	ErrInvalid = errors.New("ledger: invalid entry")
	// ErrOverdraft is matched by the error of [Store.Apply] for an entry
	// that would take its account's balance below zero. The refusal is
	// final: the entry's ID is refused again if posted again.
	ErrOverdraft = errors.New("ledger: overdraft")
)

// Entry is one posting to an account, and the JSON payload of a
// [TypePost] task.
type Entry struct {
	// Account is the account, and keyorder's key: 1 to
	// keyorder.MaxKeyLen bytes, without braces.
	Account string `json:"account"`
	// EntryID identifies the entry: the store applies it at most once per
	// account, and it is the asynq task ID. 1 to MaxIDLen bytes, not
	// blank.
	EntryID string `json:"entry_id"`
	// Amount is in cents: positive for a deposit, negative for a
	// withdrawal, never zero, at most MaxAmount either way.
	Amount int64 `json:"amount"`
	// Memo is free text, kept with the entry.
	Memo string `json:"memo"`
}

// Validate returns an error matching [ErrInvalid] for an entry that can
// never be posted, and nil otherwise.
func (e Entry) Validate() error {
	switch {
	case e.Account == "" || len(e.Account) > keyorder.MaxKeyLen || strings.ContainsAny(e.Account, "{}"):
		return fmt.Errorf("%w: account %q: 1 to %d bytes, without braces", ErrInvalid, e.Account, keyorder.MaxKeyLen)
	case strings.TrimSpace(e.EntryID) == "" || len(e.EntryID) > MaxIDLen:
		return fmt.Errorf("%w: entry ID %q: 1 to %d bytes, not blank", ErrInvalid, e.EntryID, MaxIDLen)
	case e.Amount == 0 || e.Amount > MaxAmount || e.Amount < -MaxAmount:
		return fmt.Errorf("%w: amount %d of entry %s: non-zero, at most %d either way", ErrInvalid, e.Amount, e.EntryID, int64(MaxAmount))
	}
	return nil
}

// Key reads the account of a [TypePost] task: the RunnerConfig.Key of the
// [keyorder.Runner] that runs posts. It returns an error matching
// [ErrInvalid] for a payload that is not an entry (the Runner archives
// the task then).
func Key(t *asynq.Task) (string, error) {
	e, err := decode(t.Payload())
	if err != nil {
		return "", err
	}
	return e.Account, nil
}

// decode reads and validates an entry from a task's payload, which may
// hold keyorder's "seq" member too.
func decode(payload []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(payload, &e); err != nil {
		return Entry{}, fmt.Errorf("%w: payload: %w", ErrInvalid, err)
	}
	return e, e.Validate()
}

// PosterConfig tunes a [Poster]. The zero value means all defaults.
type PosterConfig struct {
	// Queue is the asynq queue of the posts. Defaults to DefaultQueue.
	Queue string
}

// Poster enqueues entries, each taking the next position of its account
// at acceptance. It is safe for concurrent use, starts no goroutine and
// owns nothing: the Client stays the caller's.
type Poster struct {
	c     *keyorder.Client
	queue string
}

// NewPoster returns a Poster that enqueues through c.
func NewPoster(c *keyorder.Client, cfg PosterConfig) *Poster {
	if cfg.Queue == "" {
		cfg.Queue = DefaultQueue
	}
	return &Poster{c: c, queue: cfg.Queue}
}

// Post enqueues e as a [TypePost] task with key e.Account and task ID
// e.EntryID, in the Poster's queue. An entry posted after another one's
// Post returned, to the same account, is applied after it. opts are
// asynq's options (asynq.MaxRetry, asynq.Timeout, ...); the Poster's queue
// and e.EntryID override an asynq.Queue or asynq.TaskID among them, and
// keyorder refuses asynq.Unique and asynq.Group.
//
// It returns an error matching [ErrInvalid] for an invalid entry,
// asynq.ErrTaskIDConflict when the queue holds a task with e.EntryID
// already (pending, waiting, or archived), and keyorder's and Redis's
// errors, wrapped. On success, the result's Pos is the entry's position
// in its account.
func (p *Poster) Post(ctx context.Context, e Entry, opts ...asynq.Option) (keyorder.Enqueued, error) {
	if err := e.Validate(); err != nil {
		return keyorder.Enqueued{}, err
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return keyorder.Enqueued{}, fmt.Errorf("ledger: encode entry %s: %w", e.EntryID, err)
	}
	all := append(opts[:len(opts):len(opts)], asynq.Queue(p.queue), asynq.TaskID(e.EntryID))
	enq, err := p.c.Enqueue(ctx, e.Account, asynq.NewTask(TypePost, payload), all...)
	if err != nil {
		return keyorder.Enqueued{}, fmt.Errorf("ledger: post entry %s to %s: %w", e.EntryID, e.Account, err)
	}
	return enq, nil
}

// Outcome is what [Store.Apply] did with an entry.
type Outcome int

// The outcomes of Store.Apply.
const (
	// Applied: the entry was appended and the balance moved.
	Applied Outcome = iota + 1
	// Duplicate: the entry's ID was applied before; nothing changed.
	Duplicate
	// Refused: the entry would have overdrawn the account; nothing
	// changed but the refusal, which is recorded.
	Refused
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Refused:
		return "refused"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is the result of [Store.Apply].
type Result struct {
	Outcome Outcome
	// Balance is the account's balance after the call, in cents.
	Balance int64
}

// Posted is an entry as the store keeps it.
type Posted struct {
	Entry
	// Seq is the entry's position in its account (keyorder's), and Fence
	// the fencing token it was applied under.
	Seq   int64 `json:"seq"`
	Fence int64 `json:"fence"`
	// Balance is the account's balance right after the entry (for a
	// refused entry: the balance it would have overdrawn).
	Balance int64 `json:"balance"`
}

// Account is an account as the store keeps it.
type Account struct {
	Name    string
	Balance int64
	// Entries are the applied entries, in the order they were applied.
	Entries []Posted
	// Refused are the entries refused by the overdraft rule, in order.
	Refused []Posted
}

// StoreConfig tunes a [Store]. The zero value means all defaults.
type StoreConfig struct {
	// Prefix starts the Redis keys of the accounts. Defaults to
	// "ledger:".
	Prefix string
}

// Store keeps accounts on Redis: per account a hash (balance and newest
// fence), the list of applied entries, the list of refused entries, and
// the decision per entry ID; all four share the account's hash tag, so a
// Store works on a Redis Cluster too.
//
// A Store is safe for concurrent use. It starts no goroutine; rdb stays
// the caller's to close.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewStore returns a Store on rdb.
func NewStore(rdb redis.UniversalClient, cfg StoreConfig) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = "ledger:"
	}
	return &Store{rdb: rdb, prefix: cfg.Prefix}
}

// keys returns the keys of an account: its hash, entries, refusals and
// decisions.
func (s *Store) keys(account string) []string {
	base := s.prefix + "{" + account + "}:"
	return []string{base + "account", base + "entries", base + "refused", base + "decided"}
}

// applyScript applies an entry to an account, in one step.
//
// KEYS[1] the account's hash (balance, fence), KEYS[2] its applied
// entries, KEYS[3] its refused entries, KEYS[4] its decisions (entry ID
// to "applied" or "refused"). ARGV[1] the fence, ARGV[2] the entry ID,
// ARGV[3] the amount, ARGV[4] the amount withdrawn (its magnitude; "" for
// a deposit), ARGV[5] the entry's record, a JSON object without its
// closing brace, to which the balance is appended.
//
// It returns {outcome, balance, fence}: "stale" with the newest fence
// seen, or "applied", "refused", "dup:applied", "dup:refused" with the
// balance after. Numbers travel as decimal strings, compared as such, so
// that no value passes through Lua's doubles.
var applyScript = redis.NewScript(`
local function cmp(a, b) -- non-negative decimal integers, canonical
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local seen = redis.call('HGET', KEYS[1], 'fence')
if seen and cmp(ARGV[1], seen) < 0 then return {'stale', '', seen} end
local prior = redis.call('HGET', KEYS[4], ARGV[2])
local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
if prior then return {'dup:' .. prior, balance, ''} end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
if ARGV[4] ~= '' and cmp(balance, ARGV[4]) < 0 then
  redis.call('RPUSH', KEYS[3], ARGV[5] .. ',"balance":' .. balance .. '}')
  redis.call('HSET', KEYS[4], ARGV[2], 'refused')
  return {'refused', balance, ''}
end
redis.call('HINCRBY', KEYS[1], 'balance', ARGV[3])
balance = redis.call('HGET', KEYS[1], 'balance')
redis.call('RPUSH', KEYS[2], ARGV[5] .. ',"balance":' .. balance .. '}')
redis.call('HSET', KEYS[4], ARGV[2], 'applied')
return {'applied', balance, ''}
`)

// Apply applies e at position seq under fence, in one script:
//
//   - A fence older than the newest the account has seen is refused with
//     an error matching keyorder.ErrStaleFence, and nothing changes. An
//     equal or newer fence is accepted and becomes the newest.
//   - An entry ID decided before gets the same decision again
//     ([Duplicate] for an applied one; ErrOverdraft for a refused one)
//     and nothing changes.
//   - A withdrawal larger than the balance is refused, recorded, and
//     returns an error matching [ErrOverdraft] with Outcome [Refused].
//   - Otherwise the entry is appended to the account's entries and the
//     balance moves: [Applied].
//
// It returns an error matching [ErrInvalid] for an invalid entry, and
// Redis's errors, wrapped (the entry may then have been applied or not:
// applying it again is safe).
func (s *Store) Apply(ctx context.Context, e Entry, seq, fence int64) (Result, error) {
	if err := e.Validate(); err != nil {
		return Result{}, err
	}
	if fence < 0 {
		return Result{}, fmt.Errorf("%w: fence %d of entry %s is negative", ErrInvalid, fence, e.EntryID)
	}
	record, err := json.Marshal(struct {
		Entry
		Seq   int64 `json:"seq"`
		Fence int64 `json:"fence"`
	}{e, seq, fence})
	if err != nil {
		return Result{}, fmt.Errorf("ledger: encode entry %s: %w", e.EntryID, err)
	}
	withdrawn := ""
	if e.Amount < 0 {
		withdrawn = strconv.FormatInt(-e.Amount, 10)
	}
	res, err := applyScript.Run(ctx, s.rdb, s.keys(e.Account),
		fence, e.EntryID, e.Amount, withdrawn, string(record[:len(record)-1])).StringSlice()
	if err != nil {
		return Result{}, fmt.Errorf("ledger: apply entry %s to %s: %w", e.EntryID, e.Account, err)
	}
	if len(res) != 3 {
		return Result{}, fmt.Errorf("ledger: apply entry %s to %s: unexpected reply %q", e.EntryID, e.Account, res)
	}
	if res[0] == "stale" {
		return Result{}, fmt.Errorf("ledger: entry %s to %s: fence %d is older than %s: %w", e.EntryID, e.Account, fence, res[2], keyorder.ErrStaleFence)
	}
	balance, err := strconv.ParseInt(res[1], 10, 64)
	if err != nil {
		return Result{}, fmt.Errorf("ledger: apply entry %s to %s: balance %q: %w", e.EntryID, e.Account, res[1], err)
	}
	switch res[0] {
	case "applied":
		return Result{Outcome: Applied, Balance: balance}, nil
	case "dup:applied":
		return Result{Outcome: Duplicate, Balance: balance}, nil
	case "refused", "dup:refused":
		return Result{Outcome: Refused, Balance: balance},
			fmt.Errorf("ledger: entry %s of %d would take %s's balance %d below zero: %w", e.EntryID, e.Amount, e.Account, balance, ErrOverdraft)
	}
	return Result{}, fmt.Errorf("ledger: apply entry %s to %s: unexpected outcome %q", e.EntryID, e.Account, res[0])
}

// Account reads an account: its balance, its applied and its refused
// entries. An account never posted to reads as empty, with no error. It
// returns Redis's errors, wrapped.
func (s *Store) Account(ctx context.Context, account string) (Account, error) {
	k := s.keys(account)
	var bal *redis.StringCmd
	var applied, refused *redis.StringSliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		bal = p.HGet(ctx, k[0], "balance")
		applied = p.LRange(ctx, k[1], 0, -1)
		refused = p.LRange(ctx, k[2], 0, -1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Account{}, fmt.Errorf("ledger: read account %s: %w", account, err)
	}
	a := Account{Name: account}
	if bal.Err() == nil {
		if a.Balance, err = bal.Int64(); err != nil {
			return Account{}, fmt.Errorf("ledger: read account %s: balance: %w", account, err)
		}
	}
	if a.Entries, err = records(applied.Val()); err != nil {
		return Account{}, fmt.Errorf("ledger: read account %s: %w", account, err)
	}
	if a.Refused, err = records(refused.Val()); err != nil {
		return Account{}, fmt.Errorf("ledger: read account %s: %w", account, err)
	}
	return a, nil
}

func records(raw []string) ([]Posted, error) {
	out := make([]Posted, 0, len(raw))
	for _, r := range raw {
		var p Posted
		if err := json.Unmarshal([]byte(r), &p); err != nil {
			return nil, fmt.Errorf("entry record %q: %w", r, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Delete removes an account's keys. It returns Redis's errors, wrapped.
func (s *Store) Delete(ctx context.Context, account string) error {
	k := s.keys(account)
	for _, key := range k { // one key at a time: a Cluster may not take them together
		if err := s.rdb.Del(ctx, key).Err(); err != nil {
			return fmt.Errorf("ledger: delete account %s: %w", account, err)
		}
	}
	return nil
}

// Handler returns the asynq handler of [TypePost] tasks. Register it
// wrapped by the Runner: mux.Handle(TypePost, runner.Handler(store.Handler())),
// with RunnerConfig.Key set to [Key]; it reads the fence and the position
// from [keyorder.RunFrom].
//
// The handler returns nil for an applied or duplicate entry, and an error
// wrapping asynq.SkipRetry (the task is archived, and the account's next
// entry runs) for an overdraft ([ErrOverdraft]), an invalid payload, or a
// run outside a Runner. A stale fence returns keyorder.ErrStaleFence,
// which the Runner does not count as a failure. Redis errors are returned
// as they are: the task is retried, and the entries behind it wait.
func (s *Store) Handler() asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		run, ok := keyorder.RunFrom(ctx)
		if !ok {
			return fmt.Errorf("ledger: a %s task must run under keyorder's Runner.Handler: %w", TypePost, asynq.SkipRetry)
		}
		e, err := decode(t.Payload())
		if err != nil {
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		if e.Account != run.Key {
			return fmt.Errorf("ledger: entry %s of %s runs under key %s: %w", e.EntryID, e.Account, run.Key, asynq.SkipRetry)
		}
		_, err = s.Apply(ctx, e, run.Pos, run.Fence)
		if errors.Is(err, ErrOverdraft) || errors.Is(err, ErrInvalid) {
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		return err
	})
}
