package redisstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
)

// TestCommitCountsInTheBacklog commits the head of an order with three
// positions through the store's script, which passes the turn on
// (keyorder.Handoff): the engine's index of backlogs counts one position
// fewer behind the new head, as the engine's own release would.
func TestCommitCountsInTheBacklog(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	locker, err := keyordertest.NewLocker(seq)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close() })
	require.NoError(t, s.Put(ctx, orders.Order{No: "SO1", Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	var pos []int64
	for i := range 3 {
		p, err := seq.Reserve(ctx, "SO1", "order:modify e"+string(rune('0'+i)), "")
		require.NoError(t, err)
		pos = append(pos, p)
	}
	got, err := seq.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, keyorder.Backlog{Keys: 1, Positions: 2, Deepest: 2}, got)

	l, err := locker.AcquireTurn(ctx, "SO1", "test", pos[0], "order:modify e0", time.Second)
	require.NoError(t, err)
	remark := "ring"
	wctx := orders.WithWrite(ctx, orders.Write{Fence: l.Fence(), Worker: "host-1", StartedAt: time.Now(), Seq: pos[0], NoResult: true, Commit: l})
	_, err = s.Modify(wctx, "e0", "SO1", orders.Changes{Remark: &remark})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	st, err := seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.Equal(t, pos[0], st.Done, "the commit passed the turn on")
	got, err = seq.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, keyorder.Backlog{Keys: 1, Positions: 1, Deepest: 1}, got)
}
