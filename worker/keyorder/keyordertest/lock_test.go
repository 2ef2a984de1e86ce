package keyordertest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
)

// TestLockerHoldsAKeyByHand: a Locker's lease is the engine's lock (a
// fence above the one before, the key's fence key and a handoff for a
// store's commit), and an AcquireTurn takes a reserved position's turn,
// which a release without a store's commit does not pass on.
func TestLockerHoldsAKeyByHand(t *testing.T) {
	db := redistest.New(t)
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	l, err := keyordertest.NewLocker(seq)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })

	first, err := l.Acquire(t.Context(), "K", "by hand")
	require.NoError(t, err)
	require.Positive(t, first.Fence())
	require.Contains(t, first.FenceKey(), "{K}")
	require.NoError(t, first.Release(t.Context()))

	pos, err := seq.Reserve(t.Context(), "K", "t id-1", "")
	require.NoError(t, err)
	turn, err := l.AcquireTurn(t.Context(), "K", "t id-1", pos, "t id-1", time.Second)
	require.NoError(t, err)
	require.Greater(t, turn.Fence(), first.Fence())
	require.NotNil(t, turn.Handoff(), "a turn's lease hands its turn to a store's commit")
	require.NoError(t, turn.Release(t.Context()))
	st, err := seq.Status(t.Context(), "K")
	require.NoError(t, err)
	require.Less(t, st.Done, pos, "a release with no store's commit leaves the turn where it was")

	_, err = keyordertest.NewLocker(nil)
	require.Error(t, err)
}
