package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of fencing.
var _ = rules(
	rule{name: "WriteWithoutFence", ofWrites: testWriteWithoutFence},
	rule{name: "StaleFenceRefused", test: testStaleFence},
	rule{name: "EqualFenceAllowed", test: testEqualFence},
	rule{name: "ConcurrentWrites", test: testConcurrent},
	rule{name: "RefusalTellsTheNewest", test: testRefusalTellsTheNewest},
)

// A store never writes unfenced: no Write, or a fence that is not
// positive, is ErrNoFence.
//
// It runs for every fenced write the store implements.
func testWriteWithoutFence(t *testing.T, s orders.Store, ws []write) {
	eachWrite(t, s, ws, func(t *testing.T, w write) {
		no := "SO-" + w.name()
		Seed(t, s, no)
		for _, ctx := range []context.Context{
			t.Context(),
			orders.WithWrite(t.Context(), orders.Write{Worker: "w"}),
			orders.WithWrite(t.Context(), orders.Write{Fence: -1}),
		} {
			err := w.do(t, ctx, s, "evt-1", no)
			assert.ErrorIs(t, err, orders.ErrNoFence)
			assert.True(t, orders.Permanent(err))
		}
		assert.Equal(t, int64(1), get(t, s, no).Version)
		createdNothing(t, s, w, "evt-1", no)
	})
}

// A write with a fence older than the newest the order has seen fails
// with ErrStaleFence (not Permanent), writes nothing and records nothing:
// under a fresh fence the same event applies.
func testStaleFence(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("new holder")})
	require.NoError(t, err)
	before := get(t, s, "SO1")

	_, err = m.Modify(Fenced(t, baseFence-1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
	assert.False(t, orders.Permanent(err), "the work runs again under a fresh lock")
	assert.Equal(t, before, get(t, s, "SO1"))
	assert.Len(t, history(t, s, "SO1"), 2)

	res, err := m.Modify(Fenced(t, baseFence+1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	require.NoError(t, err)
	assert.False(t, res.Replayed, "the stale write was not recorded")
	assert.Equal(t, "late holder", get(t, s, "SO1").Address)

	// Fences are compared as integers, exactly, even above 2^53.
	_, err = m.Modify(Fenced(t, 1<<53+1), "evt-big", "SO1", aChange())
	require.NoError(t, err)
	_, err = m.Modify(Fenced(t, 1<<53), "evt-big-late", "SO1", aChange())
	assert.ErrorIs(t, err, orders.ErrStaleFence)
}

// One lock hold may write more than once: an equal fence is allowed.
func testEqualFence(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)
	res, err := m.Modify(Fenced(t, baseFence), "evt-2", "SO1", orders.Changes{Remark: new("b")})
	require.NoError(t, err)
	assert.Equal(t, int64(3), res.Order.Version)
}

// Concurrent writes with increasing fences are each applied or refused as
// stale, never lost: the version counts the applied ones.
func testConcurrent(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	const writers = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int64
		others  []error
	)
	for i := range writers {
		wg.Go(func() {
			_, err := m.Modify(Fenced(t, baseFence+int64(i)), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(fmt.Sprint(i))})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				applied++
			case !errors.Is(err, orders.ErrStaleFence):
				others = append(others, err)
			}
		})
	}
	wg.Wait()
	require.Empty(t, others)
	assert.Positive(t, applied)
	assert.Equal(t, 1+applied, get(t, s, "SO1").Version)
	assert.Len(t, history(t, s, "SO1"), int(1+applied))
}

// A refusal tells where the order stands (orders.WithNewest): a stale
// fence the order's newest fence, a passed position its newest applied
// position. After a failover of the worker's Redis that lost positions and
// fences, the worker writes again above them at once.
func testRefusalTellsTheNewest(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(At(t, baseFence, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)

	_, err = m.Modify(At(t, baseFence-1, 21), "evt-stale", "SO1", orders.Changes{Remark: new("stale")})
	require.ErrorIs(t, err, orders.ErrStaleFence)
	fence, _ := orders.Newest(err)
	assert.Equal(t, baseFence, fence, "a stale fence's refusal tells the newest fence: %v", err)

	_, err = m.Modify(At(t, baseFence+1, 20), "evt-passed", "SO1", orders.Changes{Remark: new("passed")})
	require.ErrorIs(t, err, orders.ErrPassed)
	_, seq := orders.Newest(err)
	assert.Equal(t, int64(20), seq, "a passed position's refusal tells the newest applied: %v", err)
}
