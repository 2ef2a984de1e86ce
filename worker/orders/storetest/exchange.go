package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The rules of the exchange write, orders.Exchanger.
var _ = rules(
	rule{name: "Exchange", test: testExchange},
	rule{name: "ExchangeDerivedNumber", test: testExchangeDerived},
	rule{name: "ExchangeRetryCompletes", test: testExchangeRetry},
	rule{name: "ExchangeRefusals", test: testExchangeRefusals},
	rule{name: "ExchangeStaleFenceRefused", test: testExchangeStale},
	rule{name: "ClosedOrderRefused", test: testClosed},
)

// A store that forwards changes is held to the exchange's rules through
// its Forward.
var _ = forwards(func(s orders.Store, f orders.Forwarder) orders.Exchanger { return forwardedExchange{s, f} })

// forwardedExchange is the exchange of a store that forwards changes: a
// task's payload made of the request, forwarded. Forward's Result.Order
// is the exchanged order, as the change left it; Exchange's is the
// replacement, read after it.
type forwardedExchange struct {
	s orders.Store
	f orders.Forwarder
}

func (x forwardedExchange) Exchange(ctx context.Context, eventID, orderNo string, e orders.Exchange) (orders.Result, error) {
	p := tasks.ExchangePayload{EventID: eventID, OrderNo: orderNo, Items: e.Items, NewOrderNo: e.NewOrderNo, Reason: e.Reason}
	res, err := forward(ctx, x.f, p)
	if err != nil {
		return orders.Result{}, err
	}
	b, err := x.s.Get(ctx, p.Replacement())
	if err != nil {
		return orders.Result{}, fmt.Errorf("the replacement of the forwarded exchange: %w", err)
	}
	return orders.Result{Order: b, Replayed: res.Replayed}, nil
}

// An exchange closes A as exchanged to B and creates B, active, with the
// new items and A's address and remark; A keeps its items. Both histories
// carry the event and the fence.
func testExchange(t *testing.T, s orders.Store) {
	ex := need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	res, err := ex.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2", Reason: "wrong size"})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	b := res.Order
	assert.Equal(t, orders.Order{No: "SO2", Status: orders.StatusActive, Address: "1 Old Street", Remark: "ring twice",
		Items: newItems, Version: 1, ExchangedFrom: "SO1", UpdatedAt: b.UpdatedAt}, b, "Result.Order is the replacement")
	got := get(t, s, "SO2")
	b.UpdatedAt = got.UpdatedAt
	assert.Equal(t, b, got)

	a := get(t, s, "SO1")
	assert.Equal(t, orders.StatusExchanged, a.Status)
	assert.Equal(t, "SO2", a.ExchangedTo)
	assert.Equal(t, int64(2), a.Version)
	assert.Equal(t, oldItems, a.Items, "the exchanged order keeps its items")

	ha := history(t, s, "SO1")
	require.Len(t, ha, 2)
	assert.Equal(t, []any{"evt-x", orders.TypeExchange, baseFence, int64(2)}, []any{ha[1].EventID, ha[1].Type, ha[1].Fence, ha[1].Version})
	hb := history(t, s, "SO2")
	require.Len(t, hb, 1)
	assert.Equal(t, []any{"evt-x", orders.TypeCreated, baseFence, int64(1)}, []any{hb[0].EventID, hb[0].Type, hb[0].Fence, hb[0].Version})

	// The replacement is an order like any other.
	if m, ok := s.(orders.Modifier); ok {
		res, err = m.Modify(Fenced(t, baseFence+1), "evt-m", "SO2", orders.Changes{Remark: new("new")})
		require.NoError(t, err)
		assert.Equal(t, int64(2), res.Order.Version)
	}
}

// Without NewOrderNo the replacement is numbered by
// tasks.ReplacementOrderNo, so that a retry creates the same one.
func testExchangeDerived(t *testing.T, s orders.Store) {
	ex := need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	want := tasks.ReplacementOrderNo("SO1", "evt-x")
	res, err := ex.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems})
	require.NoError(t, err)
	assert.Equal(t, want, res.Order.No)
	assert.Equal(t, want, get(t, s, "SO1").ExchangedTo)
	assert.Equal(t, "SO1", get(t, s, want).ExchangedFrom)
}

