package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of reads and puts, which every store keeps.
var _ = rules(
	rule{name: "PutAndGet", test: testPutAndGet},
	rule{name: "PutInvalid", test: testPutInvalid},
	rule{name: "NotFound", ofWrites: testNotFound},
	rule{name: "HistoryPages", test: testHistoryPages},
)

// Put creates an active order at version 1 with a put entry; a second put
// replaces it, bumps the version and appends an entry.
func testPutAndGet(t *testing.T, s orders.Store) {
	o := Seed(t, s, "SO1")
	assert.Equal(t, orders.Order{No: "SO1", Status: orders.StatusActive, Address: "1 Old Street", Remark: "ring twice",
		Items: oldItems, Version: 1, UpdatedAt: o.UpdatedAt}, o)
	assert.False(t, o.UpdatedAt.IsZero(), "updated_at is set")

	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO1", Status: orders.StatusCancelled, Version: 99}))
	o = get(t, s, "SO1")
	assert.Equal(t, orders.StatusCancelled, o.Status)
	assert.Equal(t, int64(2), o.Version, "the version is the store's, not the caller's")
	assert.NotNil(t, o.Items, "items are never nil when read")
	assert.Empty(t, o.Items)

	h := history(t, s, "SO1")
	require.Len(t, h, 2)
	for i, e := range h {
		assert.Equal(t, orders.TypePut, e.Type)
		assert.Equal(t, int64(i+1), e.Version)
		assert.Zero(t, e.Fence, "a put is not fenced")
	}
}

func testPutInvalid(t *testing.T, s orders.Store) {
	for _, o := range []orders.Order{
		{},
		{No: "SO{1}"},
		{No: "SO 1"},
		{No: "SO1", Status: "lost"},
		{No: "SO1", ExchangedTo: "B B"},
		{No: "SO1", Items: []orders.Item{{Qty: 1}}},
		{No: "SO1", Items: []orders.Item{{SKU: "x"}}},
	} {
		err := s.Put(t.Context(), o)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", o)
		assert.True(t, orders.Permanent(err))
	}
}

// An unknown order is ErrNotFound for every read and every write, and a
// write creates nothing (neither the order nor, for an exchange, its
// replacement); a malformed number is ErrInvalid.
func testNotFound(t *testing.T, s orders.Store, ws []write) {
	_, err := s.Get(t.Context(), "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
	assert.True(t, orders.Permanent(err))
	_, err = s.History(t.Context(), "NOPE", orders.HistoryQuery{})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	eachWrite(t, s, ws, func(t *testing.T, w write) {
		err := w.do(t, Fenced(t, baseFence), s, "evt-1", "NOPE")
		assert.ErrorIs(t, err, orders.ErrNotFound)
		assert.True(t, orders.Permanent(err))
		_, err = s.Get(t.Context(), "NOPE")
		assert.ErrorIs(t, err, orders.ErrNotFound, "the write created the order")
		createdNothing(t, s, w, "evt-1", "NOPE")
	})
	_, err = s.Get(t.Context(), "no/pe")
	assert.ErrorIs(t, err, orders.ErrInvalid)
	_, err = s.History(t.Context(), "", orders.HistoryQuery{})
	assert.ErrorIs(t, err, orders.ErrInvalid)
}

// The history is read in pages of at most Limit entries, oldest first,
// following the versions: every entry once; past the newest, an empty
// page whose Next is 0.
func testHistoryPages(t *testing.T, s orders.Store) {
	for range 8 {
		Seed(t, s, "SO1")
	}
	var versions []int64
	q := orders.HistoryQuery{Limit: 2}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "Next never reached 0")
		p, err := s.History(t.Context(), "SO1", q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Entries), 2)
		for _, e := range p.Entries {
			versions = append(versions, e.Version)
		}
		if p.Next == 0 {
			break
		}
		q.After = p.Next
	}
	assert.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8}, versions)

	p, err := s.History(t.Context(), "SO1", orders.HistoryQuery{After: 5})
	require.NoError(t, err)
	require.NotEmpty(t, p.Entries)
	assert.Equal(t, int64(6), p.Entries[0].Version, "a page starts after its cursor")
	assert.Len(t, p.Entries, 3)
	p, err = s.History(t.Context(), "SO1", orders.HistoryQuery{After: 8})
	require.NoError(t, err)
	assert.Empty(t, p.Entries)
	assert.Zero(t, p.Next)
}
