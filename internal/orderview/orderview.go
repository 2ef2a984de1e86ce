// Package orderview reads what an order looks like to people: its history
// with the positions its sequence skipped. The intake's read API and the
// command line serve the same views from it, so they never disagree.
//
// It only reads: the order store (internal/orders) and the order's sequence
// (internal/lock). It is safe for concurrent use.
package orderview

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/redis/go-redis/v9"
)

// Reader reads the views of orders.
type Reader struct {
	store orders.Store
	seq   *lock.Sequencer
}

// New returns a Reader of the orders in store whose sequences live in rdb
// under keyPrefix (KEY_PREFIX, "ow:" by default). It returns an error for a
// nil dependency or a bad prefix.
func New(rdb redis.UniversalClient, store orders.Store, keyPrefix string) (*Reader, error) {
	if store == nil {
		return nil, errors.New("orderview: nil order store")
	}
	seq, err := lock.NewSequencer(rdb, lock.SeqConfig{Prefix: keyPrefix + "lock:"})
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	return &Reader{store: store, seq: seq}, nil
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
	// only while it lives: see lock.SeqConfig.Retention). Never nil.
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

// ErrBadCursor is returned by History for a cursor it did not hand out.
var ErrBadCursor = errors.New("orderview: bad cursor")

// History reads a page of order orderNo's history. It returns ErrBadCursor,
// the store's errors (orders.ErrNotFound for no such order) and Redis
// errors, wrapped.
func (r *Reader) History(ctx context.Context, orderNo string, q HistoryQuery) (History, error) {
	var after int64
	if q.Cursor != "" {
		n, err := strconv.ParseInt(q.Cursor, 10, 64)
		if err != nil || n <= 0 {
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