// A retry of an exchange, under a newer fence, completes it (it is done
// already here: a replay) and returns the replacement, creating nothing
// twice.
func testExchangeRetry(t *testing.T, s orders.Store) {
	ex := need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	x := orders.Exchange{Items: newItems}
	first, err := ex.Exchange(Fenced(t, baseFence), "evt-x", "SO1", x)
	require.NoError(t, err)
	for i := range 2 {
		again, err := ex.Exchange(Fenced(t, baseFence+1+int64(i)), "evt-x", "SO1", x)
		require.NoError(t, err)
		assert.True(t, again.Replayed)
		assert.Equal(t, first.Order.No, again.Order.No, "a retry returns the same replacement")
	}
	assert.Equal(t, int64(2), get(t, s, "SO1").Version, "the order was closed once")
	assert.Equal(t, int64(1), get(t, s, first.Order.No).Version, "the replacement was created once")
	assert.Len(t, history(t, s, first.Order.No), 1)
}

// An exchange whose replacement number is taken by an unrelated order is
// ErrConflict and changes nothing; an invalid one is ErrInvalid.
func testExchangeRefusals(t *testing.T, s orders.Store) {
	ex := need[orders.Exchanger](t, s)
	a := Seed(t, s, "SO1")
	b := Seed(t, s, "SO2")
	_, err := ex.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrConflict)
	assert.True(t, orders.Permanent(err))
	assert.ErrorContains(t, err, "SO2")
	for _, want := range []orders.Order{a, b} {
		assert.Equal(t, want, get(t, s, want.No), "nothing changed")
		assert.Len(t, history(t, s, want.No), 1)
	}
	for _, x := range []orders.Exchange{
		{NewOrderNo: "SO3"},
		{Items: []orders.Item{{SKU: "x", Qty: -1}}, NewOrderNo: "SO3"},
		{Items: newItems, NewOrderNo: "SO{3}"},
		{Items: newItems, NewOrderNo: "SO1"},
		{Items: newItems, NewOrderNo: "SO3", Reason: "a\x1fb"},
		{Items: newItems, NewOrderNo: "SO3", Reason: "bad\x00byte"},
		{Items: newItems, NewOrderNo: "SO3", Reason: strings.Repeat("r", tasks.MaxReasonLen+1)},
	} {
		_, err := ex.Exchange(Fenced(t, baseFence), "evt-y", "SO1", x)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", x)
	}
	for _, id := range []string{"", "evt\x1fy", "evt y"} {
		_, err = ex.Exchange(Fenced(t, baseFence), id, "SO1", orders.Exchange{Items: newItems})
		assert.ErrorIs(t, err, orders.ErrInvalid, "event ID %q", id)
	}
	assert.Equal(t, orders.StatusActive, get(t, s, "SO1").Status)
}

// A modify or exchange of an exchanged or cancelled order is ErrClosed, a
// *ClosedError that names the replacement.
func testClosed(t *testing.T, s orders.Store) {
	m, ex := need[orders.Modifier](t, s), need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	_, err := ex.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO3", Status: orders.StatusCancelled}))
	for _, want := range []orders.ClosedError{
		{OrderNo: "SO1", Status: orders.StatusExchanged, ExchangedTo: "SO2"},
		{OrderNo: "SO3", Status: orders.StatusCancelled},
	} {
		_, err := m.Modify(Fenced(t, baseFence+1), "evt-m", want.OrderNo, orders.Changes{Address: new("x")})
		assert.ErrorIs(t, err, orders.ErrClosed)
		assert.True(t, orders.Permanent(err))
		var ce *orders.ClosedError
		if assert.ErrorAs(t, err, &ce) {
			assert.Equal(t, want, *ce)
		}
		assert.ErrorContains(t, err, want.ExchangedTo)
		_, err = ex.Exchange(Fenced(t, baseFence+1), "evt-x2", want.OrderNo, orders.Exchange{Items: newItems, NewOrderNo: "SO4"})
		assert.ErrorIs(t, err, orders.ErrClosed)
	}
	_, err = s.Get(t.Context(), "SO4")
	assert.ErrorIs(t, err, orders.ErrNotFound)
}

// An exchange with a fence older than the newest the order has seen fails
// with ErrStaleFence, closes nothing and creates nothing.
func testExchangeStale(t *testing.T, s orders.Store) {
	m, x := need[orders.Modifier](t, s), need[orders.Exchanger](t, s)
	Seed(t, s, "SO1")
	_, err := m.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("new holder")})
	require.NoError(t, err)
	before := get(t, s, "SO1")
	_, err = x.Exchange(Fenced(t, baseFence-1), "evt-late-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
	assert.False(t, orders.Permanent(err))
	assert.Equal(t, before, get(t, s, "SO1"))
	assert.Len(t, history(t, s, "SO1"), 2)
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "a refused exchange creates nothing")
	_, err = x.Exchange(Fenced(t, baseFence), "evt-late-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err, "the stale exchange was not recorded: it applies under a fresh fence")
}
