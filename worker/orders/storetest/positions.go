package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of an order's positions.
var _ = rules(
	rule{name: "OlderPositionPassed", test: testPassed},
	rule{name: "OlderPositionPassedExchange", test: testPassedExchange},
	rule{name: "SeqOutOfTurnNotRecorded", test: testOutOfTurn},
)

// An order never moves back in its sequence: a write whose position is not
// after the newest applied fails with ErrPassed (Permanent) and writes
// nothing, while a replay is still a replay and a write without a position
// is not ordered.
func testPassed(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(At(t, baseFence, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err)
	_, err = m.Modify(At(t, baseFence+1, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)

	again, err := m.Modify(At(t, baseFence+2, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err, "a replay is answered, not refused")
	assert.True(t, again.Replayed)

	for _, seq := range []int64{15, 20} {
		_, err = m.Modify(At(t, baseFence+2, seq), fmt.Sprintf("evt-new-%d", seq), "SO1", orders.Changes{Remark: new("old")})
		assert.ErrorIs(t, err, orders.ErrPassed, "position %d after 20", seq)
		assert.True(t, orders.Permanent(err))
	}
	got := get(t, s, "SO1")
	assert.Equal(t, "twenty", got.Remark)
	assert.Equal(t, int64(3), got.Version, "the refusals wrote nothing")

	_, err = m.Modify(At(t, baseFence+3, 0), "evt-hand", "SO1", orders.Changes{Remark: new("by hand")})
	require.NoError(t, err, "a write without a position is not ordered")
	_, err = m.Modify(At(t, baseFence+4, 21), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err)
}

// An exchange at a passed position fails with ErrPassed, closes nothing,
// creates nothing and leaves the replacement's number free.
func testPassedExchange(t *testing.T, s orders.Store) {
	m, x := need[orders.Modifier](t, s), need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(At(t, baseFence, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)
	_, err = x.Exchange(At(t, baseFence+2, 12), "evt-12", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrPassed)
	assert.True(t, orders.Permanent(err))
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "a refused exchange creates nothing")
	assert.Equal(t, orders.StatusActive, get(t, s, "SO1").Status)

	// The replacement's number is free again after the refused exchange.
	Seed(t, s, "SO3")
	_, err = x.Exchange(Fenced(t, baseFence), "evt-x3", "SO3", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.NoError(t, err)
}

// A write run out of its turn (Write.SeqOutOfTurn) is checked against the
// newest position applied, but its position is never recorded, neither as
// the newest nor in the history: a forged far position does not hold back
// the order's next change in its turn.
func testOutOfTurn(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	outOfTurn := func(fence, seq int64) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, SeqOutOfTurn: true, Worker: "storetest"})
	}
	_, err := m.Modify(At(t, baseFence, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)
	_, err = m.Modify(outOfTurn(baseFence+1, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	assert.ErrorIs(t, err, orders.ErrPassed, "out of turn, an older position is still refused")
	_, err = m.Modify(outOfTurn(baseFence+1, 9000000000000000), "evt-forged", "SO1", orders.Changes{Remark: new("forged")})
	require.NoError(t, err, "a position after the newest applies")
	h := history(t, s, "SO1")
	last := h[len(h)-1]
	assert.Equal(t, "evt-forged", last.EventID)
	assert.Zero(t, last.Seq, "the out-of-turn position is not kept in the history")

	_, err = m.Modify(At(t, baseFence+2, 21), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err, "the next change in its turn applies: the forged position was not recorded")
	assert.Equal(t, "21", get(t, s, "SO1").Remark)
}
