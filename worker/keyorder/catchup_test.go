package keyorder_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// A store that outlived a failover has applied positions and fences that
// the key's Redis lost: the holder moves the key above them, and every
// later holder of the key stays above them.
func TestCatchUpMovesTheKeyAboveTheStore(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	const key = "SO-ahead"
	turns := reserve(t, l.Sequencer(), key, 3)

	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	require.Equal(t, turns[0].Pos, lease.Seq(), "no offset before a catch-up")
	// The old master's clock ran 30 s ahead, and it handed out positions
	// up to turns[2] + 5 that this Redis never saw.
	ahead := keyorder.StoreAhead{Fence: lease.Fence() + int64(30*time.Second/time.Microsecond), Pos: turns[2].Pos + 5}
	moved, err := lease.CatchUp(t.Context(), ahead)
	require.NoError(t, err)
	require.True(t, moved)
	require.Greater(t, lease.Fence(), ahead.Fence)
	require.Equal(t, ahead.Pos+1, lease.Seq())
	moved, err = lease.CatchUp(t.Context(), ahead)
	require.NoError(t, err)
	require.False(t, moved, "caught up already")
	first := lease.Fence()
	lease.Finish()
	require.NoError(t, lease.Release(t.Context()))

	next, err := l.AcquireTurn(t.Context(), key, "m", turns[1], slow)
	require.NoError(t, err)
	require.Greater(t, next.Fence(), first, "the next hold's fence is above the caught-up one")
	require.Equal(t, ahead.Pos+2, next.Seq(), "the offset stays: the positions keep their order")
	next.Finish()
	require.NoError(t, next.Release(t.Context()))
}

// A holder that lost its lock cannot take a new fence or move the
// positions, but the fence counter still rises: the next holder's fence is
// above the store's.
func TestCatchUpWithoutTheLockRaisesOnlyTheFenceCounter(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	const key = "SO-ahead-lost"
	turns := reserve(t, l.Sequencer(), key, 2)
	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	fence := lease.Fence()
	require.NoError(t, db.Client.Del(t.Context(), db.Prefix+"lock:{"+key+"}").Err())
	ahead := keyorder.StoreAhead{Fence: fence + 1_000_000_000, Pos: turns[1].Pos + 10}
	moved, err := lease.CatchUp(t.Context(), ahead)
	require.NoError(t, err)
	require.False(t, moved)
	require.Equal(t, fence, lease.Fence())
	require.Equal(t, turns[0].Pos, lease.Seq())
	_ = lease.Release(t.Context())

	other, err := l.TryAcquire(t.Context(), key, "other")
	require.NoError(t, err)
	require.Greater(t, other.Fence(), ahead.Fence)
	require.NoError(t, other.Release(t.Context()))
}

// Only a position in its turn moves the key's positions: a lease of a
// position already passed (run again by hand) keeps the store's refusal.
func TestCatchUpMovesNoPositionOutOfTurn(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	const key = "SO-ahead-passed"
	turns := reserve(t, l.Sequencer(), key, 1)
	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	lease.Finish()
	require.NoError(t, lease.Release(t.Context()))

	again, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModePassed, again.Mode())
	moved, err := again.CatchUp(t.Context(), keyorder.StoreAhead{Pos: turns[0].Pos})
	require.NoError(t, err)
	require.False(t, moved)
	require.Equal(t, turns[0].Pos, again.Seq())
	require.NoError(t, again.Release(t.Context()))
}

// What no failover makes is refused: a fence a day ahead of Redis's clock,
// a position 2^50 ahead.
func TestCatchUpRefusesWhatNoFailoverMakes(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	const key = "SO-ahead-bogus"
	turns := reserve(t, l.Sequencer(), key, 1)
	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	defer func() { require.NoError(t, lease.Release(t.Context())) }()
	fence := lease.Fence()
	tests := []struct {
		name  string
		ahead keyorder.StoreAhead
	}{
		{"fence past a day ahead", keyorder.StoreAhead{Fence: fence + 2*keyorder.MaxAhead}},
		{"position too far", keyorder.StoreAhead{Pos: turns[0].Pos + 1<<51}},
		{"negative", keyorder.StoreAhead{Fence: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			moved, err := lease.CatchUp(t.Context(), tt.ahead)
			require.Error(t, err)
			require.False(t, moved)
			require.Equal(t, fence, lease.Fence())
			require.Equal(t, turns[0].Pos, lease.Seq())
		})
	}
}

func TestAheadOf(t *testing.T) {
	t.Parallel()
	a := &keyorder.StoreAhead{Fence: 7}
	require.Same(t, a, keyorder.AheadOf(fmt.Errorf("write: %w: %w", keyorder.ErrStaleFence, a)))
	require.Nil(t, keyorder.AheadOf(keyorder.ErrStaleFence))
	require.Nil(t, keyorder.AheadOf(&keyorder.StoreAhead{}), "nothing known is nothing to catch up with")
}

// aheadStore is a store on another system that outlived a failover of the
// key's Redis: it has applied positions and a fence that Redis lost. It
// checks as docs/upstream-order-api.md says (the position, then the
// fence), and tells one newest value per refusal, the worst case.
type aheadStore struct {
	mu      sync.Mutex
	fence   int64
	pos     int64
	applied []ran
}

func (s *aheadStore) write(_ context.Context, b body, run keyorder.Run) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case run.Pos <= s.pos:
		return fmt.Errorf("position %d passed: %w", run.Pos, &keyorder.StoreAhead{Pos: s.pos})
	case run.Fence < s.fence:
		return fmt.Errorf("fence %d: %w: %w", run.Fence, keyorder.ErrStaleFence, &keyorder.StoreAhead{Fence: s.fence})
	}
	s.fence, s.pos = run.Fence, run.Pos
	s.applied = append(s.applied, ran{Key: run.Key, N: b.N, Pos: run.Pos, Fence: run.Fence})
	return nil
}

func (s *aheadStore) all() []ran {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.applied)
}

// After a failover that lost positions and fences, a Runner's tasks meet a
// store that is ahead: each runs again at once in its hold, above it, in
// order, without a failure and without waiting for the new master's clock.
func TestRunnerCatchesUpWithAStoreAhead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	var es []keyorder.Enqueued
	for n := range 3 {
		es = append(es, enqueue(t, c, "K", n+1, asynq.MaxRetry(0), asynq.Retention(time.Hour)))
	}
	// The old master applied two positions this Redis re-handed out, with
	// fences from a clock a minute ahead.
	store := &aheadStore{pos: es[1].Pos, fence: time.Now().Add(time.Minute).UnixMicro()}
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(store.write))
	eventually(t, func() bool { return len(store.all()) == 3 }, "the tasks were not applied: %v", rc.all())
	got := store.all()
	for i, a := range got {
		require.Equal(t, i+1, a.N, "applied in order: %v", got)
		require.Equal(t, es[1].Pos+int64(i)+1, a.Pos, "positions above the store's, in order: %v", got)
		if i > 0 {
			require.GreaterOrEqual(t, a.Fence, got[i-1].Fence)
		}
	}
	require.Greater(t, got[0].Fence, time.Now().Add(30*time.Second).UnixMicro(), "the first write was accepted at once, above the store's fence")
	for _, e := range es {
		requireState(t, db.Client, e, asynq.TaskStateCompleted, "")
	}
}
