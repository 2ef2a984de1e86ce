// Package orderview reads what an order looks like to people: its history
// with the positions its sequence skipped, its status, what is happening
// to it now (see [Status]), and the list of the orders that are stuck (see
// [Reader.Blocked]). The intake's read API, the command line and the
// dashboard serve the same views from it, so they never disagree.
//
// It only reads: the order store (worker/orders), the order's sequence
// and lock (worker/keyorder), and asynq's tasks by queue and ID (in their
// placements under the shard setting, tasks.Shards). The blocked list is
// the engine's blocked-keys read (keyorder.Runner.Blocked), in the order
// domain's words. It never scans the keyspace, and it is not on any hot
// path.
package orderview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

// The defaults of [Config].
const (
	// DefaultGapWait is the default of Config.GapWait: the workers'
	// default gap wait, the engine's (keyorder.DefaultGapWait).
	DefaultGapWait = keyorder.DefaultGapWait
	// DefaultHistoryLen is the default of Config.HistoryLen.
	DefaultHistoryLen = 10
	// DefaultMaxPositions is the default of Config.MaxPositions.
	DefaultMaxPositions = 50
	// DefaultBlockedAfter is the default of Config.BlockedAfter.
	DefaultBlockedAfter = time.Minute
	// DefaultBlockedScan is the default of Config.BlockedScan.
	DefaultBlockedScan = 2000
)

// Config tunes a [Reader]. The zero value is valid and means all defaults.
type Config struct {
	// KeyPrefix is the prefix of orderworker's Redis keys (KEY_PREFIX),
	// the same as the workers'. Defaults to orderkeys.DefaultPrefix ("ow:").
	KeyPrefix string
	// GapWait is the workers' gap wait (GAP_WAIT): how long the next
	// position may wait for a task that will not come before the tasks
	// behind it skip it. Status reports the time left of it. Defaults to
	// 30s.
	GapWait time.Duration
	// HistoryLen is how many of the latest history entries Status shows.
	// Defaults to 10.
	HistoryLen int
	// MaxPositions is how many of the positions waiting in a sequence
	// Status lists and looks the tasks of up: it reads them as one page
	// (keyorder.SeqConfig.StatusPage) and counts the others, so a view costs
	// the same whatever the backlog. At most keyorder.MaxStatusPage (1000).
	// Defaults to 50.
	MaxPositions int
	// Now is the clock Status measures ages with. Defaults to time.Now.
	Now func() time.Time
	// Shards is the workers' queue sharding (tasks.Shards, the same
	// setting as theirs): Status looks an order's tasks up in their
	// placements under it, and Blocked reads the sets of every queue of
	// it. Defaults to one queue per task type.
	Shards tasks.Shards
	// BlockedAfter is how long the change at the head of an order's
	// sequence may wait before [Reader.Blocked] lists the order
	// (BLOCKED_AFTER). Defaults to 1 minute.
	BlockedAfter time.Duration
	// Kinds are the task kinds the workers handle (worker.Config.Kinds, the
	// producers' producer.Config.Kinds): the views read task types,
	// queues and position labels against them, so that a kind of a
	// program's own is shown as the contract's are. It must pass
	// tasks.Table.Validate. Defaults to tasks.Kinds(), the contract's.
	Kinds tasks.Table
	// BlockedScan bounds what one [Reader.Blocked] reads: at most this
	// many tasks of each queue's retry set, scheduled set and expired
	// leases, and this many held orders; past it the page says Truncated.
	// Defaults to 2000.
	BlockedScan int
}

// Reader reads the views of orders. It is safe for concurrent use; it
// holds no connection of its own and starts no goroutine.
type Reader struct {
	cfg   Config
	rdb   redis.UniversalClient
	store orders.Store
	seq   *keyorder.Sequencer
	head  *keyorder.Sequencer // the same sequences, read one position deep
	insp  *asynq.Inspector
	// run is the engine's blocked-keys read, with the order domain's keys
	// and labels; it never runs a task, so it never subscribes to
	// anything and needs no Close.
	run *keyorder.Runner
}

