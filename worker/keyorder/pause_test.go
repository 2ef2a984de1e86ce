package keyorder_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// A paused sequence still hands out positions, but its head parks instead
// of taking its turn, the sequence loses its TTL while paused and is
// listed in the index; Resume calls the parked head back, and the turns go
// on in order.
func TestPauseParksTheHeadUntilResume(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	turns := newTurns(t, l, f, time.Minute)
	seq := l.Sequencer()
	ctx := t.Context()
	pos := reserve(t, seq, "SO-hold", 1)

	p, err := seq.Pause(ctx, "SO-hold", "alice", "customer called")
	require.NoError(t, err)
	require.Equal(t, "alice", p.By)
	_, err = seq.Pause(ctx, "SO-hold", "bob", "again")
	var pe *keyorder.PausedError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, keyorder.ErrPaused)
	require.Equal(t, "alice", pe.Pause.By)

	// Accepted while paused: the reservation keeps the sequence persisted.
	pos = append(pos, reserve(t, seq, "SO-hold", 1)...)
	ttl, err := db.Client.TTL(ctx, seq.SeqKey("SO-hold")).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a paused sequence does not expire")

	_, _, err = turns.Take(ctx, "SO-hold", "first", pos[0], quick)
	var park *keyorder.ParkError
	require.ErrorAs(t, err, &park)
	require.ErrorIs(t, err, keyorder.ErrNotYourTurn)
	require.NotNil(t, park.Err.Paused)
	require.Equal(t, "customer called", park.Err.Paused.Reason)
	require.True(t, park.Err.Parked)
	require.Equal(t, time.Minute, park.Delay)

	st, err := seq.Status(ctx, "SO-hold")
	require.NoError(t, err)
	require.NotNil(t, st.Paused)
	require.Equal(t, "alice", st.Paused.By)
	require.EqualValues(t, 2, st.Waiting)
	keys, err := seq.PausedKeys(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "SO-hold", keys[0].Key)

	_, done, err := seq.Resume(ctx, "SO-hold")
	require.NoError(t, err)
	require.Equal(t, []string{pos[0].Label}, done.Wake, "the parked head is called back")
	ttl, err = db.Client.TTL(ctx, seq.SeqKey("SO-hold")).Result()
	require.NoError(t, err)
	require.Positive(t, ttl)
	keys, err = seq.PausedKeys(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, keys)
	_, _, err = seq.Resume(ctx, "SO-hold")
	require.ErrorIs(t, err, keyorder.ErrNotPaused)

	for i, p := range pos {
		lease, _, err := turns.Take(ctx, "SO-hold", "holder", p, quick)
		require.NoError(t, err, "position %d", i)
		require.Equal(t, keyorder.ModeTurn, lease.Mode())
		turns.Pass(ctx, lease, true, time.Time{}, true)
	}
}

// A sequence paused before any change was accepted is made paused: the
// changes accepted later wait; a task without a position is not held.
func TestPauseBeforeAnyChange(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	seq := l.Sequencer()
	ctx := t.Context()
	_, err := seq.Pause(ctx, "SO-new", "ops", "audit")
	require.NoError(t, err)
	st, err := seq.Status(ctx, "SO-new")
	require.NoError(t, err)
	require.True(t, st.Exists)
	require.NotNil(t, st.Paused)

	pos := reserve(t, seq, "SO-new", 1)
	ttl, err := db.Client.TTL(ctx, seq.SeqKey("SO-new")).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl)
	_, err = l.AcquireTurn(ctx, "SO-new", "m", pos[0], quick)
	var te *keyorder.TurnError
	require.True(t, errors.As(err, &te) && te.Paused != nil, "got %v", err)

	free, err := l.TryAcquire(ctx, "SO-new", "by hand")
	require.NoError(t, err, "a task without a position is not ordered, and not held")
	require.NoError(t, free.Release(ctx))

	require.NoError(t, seq.Record(ctx, "SO-new", 0, "operator", "resumed by ops: done"))
	_, _, err = seq.Resume(ctx, "SO-new")
	require.NoError(t, err)
	st, err = seq.Status(ctx, "SO-new")
	require.NoError(t, err)
	require.Nil(t, st.Paused)
	require.Equal(t, "action", st.Log[len(st.Log)-1].Kind)
	lease, err := l.AcquireTurn(ctx, "SO-new", "m", pos[0], quick)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
}
