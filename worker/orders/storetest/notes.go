package storetest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of notes, orders.Annotator.
var _ = rules(
	rule{name: "AnnotatorNotes", test: testAnnotate},
	rule{name: "AnnotatorKeepsWrites", test: testAnnotateKeepsWrites},
	rule{name: "AnnotatorKeepsRules", test: testAnnotateKeepsRules},
)

// annotator returns s as an orders.Annotator, or skips t.
func annotator(t *testing.T, s orders.Store) orders.Annotator {
	t.Helper()
	return need[orders.Annotator](t, s)
}

// A note is an entry of type TypeNote with the principal as Worker and
// the note's text as Detail, at the order's version: it follows the write
// of that version, pages with it, changes nothing of the order (not its
// version), and never creates an order.
func testAnnotate(t *testing.T, s orders.Store) {
	a, m := annotator(t, s), need[orders.Modifier](t, s)
	seeded := Seed(t, s, "SO1")
	n := orders.Note{By: "alice", Action: "hold", Reason: "customer called"}
	require.NoError(t, a.Annotate(t.Context(), "SO1", n))
	assert.Equal(t, seeded, get(t, s, "SO1"), "a note changes nothing of the order")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("after the note")})
	require.NoError(t, err)
	require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "bob", Action: "resume"}))

	o := get(t, s, "SO1")
	assert.Equal(t, int64(2), o.Version, "a note does not bump the version")
	assert.Equal(t, seeded.Address, o.Address)
	assert.Equal(t, "after the note", o.Remark)
	h := history(t, s, "SO1")
	require.Len(t, h, 4)
	var versions []int64
	var types []string
	for _, e := range h {
		versions = append(versions, e.Version)
		types = append(types, e.Type)
	}
	assert.Equal(t, []int64{1, 1, 2, 2}, versions, "each note at the version of the write it follows")
	assert.Equal(t, []string{orders.TypePut, orders.TypeNote, orders.TypeModify, orders.TypeNote}, types)
	for _, c := range []struct {
		e          orders.Entry
		by, detail string
	}{{h[1], "alice", "hold by alice: customer called"}, {h[3], "bob", "resume by bob"}} {
		assert.Equal(t, orders.TypeNote, c.e.Type)
		assert.Equal(t, c.by, c.e.Worker)
		assert.Equal(t, c.detail, c.e.Detail)
		assert.Empty(t, c.e.EventID)
		assert.Zero(t, c.e.Fence)
		assert.Zero(t, c.e.Seq)
	}

	// Pages follow the writes' versions, each write with its notes.
	p, err := s.History(t.Context(), "SO1", orders.HistoryQuery{Limit: 1})
	require.NoError(t, err)
	require.Len(t, p.Entries, 2)
	assert.Equal(t, []string{orders.TypePut, orders.TypeNote}, []string{p.Entries[0].Type, p.Entries[1].Type})
	assert.Equal(t, int64(1), p.Next)
	p, err = s.History(t.Context(), "SO1", orders.HistoryQuery{After: p.Next})
	require.NoError(t, err)
	require.Len(t, p.Entries, 2)
	assert.Equal(t, []string{orders.TypeModify, orders.TypeNote}, []string{p.Entries[0].Type, p.Entries[1].Type})
	assert.Zero(t, p.Next)

	err = a.Annotate(t.Context(), "SO404", n)
	assert.ErrorIs(t, err, orders.ErrNotFound)
	_, err = s.Get(t.Context(), "SO404")
	assert.ErrorIs(t, err, orders.ErrNotFound, "a note never creates an order")
	assert.ErrorIs(t, a.Annotate(t.Context(), "SO1", orders.Note{Action: "hold"}), orders.ErrInvalid, "a note needs a principal")
	assert.ErrorIs(t, a.Annotate(t.Context(), "SO 1", n), orders.ErrInvalid)
}

// However many notes come, none pushes a write out of the history: the
// writes kept are those the store would keep without a note.
func testAnnotateKeepsWrites(t *testing.T, s orders.Store) {
	a, m := annotator(t, s), need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(At(t, baseFence, 1), "evt-1", "SO1", orders.Changes{Remark: new("one")})
	require.NoError(t, err)
	for i := range 1100 {
		require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "alice", Action: fmt.Sprint("hold ", i)}))
	}
	var writes []string
	for _, e := range history(t, s, "SO1") {
		if e.Type != orders.TypeNote {
			writes = append(writes, e.Type)
		}
	}
	assert.Equal(t, []string{orders.TypePut, orders.TypeModify}, writes, "every write is still in the history")
}

// A note writes no fence, position or event: dedupe, ErrPassed and
// ErrStaleFence answer as they did before it, and an exchange still
// closes the order and creates its replacement.
func testAnnotateKeepsRules(t *testing.T, s orders.Store) {
	a, m, ex := annotator(t, s), need[orders.Modifier](t, s), need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(At(t, baseFence+10, 5), "evt-1", "SO1", orders.Changes{Remark: new("one")})
	require.NoError(t, err)
	require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "alice", Action: "skipped position 6", Reason: "bad data"}))

	r, err := m.Modify(At(t, baseFence+10, 5), "evt-1", "SO1", orders.Changes{Remark: new("one")})
	require.NoError(t, err)
	assert.True(t, r.Replayed, "the event is still applied")
	_, err = m.Modify(At(t, baseFence+10, 5), "evt-2", "SO1", orders.Changes{Remark: new("two")})
	assert.ErrorIs(t, err, orders.ErrPassed, "the newest position is still 5")
	_, err = m.Modify(At(t, baseFence+9, 7), "evt-3", "SO1", orders.Changes{Remark: new("three")})
	assert.ErrorIs(t, err, orders.ErrStaleFence, "the newest fence is still the modify's")
	_, err = m.Modify(At(t, baseFence+10, 7), "evt-4", "SO1", orders.Changes{Remark: new("four")})
	require.NoError(t, err, "an equal fence at a later position applies")

	x, err := ex.Exchange(At(t, baseFence+11, 8), "evt-5", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	assert.Equal(t, "SO2", x.Order.No)
	assert.Equal(t, "four", x.Order.Remark)
	assert.Equal(t, orders.StatusExchanged, get(t, s, "SO1").Status)
	require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "alice", Action: "resume"}), "a closed order takes notes")
	assert.Equal(t, orders.StatusExchanged, get(t, s, "SO1").Status, "and stays closed")
	_, err = m.Modify(At(t, baseFence+12, 9), "evt-6", "SO1", orders.Changes{Remark: new("six")})
	assert.ErrorIs(t, err, orders.ErrClosed)
}
