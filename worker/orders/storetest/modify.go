package storetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of the modify write, orders.Modifier.
var _ = rules(
	rule{name: "Modify", test: testModify},
	rule{name: "ModifyInvalid", test: testModifyInvalid},
)

// A store that forwards changes is held to the modify's rules through its
// Forward.
var _ = forwards(func(_ orders.Store, f orders.Forwarder) orders.Modifier { return forwardedModify{f} })

// forwardedModify is the modify of a store that forwards changes: a
// task's payload made of the request, forwarded.
type forwardedModify struct{ f orders.Forwarder }

func (m forwardedModify) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	return forward(ctx, m.f, tasks.ModifyPayload{EventID: eventID, OrderNo: orderNo,
		Changes: tasks.Changes{Address: c.Address, Remark: c.Remark, Items: c.Items}})
}

// A modify sets the fields it names, keeps the others, bumps the version
// and appends an entry with the event, the fence and the writer.
func testModify(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	before := Seed(t, s, "SO1")
	res, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new(`"Flat 3/4", 5 {Quay} Street` + "\n\u4e2d"), Items: newItems})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	want := before
	want.Address, want.Items, want.Version = `"Flat 3/4", 5 {Quay} Street`+"\n\u4e2d", newItems, 2
	want.UpdatedAt = res.Order.UpdatedAt
	assert.Equal(t, want, res.Order, "Result.Order is the order as the write left it")
	got := get(t, s, "SO1")
	want.UpdatedAt = got.UpdatedAt
	assert.Equal(t, want, got)

	_, err = m.Modify(Fenced(t, baseFence), "evt-2", "SO1", orders.Changes{Remark: new("")})
	require.NoError(t, err)
	assert.Empty(t, get(t, s, "SO1").Remark, "a remark may be emptied")
	writes := 3
	if own, ok := s.(orders.Modifier); ok {
		// A modify without changes is no task's (tasks.ModifyPayload
		// refuses it): only a store's own Modify is asked, not a
		// forwarding store, which is given tasks' changes only.
		res, err = own.Modify(Fenced(t, baseFence), "evt-3", "SO1", orders.Changes{})
		require.NoError(t, err)
		assert.Equal(t, int64(4), res.Order.Version, "a modify without changes is still a write")
		writes++
	}

	h := history(t, s, "SO1")
	require.Len(t, h, writes)
	e := h[1]
	assert.Equal(t, []any{"evt-1", orders.TypeModify, baseFence, "storetest", int64(2)},
		[]any{e.EventID, e.Type, e.Fence, e.Worker, e.Version})
}

// aChange is a modify's change that a task may carry, for the rules that
// need a write and not a particular one.
func aChange() orders.Changes { return orders.Changes{Remark: new("changed")} }

func testModifyInvalid(t *testing.T, s orders.Store) {
	m := need[orders.Modifier](t, s)
	Seed(t, s, "SO1")
	for _, tt := range []struct {
		eventID, orderNo string
		c                orders.Changes
	}{
		{"", "SO1", aChange()},
		{"evt\x1f1", "SO1", aChange()},
		{"evt/1", "SO1", aChange()},
		{"evt", "SO 1", aChange()},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{}}},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{{SKU: "x"}}}},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{{Qty: 1}}}},
	} {
		_, err := m.Modify(Fenced(t, baseFence), tt.eventID, tt.orderNo, tt.c)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", tt)
		assert.True(t, orders.Permanent(err))
	}
	assert.Equal(t, int64(1), get(t, s, "SO1").Version)
}
