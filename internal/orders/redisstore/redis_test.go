package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

// newStore returns a store on the test's own Redis prefix.
func newStore(t *testing.T) *Store {
	t.Helper()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	return s
}

// baseFence is a realistic fence: microseconds from a clock.
var baseFence = time.Now().UnixMicro()

func TestNew(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"zero config", Config{}, false},
		{"prefix", Config{Prefix: "x:"}, false},
		{"brace in prefix", Config{Prefix: "x{:"}, true},
		{"negative claim TTL", Config{ClaimTTL: -time.Second}, true},
		{"dedupe retention below a second", Config{DedupeRetention: time.Millisecond}, true},
		{"negative history max", Config{HistoryMax: -1}, true},
		{"negative history max age", Config{HistoryMaxAge: -time.Hour}, true},
		{"windows", Config{DedupeRetention: time.Hour, HistoryMax: 10, HistoryMaxAge: time.Hour}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(db.Client, tt.cfg)
			assert.Equal(t, tt.wantErr, err != nil, "err: %v", err)
		})
	}
	_, err := New(nil, Config{})
	assert.Error(t, err)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	s, err := New(redistest.New(t).Client, Config{})
	require.NoError(t, err)
	assert.Equal(t, "ow:order:{SO1}", s.orderKey("SO1"))
	assert.Equal(t, "ow:order:{SO1}:history", s.historyKey("SO1"))
	ev, _ := s.eventKeys("SO1")
	assert.Regexp(t, `^ow:order:\{SO1\}:ev:\d+$`, ev[0])
	assert.Equal(t, "ow:order:{SO1}:claim", s.claimKey("SO1"))
}

