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

// History is an order's history: its applied changes, oldest first, and the
// latest positions its sequence skipped.
type History struct {
	OrderNo string         `json:"order_no"`
	Entries []orders.Entry `json:"entries"`
	// Skipped are the latest skipped positions of the order's sequence,
	// oldest first (the sequence remembers the last 20 settlements, and
	// only while it lives: see lock.SeqConfig.Retention). Never nil.
	Skipped []Skip `json:"skipped"`
}

// History reads order orderNo's history. It returns the store's errors
// (orders.ErrNotFound for no such order) and Redis errors, wrapped.
func (r *Reader) History(ctx context.Context, orderNo string) (History, error) {
	entries, err := r.store.History(ctx, orderNo)
	if err != nil {
		return History{}, err
	}
	st, err := r.seq.Status(ctx, orderNo)
	if err != nil {
		return History{}, fmt.Errorf("orderview: %w", err)
	}
	h := History{OrderNo: orderNo, Entries: entries, Skipped: []Skip{}}
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