// New returns a Reader of the orders in store whose sequences, locks and
// tasks live in rdb. It fills the zero fields of cfg with their defaults.
// It returns an error for a nil dependency, a bad prefix, a negative field
// of cfg, a MaxPositions above keyorder.MaxStatusPage, or Kinds that do not
// validate (matching tasks.ErrKinds).
func New(rdb redis.UniversalClient, store orders.Store, cfg Config) (*Reader, error) {
	if store == nil {
		return nil, errors.New("orderview: nil order store")
	}
	if rdb == nil {
		return nil, errors.New("orderview: nil redis client")
	}
	if cfg.GapWait < 0 || cfg.HistoryLen < 0 || cfg.MaxPositions < 0 || cfg.BlockedAfter < 0 || cfg.BlockedScan < 0 {
		return nil, fmt.Errorf("orderview: negative setting in %+v", cfg)
	}
	if cfg.MaxPositions > keyorder.MaxStatusPage {
		return nil, fmt.Errorf("orderview: MaxPositions %d is above %d", cfg.MaxPositions, keyorder.MaxStatusPage)
	}
	if err := cfg.Shards.Validate(); err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	if cfg.Kinds == nil {
		cfg.Kinds = tasks.Kinds()
	} else {
		cfg.Kinds = slices.Clone(cfg.Kinds)
	}
	if err := cfg.Kinds.Validate(); err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	cfg.KeyPrefix = cmp.Or(cfg.KeyPrefix, orderkeys.DefaultPrefix)
	cfg.GapWait = cmp.Or(cfg.GapWait, DefaultGapWait)
	cfg.HistoryLen = cmp.Or(cfg.HistoryLen, DefaultHistoryLen)
	cfg.MaxPositions = cmp.Or(cfg.MaxPositions, DefaultMaxPositions)
	cfg.BlockedAfter = cmp.Or(cfg.BlockedAfter, DefaultBlockedAfter)
	cfg.BlockedScan = cmp.Or(cfg.BlockedScan, DefaultBlockedScan)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if strings.ContainsAny(cfg.KeyPrefix, "{}") {
		return nil, fmt.Errorf("orderview: key prefix %q has a brace", cfg.KeyPrefix)
	}
	seq, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{StatusPage: cfg.MaxPositions})
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	head, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{StatusPage: 1})
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	run, err := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: orderkeys.OrderNo(cfg.Kinds),
		Locate: orderkeys.Locate(cfg.Shards, cfg.Kinds), GapWait: cfg.GapWait, KeyField: "order_no"})
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	// The inspector shares rdb and closes nothing of it.
	return &Reader{cfg: cfg, rdb: rdb, store: store, seq: seq, head: head, insp: asynq.NewInspectorFromRedisClient(rdb),
		run: run}, nil
}

// Skip is a position of an order's sequence that was given up without its
// change being applied: voided when its enqueue was refused, or skipped when
// no task ever came for it.
type Skip struct {
	// Seq is the position.
	Seq int64 `json:"seq"`
	// At is when it was given up.
	At time.Time `json:"at"`
	// Reason says why, for people.
	Reason string `json:"reason"`
}

// History is a page of an order's history: its applied changes, oldest
// first, and the latest positions its sequence skipped.
type History struct {
	OrderNo string         `json:"order_no"`
	Entries []orders.Entry `json:"entries"`
	// NextCursor, when not empty, reads the next page (HistoryQuery
	// Cursor); it is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
	// Skipped are the latest skipped positions of the order's sequence,
	// oldest first (the sequence remembers the last 20 settlements, and
	// only while it lives: see keyorder.SeqConfig.Retention). Never nil.
	Skipped []Skip `json:"skipped"`
}

// HistoryQuery selects a page of an order's history.
type HistoryQuery struct {
	// Cursor is the NextCursor of the page before; empty for the first
	// page.
	Cursor string
	// Limit is the page's size; see orders.HistoryQuery.Limit.
	Limit int
}

// maxCursor is the largest cursor History takes: a cursor is an entry's
// version, which the store's scripts count in Lua numbers, exact up to
// 2^53. Anything above is no cursor History handed out.
const maxCursor = 1<<53 - 1

// ErrBadCursor is returned by History for a cursor it did not hand out.
var ErrBadCursor = errors.New("orderview: bad cursor")

// History reads a page of order orderNo's history. It returns ErrBadCursor,
// the store's errors (orders.ErrNotFound for no such order) and Redis
// errors, wrapped.
func (r *Reader) History(ctx context.Context, orderNo string, q HistoryQuery) (History, error) {
	var after int64
	if q.Cursor != "" {
		n, err := strconv.ParseInt(q.Cursor, 10, 64)
		if err != nil || n <= 0 || n > maxCursor {
			return History{}, fmt.Errorf("%w: %q", ErrBadCursor, q.Cursor)
		}
		after = n
	}
	page, err := r.store.History(ctx, orderNo, orders.HistoryQuery{After: after, Limit: q.Limit})
	if err != nil {
		return History{}, err
	}
	entries := page.Entries
	st, err := r.seq.Status(ctx, orderNo)
	if err != nil {
		return History{}, fmt.Errorf("orderview: %w", err)
	}
	h := History{OrderNo: orderNo, Entries: entries, Skipped: []Skip{}}
	if page.Next > 0 {
		h.NextCursor = strconv.FormatInt(page.Next, 10)
	}
	if h.Entries == nil {
		h.Entries = []orders.Entry{}
	}
	for _, e := range st.Log {
		if e.Skipped() {
			h.Skipped = append(h.Skipped, Skip{Seq: e.Pos, At: e.At, Reason: e.Reason})
		}
	}
	return h, nil
}
