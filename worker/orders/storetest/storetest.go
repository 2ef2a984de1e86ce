// Package storetest is the conformance suite of the order store contract
// (package orders): [Run] checks that an orders.Store keeps every rule a
// Worker relies on, the way river's driver tests check a database driver.
// Every store of the module passes it (internal/orders/redisstore, and
// internal/orders/httpstore over its reference upstream), and so should a
// store of your own (see examples/ownstore):
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) orders.Store { return mystore.New() })
//	}
//
// It checks behaviour only through the Store interface. It does not check
// what a store may do its own way: the history entries' Detail text, the
// timestamps, how long dedupe records are kept, or whether a replay's
// Result.Order is the order as it is now or as the first application left
// it. Nor can it crash a store between the two halves of an exchange: a
// store that is not atomic there must test that a retry completes a
// half-done exchange itself (redisstore does).
//
// The checks of the optional [orders.Annotator] run only for a store that
// implements it, and are skipped for the others.
//
// storetest is for tests only; it imports testing.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// Run checks the store that newStore returns against the contract of
// orders.Store, in parallel subtests. newStore is called once per subtest,
// possibly from several goroutines at once; each call must return a store
// of its own that holds no orders (a fresh one, or one on its own key
// prefix or schema), cleaned up with t.Cleanup as needed.
func Run(t *testing.T, newStore func(t *testing.T) orders.Store) {
	t.Helper()
	for _, tt := range []struct {
		name string
		test func(t *testing.T, s orders.Store)
	}{
		{"PutAndGet", testPutAndGet},
		{"PutInvalid", testPutInvalid},
		{"NotFound", testNotFound},
		{"Modify", testModify},
		{"ModifyInvalid", testModifyInvalid},
		{"WriteWithoutFence", testWriteWithoutFence},
		{"StaleFenceRefused", testStaleFence},
		{"EqualFenceAllowed", testEqualFence},
		{"DedupeReturnsRecordedOutcome", testDedupe},
		{"EventReusedIsConflict", testEventReused},
		{"PutKeepsFenceAndEvents", testPutKeeps},
		{"OlderPositionPassed", testPassed},
		{"SeqOutOfTurnNotRecorded", testOutOfTurn},
		{"Exchange", testExchange},
		{"ExchangeDerivedNumber", testExchangeDerived},
		{"ExchangeRetryCompletes", testExchangeRetry},
		{"ExchangeRefusals", testExchangeRefusals},
		{"ClosedOrderRefused", testClosed},
		{"HistoryPages", testHistoryPages},
		{"ConcurrentWrites", testConcurrent},
		{"AnnotatorNotes", testAnnotate},
		{"AnnotatorKeepsWrites", testAnnotateKeepsWrites},
		{"AnnotatorKeepsWriteRules", testAnnotateKeepsRules},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.test(t, newStore(t))
		})
	}
}

// baseFence is a realistic fence: the lock hands out microseconds of the
// Redis clock.
var baseFence = time.Now().UnixMicro()

// At returns t's context with the Write a worker's run gives its store:
// fence, position seq (0 for none), the worker "storetest" and the time it
// started. A store's own tests use it, as the suite does.
func At(t *testing.T, fence, seq int64) context.Context {
	return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, Worker: "storetest", StartedAt: time.Now()})
}

// Fenced is At without a position.
func Fenced(t *testing.T, fence int64) context.Context { return At(t, fence, 0) }

var (
	oldItems = []orders.Item{{SKU: "shirt-m", Qty: 1}}
	newItems = []orders.Item{{SKU: "shirt-l", Qty: 2}}
)

// Seed puts an active order no into s (address "1 Old Street", remark
// "ring twice", one shirt-m) and returns it as s holds it; it fails t on
// an error.
func Seed(t *testing.T, s orders.Store, no string) orders.Order {
	t.Helper()
	require.NoError(t, s.Put(t.Context(), orders.Order{No: no, Address: "1 Old Street", Remark: "ring twice", Items: oldItems}))
	return get(t, s, no)
}

func get(t *testing.T, s orders.Store, no string) orders.Order {
	t.Helper()
	o, err := s.Get(t.Context(), no)
	require.NoError(t, err)
	return o
}

func history(t *testing.T, s orders.Store, no string) []orders.Entry {
	t.Helper()
	h, err := orders.AllHistory(t.Context(), s, no)
	require.NoError(t, err)
	return h
}

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

