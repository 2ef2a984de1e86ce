package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of dedupe: at most once per event ID.
var _ = rules(
	rule{name: "DedupeReturnsRecordedOutcome", test: testDedupe},
	rule{name: "DedupeAfterClose", test: testDedupeAfterClose},
	rule{name: "EventReusedIsConflict", ofWrites: testEventReused},
	rule{name: "PutKeepsFenceAndEvents", test: testPutKeeps},
)

// A repeat of an applied event writes nothing and answers Replayed, under
// any fence, after the order moved on.
func testDedupe(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	_, err = m.Modify(Fenced(t, baseFence+1), "evt-2", "SO1", orders.Changes{Address: new("second")})
	require.NoError(t, err)

	again, err := m.Modify(Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.Equal(t, "SO1", again.Order.No)
	got := get(t, s, "SO1")
	assert.Equal(t, "second", got.Address, "the replay wrote nothing")
	assert.Equal(t, int64(3), got.Version)
	assert.Len(t, history(t, s, "SO1"), 3)
}

// A repeat of an applied change is a replay even after its order closed.
func testDedupeAfterClose(t *testing.T, s orders.Store) {
	m, x := need[orders.Modifier](t, s), need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	_, err = x.Exchange(Fenced(t, baseFence+1), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	again, err := m.Modify(Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err, "a repeat of an applied change is a replay, even of a closed order")
	assert.True(t, again.Replayed)
}

// An event ID applied once may not be used for another request: a modify
// with other changes, or another write, is ErrConflict naming the event.
func testEventReused(t *testing.T, s orders.Store, ws []write) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)
	_, err = m.Modify(Fenced(t, baseFence+1), "evt-1", "SO1", orders.Changes{Address: new("b")})
	assert.ErrorIs(t, err, orders.ErrConflict)
	assert.ErrorContains(t, err, "evt-1")
	assert.True(t, orders.Permanent(err))
	for _, w := range ws {
		if !w.has(t, s) {
			continue
		}
		err = w.do(t, Fenced(t, baseFence+1), s, "evt-1", "SO1")
		assert.ErrorIs(t, err, orders.ErrConflict, "the modify's event reused by %s", w.kind.Kind)
		createdNothing(t, s, w, "evt-1", "SO1")
	}
	got := get(t, s, "SO1")
	assert.Equal(t, orders.StatusActive, got.Status)
	assert.Equal(t, int64(2), got.Version)
}

// A put replaces the order but neither resets its fence nor forgets its
// events.
func testPutKeeps(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", aChange())
	require.NoError(t, err)
	Seed(t, s, "SO1")
	_, err = m.Modify(Fenced(t, baseFence-1), "evt-2", "SO1", aChange())
	assert.ErrorIs(t, err, orders.ErrStaleFence, "a put does not reset the fence")
	res, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", aChange())
	require.NoError(t, err)
	assert.True(t, res.Replayed, "a put does not forget events")
}