func TestPutAndGet(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := t.Context()
	before := time.Now().Add(-time.Minute)

	o := storetest.Seed(t, s, "SO1")
	assert.Equal(t, orders.Order{
		No: "SO1", Status: orders.StatusActive, Address: "1 Old Street", Remark: "ring twice",
		Items: []orders.Item{{SKU: "shirt-m", Qty: 1}}, Version: 1, UpdatedAt: o.UpdatedAt,
	}, o)
	assert.True(t, o.UpdatedAt.After(before), "updated_at %v comes from Redis TIME", o.UpdatedAt)

	require.NoError(t, s.Put(orders.WithWrite(ctx, orders.Write{Worker: "admin"}), orders.Order{No: "SO1", Status: orders.StatusCancelled, Version: 99}))
	o, err := s.Get(ctx, "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.StatusCancelled, o.Status)
	assert.Equal(t, int64(2), o.Version, "version is the store's, not the caller's")
	assert.Equal(t, []orders.Item{}, o.Items)

	h, err := orders.AllHistory(ctx, s, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 2)
	assert.Equal(t, orders.Entry{
		Type: orders.TypePut, Worker: "admin", Version: 2, Detail: "put: cancelled",
		StartedAt: h[1].EndedAt, EndedAt: h[1].EndedAt,
	}, h[1])
}

func TestPutInvalid(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	tests := []struct {
		name  string
		order orders.Order
	}{
		{"empty number", orders.Order{}},
		{"brace in number", orders.Order{No: "SO{1}"}},
		{"number too long", orders.Order{No: strings.Repeat("a", 65)}},
		{"unknown status", orders.Order{No: "SO1", Status: "lost"}},
		{"bad exchanged_to", orders.Order{No: "SO1", ExchangedTo: "B B"}},
		{"item without sku", orders.Order{No: "SO1", Items: []orders.Item{{Qty: 1}}}},
		{"item without qty", orders.Order{No: "SO1", Items: []orders.Item{{SKU: "x"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := s.Put(t.Context(), tt.order)
			assert.ErrorIs(t, err, orders.ErrInvalid)
			assert.True(t, orders.Permanent(err))
		})
	}
}

func TestGetAndHistoryNotFound(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	_, err := s.Get(t.Context(), "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
	_, err = orders.AllHistory(t.Context(), s, "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
	_, err = s.Get(t.Context(), "no/pe")
	assert.ErrorIs(t, err, orders.ErrInvalid)
	_, err = orders.AllHistory(t.Context(), s, "")
	assert.ErrorIs(t, err, orders.ErrInvalid)
}

func TestModify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		changes orders.Changes
		want    func(o orders.Order) orders.Order
		detail  string
	}{
		{
			name:    "address",
			changes: orders.Changes{Address: new("2 New Road")},
			want:    func(o orders.Order) orders.Order { o.Address = "2 New Road"; return o },
			detail:  "changed address",
		},
		{
			name:    "remark to empty",
			changes: orders.Changes{Remark: new("")},
			want:    func(o orders.Order) orders.Order { o.Remark = ""; return o },
			detail:  "changed remark",
		},
		{
			name:    "items",
			changes: orders.Changes{Items: []orders.Item{{SKU: "shirt-l", Qty: 2}, {SKU: "sock", Qty: 3}}},
			want: func(o orders.Order) orders.Order {
				o.Items = []orders.Item{{SKU: "shirt-l", Qty: 2}, {SKU: "sock", Qty: 3}}
				return o
			},
			detail: "changed items",
		},
		{
			name: "everything, with JSON-hostile text",
			changes: orders.Changes{
				Address: new(`"Flat 3/4", 5 {Quay} Street` + "\n\t\u00e9\u4e2d"),
				Remark:  new(`{}[]\`),
				Items:   []orders.Item{{SKU: "a/b", Qty: 1 << 40}},
			},
			want: func(o orders.Order) orders.Order {
				o.Address = `"Flat 3/4", 5 {Quay} Street` + "\n\t\u00e9\u4e2d"
				o.Remark = `{}[]\`
				o.Items = []orders.Item{{SKU: "a/b", Qty: 1 << 40}}
				return o
			},
			detail: "changed address, remark, items",
		},
		{
			name:    "no changes",
			changes: orders.Changes{},
			want:    func(o orders.Order) orders.Order { return o },
			detail:  "no changes",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			before := storetest.Seed(t, s, "SO1")
			started := time.Now().Add(-time.Second)
			ctx := orders.WithWrite(t.Context(), orders.Write{Fence: baseFence, Worker: "w1", StartedAt: started})

			res, err := s.Modify(ctx, "evt-1", "SO1", tt.changes)
			require.NoError(t, err)

			want := tt.want(before)
			want.Version = 2
			want.UpdatedAt = res.Order.UpdatedAt
			assert.Equal(t, orders.Result{Order: want}, res)
			got, err := s.Get(t.Context(), "SO1")
			require.NoError(t, err)
			assert.Equal(t, want, got)

			h, err := orders.AllHistory(t.Context(), s, "SO1")
			require.NoError(t, err)
			require.Len(t, h, 2)
			assert.Equal(t, orders.Entry{
				EventID: "evt-1", Type: orders.TypeModify, Fence: baseFence, Worker: "w1",
				StartedAt: started.UTC().Truncate(time.Microsecond), EndedAt: got.UpdatedAt,
				Version: 2, Detail: tt.detail,
			}, h[1])
		})
	}
}

func TestModifyReplay(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	first, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	_, err = s.Modify(storetest.Fenced(t, baseFence+1), "evt-2", "SO1", orders.Changes{Address: new("second")})
	require.NoError(t, err)

	// A retry under a newer lock, after the order has moved on.
	again, err := s.Modify(storetest.Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Address: new("first")})
	require.NoError(t, err)
	got, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.Result{Order: got, Replayed: true}, again, "a repeat answers the order as it is now")
	assert.Equal(t, "first", first.Order.Address)
	assert.Equal(t, "second", got.Address, "the replay wrote nothing")
	assert.Equal(t, int64(3), got.Version)
	h, err := orders.AllHistory(t.Context(), s, "SO1")
	require.NoError(t, err)
	assert.Len(t, h, 3)
}

func TestModifyReplayAfterExchange(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	first, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("gift")})
	require.NoError(t, err)
	_, err = s.Exchange(storetest.Fenced(t, baseFence+1), "evt-2", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO2"})
	require.NoError(t, err)

	again, err := s.Modify(storetest.Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Remark: new("gift")})
	require.NoError(t, err, "a repeat of an applied change is a replay, even of a closed order")
	assert.True(t, again.Replayed)
	assert.Equal(t, orders.StatusExchanged, again.Order.Status)
	assert.Equal(t, first.Order.Remark, again.Order.Remark)
}

func TestEventReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)

	tests := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"modify with other changes", func(ctx context.Context) error {
			_, err := s.Modify(ctx, "evt-1", "SO1", orders.Changes{Address: new("b")})
			return err
		}},
		{"exchange", func(ctx context.Context) error {
			_, err := s.Exchange(ctx, "evt-1", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO2"})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(storetest.Fenced(t, baseFence+1))
			assert.ErrorIs(t, err, orders.ErrConflict)
			assert.ErrorContains(t, err, "evt-1")
		})
	}
	got, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.StatusActive, got.Status)
	assert.Equal(t, int64(2), got.Version)
	_, err = s.Get(t.Context(), "SO2")
	assert.ErrorIs(t, err, orders.ErrNotFound, "the conflicting exchange left no replacement behind")
	assert.Zero(t, s.rdb.Exists(t.Context(), s.claimKey("SO2")).Val(), "nor a claim")
}

func TestModifyStaleFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Address: new("new holder")})
	require.NoError(t, err)
	before, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)

	_, err = s.Modify(storetest.Fenced(t, baseFence-1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	assert.ErrorIs(t, err, orders.ErrStaleFence)
	assert.False(t, orders.Permanent(err))

	after, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, before, after)
	h, err := orders.AllHistory(t.Context(), s, "SO1")
	require.NoError(t, err)
	assert.Len(t, h, 2)

	// The stale event was not recorded: under a fresh lock it applies.
	res, err := s.Modify(storetest.Fenced(t, baseFence+1), "evt-late", "SO1", orders.Changes{Address: new("late holder")})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	assert.Equal(t, "late holder", res.Order.Address)
}

func TestModifyEqualFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	ctx := storetest.Fenced(t, baseFence)
	_, err := s.Modify(ctx, "evt-1", "SO1", orders.Changes{Address: new("a")})
	require.NoError(t, err)
	res, err := s.Modify(ctx, "evt-2", "SO1", orders.Changes{Remark: new("b")})
	require.NoError(t, err)
	assert.Equal(t, int64(3), res.Order.Version)
}

func TestFencesComparedExactly(t *testing.T) {
	t.Parallel()
	// Near 2^63 doubles are 1024 apart: a float comparison would call
	// MaxInt64-2 equal to MaxInt64-1.
	tests := []struct {
		name      string
		first     int64
		second    int64
		wantStale bool
	}{
		{"int64 top, older", math.MaxInt64 - 1, math.MaxInt64 - 2, true},
		{"int64 top, newer", math.MaxInt64 - 1, math.MaxInt64, false},
		{"above 2^53, older", 1<<53 + 1, 1 << 53, true},
		{"shorter is older", 100000, 99999, true},
		{"longer is newer", 99999, 100000, false},
		{"microseconds, older", baseFence, baseFence - 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			storetest.Seed(t, s, "SO1")
			_, err := s.Modify(storetest.Fenced(t, tt.first), "evt-1", "SO1", orders.Changes{})
			require.NoError(t, err)
			_, err = s.Modify(storetest.Fenced(t, tt.second), "evt-2", "SO1", orders.Changes{})
			assert.Equal(t, tt.wantStale, errors.Is(err, orders.ErrStaleFence), "err: %v", err)
		})
	}
}

func TestWriteWithoutFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	tests := []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"no write", func(t *testing.T) context.Context { return t.Context() }},
		{"zero fence", func(t *testing.T) context.Context { return orders.WithWrite(t.Context(), orders.Write{Worker: "w"}) }},
		{"negative fence", func(t *testing.T) context.Context { return orders.WithWrite(t.Context(), orders.Write{Fence: -1}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Modify(tt.ctx(t), "evt-1", "SO1", orders.Changes{Address: new("x")})
			assert.ErrorIs(t, err, orders.ErrNoFence)
			assert.True(t, orders.Permanent(err))
			_, err = s.Exchange(tt.ctx(t), "evt-2", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}})
			assert.ErrorIs(t, err, orders.ErrNoFence)
		})
	}
	got, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), got.Version)
}

func TestModifyInvalid(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	tests := []struct {
		name    string
		eventID string
		orderNo string
		changes orders.Changes
	}{
		{"empty event", "", "SO1", orders.Changes{}},
		{"bad order number", "evt", "SO 1", orders.Changes{}},
		{"empty items", "evt", "SO1", orders.Changes{Items: []orders.Item{}}},
		{"zero qty", "evt", "SO1", orders.Changes{Items: []orders.Item{{SKU: "x"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.Modify(storetest.Fenced(t, baseFence), tt.eventID, tt.orderNo, tt.changes)
			assert.ErrorIs(t, err, orders.ErrInvalid)
			assert.True(t, orders.Permanent(err))
		})
	}
}

func TestModifyNotFound(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "NOPE", orders.Changes{Address: new("x")})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	assert.True(t, orders.Permanent(err))
	_, err = s.Get(t.Context(), "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound, "modify created nothing")
}

func TestModifyClosed(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	_, err := s.Exchange(storetest.Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO2"})
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO3", Status: orders.StatusCancelled}))

	tests := []struct {
		name    string
		orderNo string
		want    orders.ClosedError
	}{
		{"exchanged", "SO1", orders.ClosedError{OrderNo: "SO1", Status: orders.StatusExchanged, ExchangedTo: "SO2"}},
		{"cancelled", "SO3", orders.ClosedError{OrderNo: "SO3", Status: orders.StatusCancelled}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Modify(storetest.Fenced(t, baseFence+1), "evt-m", tt.orderNo, orders.Changes{Address: new("x")})
			assert.ErrorIs(t, err, orders.ErrClosed)
			assert.True(t, orders.Permanent(err))
			var ce *orders.ClosedError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tt.want, *ce)
			assert.ErrorContains(t, err, tt.want.ExchangedTo)
		})
	}
}

func TestExchange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		newOrderNo string
		wantNo     string
	}{
		{"named", "SO2", "SO2"},
		{"derived", "", tasks.ReplacementOrderNo("SO1", "evt-x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			storetest.Seed(t, s, "SO1")
			items := []orders.Item{{SKU: "shirt-l", Qty: 1}}
			ctx := orders.WithWrite(t.Context(), orders.Write{Fence: baseFence, Worker: "w1"})

			res, err := s.Exchange(ctx, "evt-x", "SO1", orders.Exchange{Items: items, NewOrderNo: tt.newOrderNo, Reason: "wrong size"})
			require.NoError(t, err)
			assert.False(t, res.Replayed)
			b := res.Order
			assert.Equal(t, orders.Order{
				No: tt.wantNo, Status: orders.StatusActive, Address: "1 Old Street", Remark: "ring twice",
				Items: items, Version: 1, ExchangedFrom: "SO1", UpdatedAt: b.UpdatedAt,
			}, b)
			got, err := s.Get(t.Context(), tt.wantNo)
			require.NoError(t, err)
			assert.Equal(t, b, got)

			a, err := s.Get(t.Context(), "SO1")
			require.NoError(t, err)
			assert.Equal(t, orders.StatusExchanged, a.Status)
			assert.Equal(t, tt.wantNo, a.ExchangedTo)
			assert.Equal(t, int64(2), a.Version)
			assert.Equal(t, []orders.Item{{SKU: "shirt-m", Qty: 1}}, a.Items, "the exchanged order keeps its items")

			ha, err := orders.AllHistory(t.Context(), s, "SO1")
			require.NoError(t, err)
			require.Len(t, ha, 2)
			assert.Equal(t, orders.Entry{
				EventID: "evt-x", Type: orders.TypeExchange, Fence: baseFence, Worker: "w1",
				StartedAt: a.UpdatedAt, EndedAt: a.UpdatedAt, Version: 2,
				Detail: "exchanged to " + tt.wantNo + ": wrong size",
			}, ha[1])
			hb, err := orders.AllHistory(t.Context(), s, tt.wantNo)
			require.NoError(t, err)
			assert.Equal(t, []orders.Entry{{
				EventID: "evt-x", Type: orders.TypeCreated, Fence: baseFence, Worker: "w1",
				StartedAt: b.UpdatedAt, EndedAt: b.UpdatedAt, Version: 1,
				Detail: "created from SO1 by event evt-x",
			}}, hb)

			// The replacement has no fence yet: any fenced writer may
			// modify it, even one whose fence is older than SO1's.
			_, err = s.Modify(storetest.Fenced(t, 1), "evt-m", tt.wantNo, orders.Changes{Remark: new("ok")})
			assert.NoError(t, err)

			again, err := s.Exchange(storetest.Fenced(t, baseFence+1), "evt-x", "SO1", orders.Exchange{Items: items, NewOrderNo: tt.newOrderNo, Reason: "wrong size"})
			require.NoError(t, err)
			now, err := s.Get(t.Context(), tt.wantNo)
			require.NoError(t, err)
			assert.Equal(t, orders.Result{Order: now, Replayed: true}, again, "a repeat returns the replacement as it is now")
		})
	}
}

func TestExchangeRetryAfterCrash(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	items := []orders.Item{{SKU: "shirt-l", Qty: 1}}
	x := orders.Exchange{Items: items}
	newNo := tasks.ReplacementOrderNo("SO1", "evt-x")
	fp := fingerprint(exchangeRequest{Items: items})

	// The first attempt closes SO1 and dies before creating the replacement.
	w := orders.Write{Fence: baseFence, Worker: "w1"}
	closed, err := s.closeOrder(orders.WithWrite(t.Context(), w), w, "evt-x", "SO1", newNo, fp, "")
	require.NoError(t, err)
	require.False(t, closed.replayed)
	_, err = s.Get(t.Context(), newNo)
	require.ErrorIs(t, err, orders.ErrNotFound)
	_, err = s.Modify(storetest.Fenced(t, baseFence+1), "evt-m", "SO1", orders.Changes{})
	require.ErrorIs(t, err, orders.ErrClosed, "the half-done exchange already names its replacement")

	// Another exchange may not take the number meanwhile.
	storetest.Seed(t, s, "SO9")
	_, err = s.Exchange(storetest.Fenced(t, baseFence), "evt-other", "SO9", orders.Exchange{Items: items, NewOrderNo: newNo})
	require.ErrorIs(t, err, orders.ErrConflict)
	assert.ErrorContains(t, err, "SO1")

	// The retry, under a new lock, completes it.
	res, err := s.Exchange(storetest.Fenced(t, baseFence+2), "evt-x", "SO1", x)
	require.NoError(t, err)
	assert.False(t, res.Replayed, "this call created the replacement")
	assert.Equal(t, newNo, res.Order.No)
	assert.Equal(t, "SO1", res.Order.ExchangedFrom)
	assert.Equal(t, "1 Old Street", res.Order.Address)
	assert.Equal(t, items, res.Order.Items)
	assert.Zero(t, s.rdb.Exists(t.Context(), s.claimKey(newNo)).Val(), "the claim is gone")

	a, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.Version, "SO1 was closed once")

	again, err := s.Exchange(storetest.Fenced(t, baseFence+3), "evt-x", "SO1", x)
	require.NoError(t, err)
	assert.Equal(t, orders.Result{Order: res.Order, Replayed: true}, again)

	// Review finding: the replacement's first entry carried the retry's
	// fence, not the one the exchange closed SO1 under.
	hb, err := orders.AllHistory(t.Context(), s, newNo)
	require.NoError(t, err)
	require.Len(t, hb, 1)
	assert.Equal(t, orders.TypeCreated, hb[0].Type)
	assert.Equal(t, baseFence, hb[0].Fence, "the exchange's fence, not the retry's")
	ha, err := orders.AllHistory(t.Context(), s, "SO1")
	require.NoError(t, err)
	assert.Equal(t, ha[len(ha)-1].Fence, hb[0].Fence)
}

func TestExchangeConflict(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	a := storetest.Seed(t, s, "SO1")
	b := storetest.Seed(t, s, "SO2")

	_, err := s.Exchange(storetest.Fenced(t, baseFence), "evt-x", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO2"})
	assert.ErrorIs(t, err, orders.ErrConflict)
	assert.True(t, orders.Permanent(err))
	assert.ErrorContains(t, err, "SO2")

	for _, want := range []orders.Order{a, b} {
		got, err := s.Get(t.Context(), want.No)
		require.NoError(t, err)
		assert.Equal(t, want, got, "nothing changed")
		h, err := orders.AllHistory(t.Context(), s, want.No)
		require.NoError(t, err)
		assert.Len(t, h, 1)
	}
	assert.Zero(t, s.rdb.Exists(t.Context(), s.claimKey("SO2")).Val())
}

func TestExchangeFailureReleasesClaim(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	items := []orders.Item{{SKU: "x", Qty: 1}}

	_, err = s.Exchange(storetest.Fenced(t, baseFence-1), "evt-x", "SO1", orders.Exchange{Items: items, NewOrderNo: "SO2"})
	require.ErrorIs(t, err, orders.ErrStaleFence)
	assert.Zero(t, s.rdb.Exists(t.Context(), s.claimKey("SO2")).Val())

	_, err = s.Exchange(storetest.Fenced(t, baseFence), "evt-y", "NOPE", orders.Exchange{Items: items, NewOrderNo: "SO2"})
	require.ErrorIs(t, err, orders.ErrNotFound)
	assert.Zero(t, s.rdb.Exists(t.Context(), s.claimKey("SO2")).Val())

	// SO2 is free for the next exchange.
	storetest.Seed(t, s, "SO3")
	_, err = s.Exchange(storetest.Fenced(t, baseFence), "evt-z", "SO3", orders.Exchange{Items: items, NewOrderNo: "SO2"})
	assert.NoError(t, err)
}

func TestExchangeInvalid(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	tests := []struct {
		name string
		x    orders.Exchange
	}{
		{"no items", orders.Exchange{NewOrderNo: "SO2"}},
		{"bad item", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: -1}}}},
		{"bad new number", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO{2}"}},
		{"own number", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.Exchange(storetest.Fenced(t, baseFence), "evt-x", "SO1", tt.x)
			assert.ErrorIs(t, err, orders.ErrInvalid)
		})
	}
	got, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.StatusActive, got.Status)
}

func TestPutKeepsFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	storetest.Seed(t, s, "SO1")

	_, err = s.Modify(storetest.Fenced(t, baseFence-1), "evt-2", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, orders.ErrStaleFence, "a put does not reset the fence")
	res, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	assert.True(t, res.Replayed, "a put does not forget events")
}

func TestConcurrentModifies(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	const writers = 64
	var (
		next    atomic.Int64
		applied atomic.Int64
		wg      sync.WaitGroup
		errs    = make(chan error, writers)
	)
	next.Store(baseFence)
	for i := range writers {
		wg.Go(func() {
			fence := next.Add(1)
			_, err := s.Modify(storetest.Fenced(t, fence), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(fmt.Sprint(i))})
			if err == nil {
				applied.Add(1)
				return
			}
			if !errors.Is(err, orders.ErrStaleFence) {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("unexpected error: %v", err)
	}

	got, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Positive(t, applied.Load())
	assert.Equal(t, 1+applied.Load(), got.Version, "version counts the put and every applied modify")
	h, err := orders.AllHistory(t.Context(), s, "SO1")
	require.NoError(t, err)
	require.Len(t, h, int(got.Version))
	for i := 2; i < len(h); i++ {
		assert.LessOrEqual(t, h[i-1].Fence, h[i].Fence, "entry %d", i)
		assert.Equal(t, int64(i+1), h[i].Version)
	}
	t.Logf("%d of %d writers applied, the rest were stale", applied.Load(), writers)
}

// fenceKeyOnly is a lock hold that offers its fence key and no hand-off.
type fenceKeyOnly string

func (k fenceKeyOnly) FenceKey() string         { return string(k) }
func (fenceKeyOnly) Handoff() *keyorder.Handoff { return nil }

// A former lock holder's write is refused as soon as the lock hands out a
// newer fence, even before the new holder has written to the order.
func TestLockFenceKeyShutsOutFormerHolder(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO1", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	fenceKey := db.Prefix + "lock:{SO1}:fence"
	require.NoError(t, db.Client.Set(t.Context(), fenceKey, "200", 0).Err()) // the new holder's fence
	r := "late"

	withFenceKey := func(fence int64, key string) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Commit: fenceKeyOnly(key)})
	}
	old := withFenceKey(100, fenceKey)
	_, err = s.Modify(old, "ev-old", "SO1", orders.Changes{Remark: &r})
	require.ErrorIs(t, err, orders.ErrStaleFence)

	current := withFenceKey(200, fenceKey)
	_, err = s.Modify(current, "ev-new", "SO1", orders.Changes{Remark: &r})
	require.NoError(t, err)

	wrongSlot := withFenceKey(300, db.Prefix+"lock:{SO2}:fence")
	_, err = s.Modify(wrongSlot, "ev-x", "SO1", orders.Changes{Remark: &r})
	require.ErrorIs(t, err, orders.ErrInvalid)
}

// With the lock hold offered, a modify's commit script also releases the order's
// lock (one round trip instead of two) and the lease's Release is then free;
// an exchange, which writes again after closing the order, leaves the lock
// to its holder.
func TestHandoffReleasesWithTheCommit(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO1", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	space, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	locker, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close() })
	write := func(l *keyordertest.Lease) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: l.Fence(), Commit: l})
	}
	lockKey := db.Prefix + "lock:{SO1}"

	lease, err := locker.Acquire(t.Context(), "SO1", "modify")
	require.NoError(t, err)
	r := "x"
	_, err = s.Modify(write(lease), "ev-1", "SO1", orders.Changes{Remark: &r})
	require.NoError(t, err)
	require.Zero(t, db.Client.Exists(t.Context(), lockKey).Val(), "released by the commit")
	require.NoError(t, lease.Release(t.Context()), "nothing left to release")

	lease, err = locker.Acquire(t.Context(), "SO1", "exchange")
	require.NoError(t, err)
	_, err = s.Exchange(write(lease), "ev-2", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "B", Qty: 1}}, NewOrderNo: "SO2"})
	require.NoError(t, err)
	require.Equal(t, int64(1), db.Client.Exists(t.Context(), lockKey).Val(), "an exchange keeps its lock")
	require.NoError(t, lease.Release(t.Context()))
	require.Zero(t, db.Client.Exists(t.Context(), lockKey).Val())
}

// The history is read in pages, oldest first, and keeps at most HistoryMax
// entries; the pages follow the versions, so a page after trimmed entries
// starts at the oldest kept.
func TestHistoryPagesAndCap(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, HistoryMax: 5})
	require.NoError(t, err)
	storetest.Seed(t, s, "SO1") // version 1
	for i := range 7 {
		_, err := s.Modify(storetest.Fenced(t, baseFence+int64(i)), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	n, err := db.Client.LLen(t.Context(), s.historyKey("SO1")).Result()
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "capped at HistoryMax")

	var versions []int64
	q := orders.HistoryQuery{Limit: 2}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
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
	require.Equal(t, []int64{4, 5, 6, 7, 8}, versions, "the five newest, each once")

	p, err := s.History(t.Context(), "SO1", orders.HistoryQuery{After: 2, Limit: 100})
	require.NoError(t, err)
	require.Equal(t, int64(4), p.Entries[0].Version, "a cursor before the oldest kept starts at the oldest kept")
	p, err = s.History(t.Context(), "SO1", orders.HistoryQuery{After: 8})
	require.NoError(t, err)
	require.Empty(t, p.Entries)
	require.Zero(t, p.Next)
}

// With HistoryMaxAge, each write drops entries older than it (two at most).
func TestHistoryMaxAge(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, HistoryMaxAge: time.Microsecond})
	require.NoError(t, err)
	storetest.Seed(t, s, "SO1")
	for i := range 3 {
		_, err := s.Modify(storetest.Fenced(t, baseFence+int64(i)), fmt.Sprintf("evt-%d", i), "SO1", orders.Changes{Remark: new(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	h, err := orders.AllHistory(t.Context(), s, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 1, "everything but the newest is older than a microsecond")
	require.Equal(t, "evt-2", h[0].EventID)
}

// An event's record lasts at least DedupeRetention: a repeat within it is
// a replay; past twice of it, the record is gone and the event would apply
// again (the sequence keeps an ordered task from running again in turn).
// The buckets expire by themselves.
func TestDedupeRetention(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, DedupeRetention: time.Hour})
	require.NoError(t, err)
	clock := time.Now()
	s.now = func() time.Time { return clock }
	storetest.Seed(t, s, "SO1")
	_, err = s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("a")})
	require.NoError(t, err)
	ev, _ := s.eventKeys("SO1")
	ttl, err := db.Client.PTTL(t.Context(), ev[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Hour-time.Minute, "a bucket outlives its width")
	require.LessOrEqual(t, ttl, 2*time.Hour)

	clock = clock.Add(59 * time.Minute)
	again, err := s.Modify(storetest.Fenced(t, baseFence+1), "evt-1", "SO1", orders.Changes{Remark: new("a")})
	require.NoError(t, err)
	require.True(t, again.Replayed, "within the retention")

	clock = clock.Add(2 * time.Hour)
	again, err = s.Modify(storetest.Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Remark: new("a")})
	require.NoError(t, err)
	require.False(t, again.Replayed, "past twice the retention the record is gone")
}

// A writer whose clock runs a little ahead writes into the next bucket;
// the others still find its records.
func TestDedupeAcrossSkewedClocks(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ahead, err := New(db.Client, Config{Prefix: db.Prefix, DedupeRetention: time.Hour})
	require.NoError(t, err)
	behind, err := New(db.Client, Config{Prefix: db.Prefix, DedupeRetention: time.Hour})
	require.NoError(t, err)
	base := time.UnixMilli((time.Now().UnixMilli()/time.Hour.Milliseconds() + 1) * time.Hour.Milliseconds())
	ahead.now = func() time.Time { return base.Add(time.Second) }   // just into the next bucket
	behind.now = func() time.Time { return base.Add(-time.Second) } // just before it
	storetest.Seed(t, ahead, "SO1")
	_, err = ahead.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("a")})
	require.NoError(t, err)
	again, err := behind.Modify(storetest.Fenced(t, baseFence+1), "evt-1", "SO1", orders.Changes{Remark: new("a")})
	require.NoError(t, err)
	require.True(t, again.Replayed)
}

// A change run out of its turn (orders.Write.SeqOutOfTurn: a position
// already passed, or one its order's sequence never handed out) is checked
// against the newest position applied but never recorded: a forged seq of
// 9000000000000000 applies as an unordered change and the order's next
// changes in their turn still apply.
func TestOutOfTurnPositionCheckedNotRecorded(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	storetest.Seed(t, s, "SO1")
	at := func(fence, seq int64, outOfTurn bool) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, SeqOutOfTurn: outOfTurn, Worker: "w"})
	}
	_, err = s.Modify(at(baseFence, 20, false), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)

	_, err = s.Modify(at(baseFence+1, 10, true), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.ErrorIs(t, err, orders.ErrPassed, "out of turn, an older position is still refused")
	_, err = s.Modify(at(baseFence+1, 9000000000000000, true), "evt-poison", "SO1", orders.Changes{Remark: new("poison")})
	require.NoError(t, err, "a position after the newest applies")
	_, err = s.Exchange(at(baseFence+1, 9000000000000001, true), "evt-x", "SO9", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO10"})
	require.ErrorIs(t, err, orders.ErrNotFound)

	seq, err := db.Client.HGet(t.Context(), s.orderKey("SO1"), "seq").Result()
	require.NoError(t, err)
	require.Equal(t, "20", seq, "the forged position is not recorded")
	h, err := s.History(t.Context(), "SO1", orders.HistoryQuery{})
	require.NoError(t, err)
	last := h.Entries[len(h.Entries)-1]
	require.Equal(t, "evt-poison", last.EventID)
	require.Zero(t, last.Seq, "nor kept in the history")

	_, err = s.Modify(at(baseFence+2, 21, false), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err, "the next change in its turn applies")
	o, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Equal(t, "21", o.Remark)
}

// An order never moves back in its sequence: a change with an older
// position than one applied is refused with orders.ErrPassed and writes nothing,
// also once its own dedupe record is gone; its replay is still a replay.
func TestOlderPositionRefused(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, DedupeRetention: time.Hour})
	require.NoError(t, err)
	clock := time.Now()
	s.now = func() time.Time { return clock }
	storetest.Seed(t, s, "SO1")
	at := func(fence, seq int64) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, Worker: "w"})
	}
	_, err = s.Modify(at(baseFence, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err)
	_, err = s.Modify(at(baseFence+1, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.NoError(t, err)

	again, err := s.Modify(at(baseFence+2, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.NoError(t, err, "a replay within the retention is answered, not refused")
	require.True(t, again.Replayed)

	_, err = s.Modify(at(baseFence+2, 15), "evt-15", "SO1", orders.Changes{Remark: new("fifteen")})
	require.ErrorIs(t, err, orders.ErrPassed)
	require.True(t, orders.Permanent(err))
	require.ErrorContains(t, err, "position 15 is not after position 20")

	clock = clock.Add(3 * time.Hour) // evt-10's record is gone
	_, err = s.Modify(at(baseFence+3, 10), "evt-10", "SO1", orders.Changes{Remark: new("ten")})
	require.ErrorIs(t, err, orders.ErrPassed, "past its record, the sequence still refuses an old change")
	_, err = s.Modify(at(baseFence+3, 20), "evt-20", "SO1", orders.Changes{Remark: new("twenty")})
	require.ErrorIs(t, err, orders.ErrPassed, "and the last one applied is not applied twice")
	_, err = s.Exchange(at(baseFence+3, 12), "evt-12", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}, NewOrderNo: "SO2"})
	require.ErrorIs(t, err, orders.ErrPassed)
	_, err = s.Get(t.Context(), "SO2")
	require.ErrorIs(t, err, orders.ErrNotFound, "a refused exchange creates nothing")
	exists, err := db.Client.Exists(t.Context(), s.claimKey("SO2")).Result()
	require.NoError(t, err)
	require.Zero(t, exists, "and leaves no claim on the replacement's number")

	o, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Equal(t, "twenty", o.Remark)
	require.EqualValues(t, 3, o.Version, "the refusals wrote nothing")

	_, err = s.Modify(at(baseFence+4, 0), "evt-hand", "SO1", orders.Changes{Remark: new("by hand")})
	require.NoError(t, err, "a change without a position is not ordered")
	_, err = s.Modify(at(baseFence+5, 21), "evt-21", "SO1", orders.Changes{Remark: new("21")})
	require.NoError(t, err)
}

// A note is an entry of its own, at the order's version, in one script
// that writes the notes list only: the order's hash and its writes'
// history stay as they were.
func TestAnnotate(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := t.Context()
	storetest.Seed(t, s, "SO1")
	_, err := s.Modify(storetest.At(t, baseFence, 3), "evt-1", "SO1", orders.Changes{Remark: new("leave at door")})
	require.NoError(t, err)
	before, err := s.rdb.HGetAll(ctx, s.orderKey("SO1")).Result()
	require.NoError(t, err)
	hbefore, err := s.rdb.LRange(ctx, s.historyKey("SO1"), 0, -1).Result()
	require.NoError(t, err)

	require.NoError(t, s.Annotate(ctx, "SO1", orders.Note{By: "alice", Action: "hold", Reason: "customer called"}))
	after, err := s.rdb.HGetAll(ctx, s.orderKey("SO1")).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "a note changes nothing of the order")
	hafter, err := s.rdb.LRange(ctx, s.historyKey("SO1"), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, hbefore, hafter, "nor its writes' history")

	h, err := orders.AllHistory(ctx, s, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 3)
	assert.Equal(t, orders.Entry{
		Type: orders.TypeNote, Worker: "alice", Version: 2, Detail: "hold by alice: customer called",
		StartedAt: h[2].EndedAt, EndedAt: h[2].EndedAt,
	}, h[2])

	// The write's position and event are still the newest: a repeat is a
	// replay, an older position is passed.
	r, err := s.Modify(storetest.At(t, baseFence, 3), "evt-1", "SO1", orders.Changes{Remark: new("leave at door")})
	require.NoError(t, err)
	assert.True(t, r.Replayed)
	_, err = s.Modify(storetest.At(t, baseFence, 2), "evt-2", "SO1", orders.Changes{Remark: new("x")})
	assert.ErrorIs(t, err, orders.ErrPassed)

	err = s.Annotate(ctx, "SO404", orders.Note{By: "alice", Action: "hold"})
	assert.ErrorIs(t, err, orders.ErrNotFound)
	n, err := s.rdb.Exists(ctx, s.orderKey("SO404"), s.historyKey("SO404"), s.notesKey("SO404")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a note never creates an order")
}

func TestAnnotateInvalid(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	storetest.Seed(t, s, "SO1")
	tests := []struct {
		name    string
		orderNo string
		note    orders.Note
	}{
		{"bad number", "SO 1", orders.Note{By: "a", Action: "hold"}},
		{"no principal", "SO1", orders.Note{By: " ", Action: "hold"}},
		{"no action", "SO1", orders.Note{By: "a"}},
		{"principal too long", "SO1", orders.Note{By: strings.Repeat("a", orders.MaxNoteBy+1), Action: "hold"}},
		{"reason too long", "SO1", orders.Note{By: "a", Action: "hold", Reason: strings.Repeat("r", orders.MaxNoteReason+1)}},
		{"separator in reason", "SO1", orders.Note{By: "a", Action: "hold", Reason: "x\x1fy"}},
		{"newline in principal", "SO1", orders.Note{By: "a\nb", Action: "hold"}},
		{"not UTF-8", "SO1", orders.Note{By: "a", Action: "hold", Reason: "\xff"}},
		{"bidirectional override in reason", "SO1", orders.Note{By: "a", Action: "hold", Reason: "invoice\u202etxt.exe"}},
		{"format character in principal", "SO1", orders.Note{By: "a\u200bb", Action: "hold"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.ErrorIs(t, s.Annotate(t.Context(), tt.orderNo, tt.note), orders.ErrInvalid)
		})
	}
	o, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), o.Version, "nothing was written")
}

// Notes have their own cap: a flood of them drops the oldest notes, never
// a write, and paging still follows the writes' versions once the oldest
// writes are dropped.
func TestAnnotateNotesMax(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, HistoryMax: 3, NotesMax: 2})
	require.NoError(t, err)
	ctx := t.Context()
	storetest.Seed(t, s, "SO1")
	for i := range 4 {
		_, err := s.Modify(storetest.At(t, baseFence, int64(i+1)), fmt.Sprint("evt-", i), "SO1", orders.Changes{Remark: new(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	for i := range 1002 {
		require.NoError(t, s.Annotate(ctx, "SO1", orders.Note{By: "bob", Action: fmt.Sprint("note ", i)}))
	}
	n, err := s.rdb.LLen(ctx, s.notesKey("SO1")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "NotesMax")
	p, err := s.History(ctx, "SO1", orders.HistoryQuery{Limit: 2})
	require.NoError(t, err)
	require.Len(t, p.Entries, 2)
	assert.Equal(t, []int64{3, 4}, []int64{p.Entries[0].Version, p.Entries[1].Version}, "HistoryMax writes, whatever the notes")
	assert.Equal(t, int64(4), p.Next)
	p, err = s.History(ctx, "SO1", orders.HistoryQuery{After: p.Next})
	require.NoError(t, err)
	require.Len(t, p.Entries, 3)
	assert.Equal(t, orders.TypeModify, p.Entries[0].Type)
	assert.Equal(t, "note 1000 by bob", p.Entries[1].Detail)
	assert.Equal(t, "note 1001 by bob", p.Entries[2].Detail)
	assert.Zero(t, p.Next)
}

// Notes written before the oldest write kept come first, and a page takes
// the notes of the writes on it only.
func TestHistoryMergesNotes(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix, HistoryMax: 2})
	require.NoError(t, err)
	ctx := t.Context()
	storetest.Seed(t, s, "SO1")
	note := func(what string) { require.NoError(t, s.Annotate(ctx, "SO1", orders.Note{By: "bob", Action: what})) }
	modify := func(pos int64) {
		_, err := s.Modify(storetest.At(t, baseFence, pos), fmt.Sprint("evt-", pos), "SO1", orders.Changes{Remark: new("x")})
		require.NoError(t, err)
	}
	note("a") // at 1, whose write is dropped below
	modify(1)
	note("b") // at 2
	note("c")
	modify(2)
	note("d") // at 3
	var got []string
	q := orders.HistoryQuery{Limit: 1}
	for {
		p, err := s.History(ctx, "SO1", q)
		require.NoError(t, err)
		var page []string
		for _, e := range p.Entries {
			page = append(page, fmt.Sprintf("%s@%d:%s", strings.TrimPrefix(e.Type, "order:"), e.Version, strings.TrimSuffix(e.Detail, " by bob")))
		}
		got = append(got, strings.Join(page, " "))
		if p.Next == 0 {
			break
		}
		q.After = p.Next
	}
	assert.Equal(t, []string{"note@1:a modify@2:changed remark note@2:b note@2:c", "modify@3:changed remark note@3:d"}, got)
}

// TestFailedCommitWritesNothing gives an order a wrongly typed history (a
// fault, or the worker's user by hand): the modify, the put and the
// exchange's creation fail, and write nothing, so that once the history is
// mended the same change applies, in its turn, instead of being found past.
func TestFailedCommitWritesNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := t.Context()
	storetest.Seed(t, s, "SO23")
	require.NoError(t, s.rdb.Del(ctx, s.historyKey("SO23")).Err())
	require.NoError(t, s.rdb.Set(ctx, s.historyKey("SO23"), "x", 0).Err())
	before, err := s.rdb.HGetAll(ctx, s.orderKey("SO23")).Result()
	require.NoError(t, err)

	_, err = s.Modify(storetest.At(t, baseFence, 1), "evt-23", "SO23", orders.Changes{Remark: new("changed")})
	require.ErrorContains(t, err, "WRONGTYPE")
	require.ErrorContains(t, s.Put(ctx, orders.Order{No: "SO23", Address: "2 New Rd"}), "WRONGTYPE")
	after, err := s.rdb.HGetAll(ctx, s.orderKey("SO23")).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "a failed commit writes nothing of the order")
	evs, _ := s.eventKeys("SO23")
	n, err := s.rdb.Exists(ctx, evs[:]...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nor the event's record")

	require.NoError(t, s.rdb.Del(ctx, s.historyKey("SO23")).Err())
	r, err := s.Modify(storetest.At(t, baseFence, 1), "evt-23", "SO23", orders.Changes{Remark: new("changed")})
	require.NoError(t, err, "the retry applies the change")
	assert.False(t, r.Replayed)
	assert.Equal(t, "changed", r.Order.Remark)

	// The creation of an exchange's replacement, whose history is wrongly
	// typed, creates nothing; mended, the exchange's retry creates it.
	require.NoError(t, s.rdb.Set(ctx, s.historyKey("SO24"), "x", 0).Err())
	x := orders.Exchange{NewOrderNo: "SO24", Items: []orders.Item{{SKU: "A", Qty: 1}}}
	_, err = s.Exchange(storetest.At(t, baseFence, 2), "evt-x", "SO23", x)
	require.ErrorContains(t, err, "WRONGTYPE")
	n, err = s.rdb.Exists(ctx, s.orderKey("SO24")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the replacement is not created")
	require.NoError(t, s.rdb.Del(ctx, s.historyKey("SO24")).Err())
	r, err = s.Exchange(storetest.At(t, baseFence, 2), "evt-x", "SO23", x)
	require.NoError(t, err)
	assert.Equal(t, "SO24", r.Order.No)
}