// An unknown order is ErrNotFound for every method, and a write creates
// nothing; a malformed number is ErrInvalid.
func testNotFound(t *testing.T, s orders.Store) {
	_, err := s.Get(t.Context(), "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
	assert.True(t, orders.Permanent(err))
	_, err = s.History(t.Context(), "NOPE", orders.HistoryQuery{})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	_, err = s.Modify(Fenced(t, baseFence), "evt-1", "NOPE", orders.Changes{Address: new("x")})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	assert.True(t, orders.Permanent(err))
	_, err = s.Exchange(Fenced(t, baseFence), "evt-2", "NOPE", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	for _, no := range []string{"NOPE", "SO2"} {
		_, err = s.Get(t.Context(), no)
		assert.ErrorIs(t, err, orders.ErrNotFound, "%s: the writes created nothing", no)
	}
	_, err = s.Get(t.Context(), "no/pe")
	assert.ErrorIs(t, err, orders.ErrInvalid)
	_, err = s.History(t.Context(), "", orders.HistoryQuery{})
	assert.ErrorIs(t, err, orders.ErrInvalid)
}

// A modify sets the fields it names, keeps the others, bumps the version
// and appends an entry with the event, the fence and the writer.
func testModify(t *testing.T, s orders.Store) {
	before := Seed(t, s, "SO1")
	res, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new(`"Flat 3/4", 5 {Quay} Street` + "\n\u4e2d"), Items: newItems})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	want := before
	want.Address, want.Items, want.Version = `"Flat 3/4", 5 {Quay} Street`+"\n\u4e2d", newItems, 2
	want.UpdatedAt = res.Order.UpdatedAt
	assert.Equal(t, want, res.Order, "Result.Order is the order as the write left it")
	got := get(t, s, "SO1")
	want.UpdatedAt = got.UpdatedAt
	assert.Equal(t, want, got)

	_, err = s.Modify(Fenced(t, baseFence), "evt-2", "SO1", orders.Changes{Remark: new("")})
	require.NoError(t, err)
	assert.Empty(t, get(t, s, "SO1").Remark, "a remark may be emptied")
	res, err = s.Modify(Fenced(t, baseFence), "evt-3", "SO1", orders.Changes{})
	require.NoError(t, err)
	assert.Equal(t, int64(4), res.Order.Version, "a modify without changes is still a write")

	h := history(t, s, "SO1")
	require.Len(t, h, 4)
	e := h[1]
	assert.Equal(t, []any{"evt-1", orders.TypeModify, baseFence, "storetest", int64(2)},
		[]any{e.EventID, e.Type, e.Fence, e.Worker, e.Version})
}

func testModifyInvalid(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	for _, tt := range []struct {
		eventID, orderNo string
		c                orders.Changes
	}{
		{"", "SO1", orders.Changes{}},
		{"evt", "SO 1", orders.Changes{}},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{}}},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{{SKU: "x"}}}},
		{"evt", "SO1", orders.Changes{Items: []orders.Item{{Qty: 1}}}},
	} {
		_, err := s.Modify(Fenced(t, baseFence), tt.eventID, tt.orderNo, tt.c)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", tt)
		assert.True(t, orders.Permanent(err))
	}
	assert.Equal(t, int64(1), get(t, s, "SO1").Version)
}

// A store never writes unfenced: no Write, or a fence that is not
// positive, is ErrNoFence.
func testWriteWithoutFence(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	for _, ctx := range []context.Context{
		t.Context(),
		orders.WithWrite(t.Context(), orders.Write{Worker: "w"}),
		orders.WithWrite(t.Context(), orders.Write{Fence: -1}),
	} {
		_, err := s.Modify(ctx, "evt-1", "SO1", orders.Changes{Address: new("x")})
		assert.ErrorIs(t, err, orders.ErrNoFence)
		assert.True(t, orders.Permanent(err))
		_, err = s.Exchange(ctx, "evt-2", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
		assert.ErrorIs(t, err, orders.ErrNoFence)
	}
	assert.Equal(t, int64(1), get(t, s, "SO1").Version)
}

// A write with a fence older than the newest the order has seen fails
// with ErrStaleFence (not Permanent), writes nothing and records nothing:
// under a fresh fence the same event applies.
func testStaleFence(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("new holder")})
	require.NoError(t, err)
	before := get(t, s, "SO1")

	_, err = s.Modify(Fenced(t, baseFence-1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
	assert.False(t, orders.Permanent(err), "the work runs again under a fresh lock")
	_, err = s.Exchange(Fenced(t, baseFence-1), "evt-late-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
	assert.Equal(t, before, get(t, s, "SO1"))
	assert.Len(t, history(t, s, "SO1"), 2)
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "a refused exchange creates nothing")

	res, err := s.Modify(Fenced(t, baseFence+1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	require.NoError(t, err)
	assert.False(t, res.Replayed, "the stale write was not recorded")
	assert.Equal(t, "late holder", get(t, s, "SO1").Address)

	// Fences are compared as integers, exactly, even above 2^53.
	_, err = s.Modify(Fenced(t, 1<<53+1), "evt-big", "SO1", orders.Changes{})
	require.NoError(t, err)
	_, err = s.Modify(Fenced(t, 1<<53), "evt-big-late", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
}

// One lock hold may write more than once: an equal fence is allowed.
func testEqualFence(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)
	res, err := s.Modify(Fenced(t, baseFence), "evt-2", "SO1", orders.Changes{Remark: new("b")})
	require.NoError(t, err)
	assert.Equal(t, int64(3), res.Order.Version)
}

// A repeat of an applied event writes nothing and answers Replayed, under
// any fence, after the order moved on, and after it closed.
func testDedupe(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	_, err = s.Modify(Fenced(t, baseFence+1), "evt-2", "SO1", orders.Changes{Address: new("second")})
	require.NoError(t, err)

	again, err := s.Modify(Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.Equal(t, "SO1", again.Order.No)
	got := get(t, s, "SO1")
	assert.Equal(t, "second", got.Address, "the replay wrote nothing")
	assert.Equal(t, int64(3), got.Version)
	assert.Len(t, history(t, s, "SO1"), 3)

	_, err = s.Exchange(Fenced(t, baseFence+3), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	again, err = s.Modify(Fenced(t, baseFence+4), "evt-2", "SO1", orders.Changes{Address: new("second")})
	require.NoError(t, err, "a repeat of an applied change is a replay, even of a closed order")
	assert.True(t, again.Replayed)
}

// An event ID applied once may not be used for another request: a modify
// with other changes, or an exchange, is ErrConflict naming the event.
func testEventReused(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)
	_, err = s.Modify(Fenced(t, baseFence+1), "evt-1", "SO1", orders.Changes{Address: new("b")})
	assert.ErrorIs(t, err, orders.ErrConflict)
	assert.ErrorContains(t, err, "evt-1")
	assert.True(t, orders.Permanent(err))
	_, err = s.Exchange(Fenced(t, baseFence+1), "evt-1", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrConflict)
	got := get(t, s, "SO1")
	assert.Equal(t, orders.StatusActive, got.Status)
	assert.Equal(t, int64(2), got.Version)
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "the conflicting exchange left no replacement behind")

	_, err = s.Exchange(Fenced(t, baseFence+1), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	_, err = s.Exchange(Fenced(t, baseFence+2), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2", Reason: "other"})
	assert.ErrorIs(t, err, orders.ErrConflict, "an exchange's event reused with another reason")
}

// A put replaces the order but neither resets its fence nor forgets its
// events.
func testPutKeeps(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	Seed(t, s, "SO1")
	_, err = s.Modify(Fenced(t, baseFence-1), "evt-2", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, orders.ErrStaleFence, "a put does not reset the fence")
	res, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	assert.True(t, res.Replayed, "a put does not forget events")
}

// An order never moves back in its sequence: a write whose position is not
// after the newest applied fails with ErrPassed (Permanent) and writes
// nothing, while a replay is still a replay and a write without a position
// is not ordered.
func testPassed(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Modify(At(t, baseFence, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err)
	_, err = s.Modify(At(t, baseFence+1, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)

	again, err := s.Modify(At(t, baseFence+2, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err, "a replay is answered, not refused")
	assert.True(t, again.Replayed)

	for _, seq := range []int64{15, 20} {
		_, err = s.Modify(At(t, baseFence+2, seq), fmt.Sprintf("evt-new-%d", seq), "SO1", orders.Changes{Remark: new("old")})
		assert.ErrorIs(t, err, orders.ErrPassed, "position %d after 20", seq)
		assert.True(t, orders.Permanent(err))
	}
	_, err = s.Exchange(At(t, baseFence+2, 12), "evt-12", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrPassed)
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "a refused exchange creates nothing")
	got := get(t, s, "SO1")
	assert.Equal(t, "twenty", got.Remark)
	assert.Equal(t, int64(3), got.Version, "the refusals wrote nothing")

	_, err = s.Modify(At(t, baseFence+3, 0), "evt-hand", "SO1", orders.Changes{Remark: new("by hand")})
	require.NoError(t, err, "a write without a position is not ordered")
	_, err = s.Modify(At(t, baseFence+4, 21), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err)

	// The replacement's number is free again after the refused exchange.
	Seed(t, s, "SO3")
	_, err = s.Exchange(Fenced(t, baseFence), "evt-x3", "SO3", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	assert.NoError(t, err)
}

// A write run out of its turn (Write.SeqOutOfTurn) is checked against the
// newest position applied, but its position is never recorded, neither as
// the newest nor in the history: a forged far position does not hold back
// the order's next change in its turn.
func testOutOfTurn(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	outOfTurn := func(fence, seq int64) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, SeqOutOfTurn: true, Worker: "storetest"})
	}
	_, err := s.Modify(At(t, baseFence, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)
	_, err = s.Modify(outOfTurn(baseFence+1, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	assert.ErrorIs(t, err, orders.ErrPassed, "out of turn, an older position is still refused")
	_, err = s.Modify(outOfTurn(baseFence+1, 9000000000000000), "evt-forged", "SO1", orders.Changes{Remark: new("forged")})
	require.NoError(t, err, "a position after the newest applies")
	h := history(t, s, "SO1")
	last := h[len(h)-1]
	assert.Equal(t, "evt-forged", last.EventID)
	assert.Zero(t, last.Seq, "the out-of-turn position is not kept in the history")

	_, err = s.Modify(At(t, baseFence+2, 21), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err, "the next change in its turn applies: the forged position was not recorded")
	assert.Equal(t, "21", get(t, s, "SO1").Remark)
}

// An exchange closes A as exchanged to B and creates B, active, with the
// new items and A's address and remark; A keeps its items. Both histories
// carry the event and the fence.
func testExchange(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	res, err := s.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2", Reason: "wrong size"})
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
	res, err = s.Modify(Fenced(t, baseFence+1), "evt-m", "SO2", orders.Changes{Remark: new("new")})
	require.NoError(t, err)
	assert.Equal(t, int64(2), res.Order.Version)
}

// Without NewOrderNo the replacement is numbered by
// tasks.ReplacementOrderNo, so that a retry creates the same one.
func testExchangeDerived(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	want := tasks.ReplacementOrderNo("SO1", "evt-x")
	res, err := s.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems})
	require.NoError(t, err)
	assert.Equal(t, want, res.Order.No)
	assert.Equal(t, want, get(t, s, "SO1").ExchangedTo)
	assert.Equal(t, "SO1", get(t, s, want).ExchangedFrom)
}

// A retry of an exchange, under a newer fence, completes it (it is done
// already here: a replay) and returns the replacement, creating nothing
// twice.
func testExchangeRetry(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	x := orders.Exchange{Items: newItems}
	first, err := s.Exchange(Fenced(t, baseFence), "evt-x", "SO1", x)
	require.NoError(t, err)
	for i := range 2 {
		again, err := s.Exchange(Fenced(t, baseFence+1+int64(i)), "evt-x", "SO1", x)
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
	a := Seed(t, s, "SO1")
	b := Seed(t, s, "SO2")
	_, err := s.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
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
	} {
		_, err := s.Exchange(Fenced(t, baseFence), "evt-y", "SO1", x)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", x)
	}
	_, err = s.Exchange(Fenced(t, baseFence), "", "SO1", orders.Exchange{Items: newItems})
	assert.ErrorIs(t, err, orders.ErrInvalid, "empty event ID")
	assert.Equal(t, orders.StatusActive, get(t, s, "SO1").Status)
}

// A modify or exchange of an exchanged or cancelled order is ErrClosed, a
// *ClosedError that names the replacement.
func testClosed(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	_, err := s.Exchange(Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO3", Status: orders.StatusCancelled}))
	for _, want := range []orders.ClosedError{
		{OrderNo: "SO1", Status: orders.StatusExchanged, ExchangedTo: "SO2"},
		{OrderNo: "SO3", Status: orders.StatusCancelled},
	} {
		_, err := s.Modify(Fenced(t, baseFence+1), "evt-m", want.OrderNo, orders.Changes{Address: new("x")})
		assert.ErrorIs(t, err, orders.ErrClosed)
		assert.True(t, orders.Permanent(err))
		var ce *orders.ClosedError
		if assert.ErrorAs(t, err, &ce) {
			assert.Equal(t, want, *ce)
		}
		assert.ErrorContains(t, err, want.ExchangedTo)
		_, err = s.Exchange(Fenced(t, baseFence+1), "evt-x2", want.OrderNo, orders.Exchange{Items: newItems, NewOrderNo: "SO4"})
		assert.ErrorIs(t, err, orders.ErrClosed)
	}
	_, err = s.Get(t.Context(), "SO4")
	assert.ErrorIs(t, err, orders.ErrNotFound)
}

// The history is read in pages of at most Limit entries, oldest first,
// following the versions: every entry once; past the newest, an empty
// page whose Next is 0.
func testHistoryPages(t *testing.T, s orders.Store) {
	Seed(t, s, "SO1")
	for i := range 7 {
		_, err := s.Modify(Fenced(t, baseFence+int64(i)), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(fmt.Sprint(i))})
		require.NoError(t, err)
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

// Concurrent writes with increasing fences are each applied or refused as
// stale, never lost: the version counts the applied ones.
func testConcurrent(t *testing.T, s orders.Store) {
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
			_, err := s.Modify(Fenced(t, baseFence+int64(i)), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(fmt.Sprint(i))})
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

// annotator returns s as an orders.Annotator, or skips t.
func annotator(t *testing.T, s orders.Store) orders.Annotator {
	t.Helper()
	a, ok := s.(orders.Annotator)
	if !ok {
		t.Skip("the store does not implement orders.Annotator")
	}
	return a
}

// A note is an entry of type TypeNote with the principal as Worker and
// the note's text as Detail, at the order's version: it follows the write
// of that version, pages with it, changes nothing of the order (not its
// version), and never creates an order.
func testAnnotate(t *testing.T, s orders.Store) {
	a := annotator(t, s)
	seeded := Seed(t, s, "SO1")
	n := orders.Note{By: "alice", Action: "hold", Reason: "customer called"}
	require.NoError(t, a.Annotate(t.Context(), "SO1", n))
	assert.Equal(t, seeded, get(t, s, "SO1"), "a note changes nothing of the order")
	_, err := s.Modify(Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("after the note")})
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
	a := annotator(t, s)
	Seed(t, s, "SO1")
	_, err := s.Modify(At(t, baseFence, 1), "evt-1", "SO1", orders.Changes{Remark: new("one")})
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
	a := annotator(t, s)
	Seed(t, s, "SO1")
	_, err := s.Modify(At(t, baseFence+10, 5), "evt-1", "SO1", orders.Changes{Remark: new("one")})
	require.NoError(t, err)
	require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "alice", Action: "skipped position 6", Reason: "bad data"}))

	r, err := s.Modify(At(t, baseFence+10, 5), "evt-1", "SO1", orders.Changes{Remark: new("one")})
	require.NoError(t, err)
	assert.True(t, r.Replayed, "the event is still applied")
	_, err = s.Modify(At(t, baseFence+10, 5), "evt-2", "SO1", orders.Changes{Remark: new("two")})
	assert.ErrorIs(t, err, orders.ErrPassed, "the newest position is still 5")
	_, err = s.Modify(At(t, baseFence+9, 7), "evt-3", "SO1", orders.Changes{Remark: new("three")})
	assert.ErrorIs(t, err, orders.ErrStaleFence, "the newest fence is still the modify's")
	_, err = s.Modify(At(t, baseFence+10, 7), "evt-4", "SO1", orders.Changes{Remark: new("four")})
	require.NoError(t, err, "an equal fence at a later position applies")

	x, err := s.Exchange(At(t, baseFence+11, 8), "evt-5", "SO1", orders.Exchange{Items: newItems, NewOrderNo: "SO2"})
	require.NoError(t, err)
	assert.Equal(t, "SO2", x.Order.No)
	assert.Equal(t, "four", x.Order.Remark)
	assert.Equal(t, orders.StatusExchanged, get(t, s, "SO1").Status)
	require.NoError(t, a.Annotate(t.Context(), "SO1", orders.Note{By: "alice", Action: "resume"}), "a closed order takes notes")
	assert.Equal(t, orders.StatusExchanged, get(t, s, "SO1").Status, "and stays closed")
	_, err = s.Modify(At(t, baseFence+12, 9), "evt-6", "SO1", orders.Changes{Remark: new("six")})
	assert.ErrorIs(t, err, orders.ErrClosed)
}
