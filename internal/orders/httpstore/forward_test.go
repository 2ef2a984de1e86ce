package httpstore

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/testkind"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// canceller is the store write of test:custom-kind (testkind), which the
// HTTP store has no write of its own for.
type canceller interface {
	Cancel(ctx context.Context, eventID, no, reason string) (orders.Result, error)
}

// cancelStore is the upstream's store: the Redis store, whose modify
// keeps the rules of every fenced write, doing the cancel's change.
type cancelStore struct{ *redisstore.Store }

func (s cancelStore) Cancel(ctx context.Context, eventID, no, reason string) (orders.Result, error) {
	return s.Modify(ctx, eventID, no, orders.Changes{Remark: &reason})
}

var cancelEntry = worker.NewKind(worker.Wait{}, func(ctx context.Context, s canceller, p testkind.Payload) error {
	_, err := s.Cancel(ctx, p.EventID, p.OrderNo, p.Reason)
	return err
})

// A kind the HTTP store has no write for is forwarded to the upstream's
// endpoint of the kind, POST /orders/{no}/{name}, with the payload's own
// members as the body, and the upstream (the reference server, running
// the kind's handler on its store) applies it under every rule of a
// fenced write: the fence, the idempotency key, the sequence.
func TestForwardAKindWithoutAWrite(t *testing.T) {
	t.Parallel()
	up := newRefUpstreamOf(t, func(oracle *redisstore.Store) http.Handler {
		return orderapitest.NewHandler(cancelStore{oracle}, cancelEntry)
	})
	db, s := up.oracle, up.store(t, Config{})

	require.NoError(t, cancelEntry.Check(s), "the HTTP store serves the kind by forwarding it")
	require.Len(t, worker.KindsFor(s), len(worker.Kinds()))
	require.NoError(t, db.Put(t.Context(), orders.Order{No: "SO1", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

	p := testkind.Payload{EventID: "ev-1", OrderNo: "SO1", Reason: "customer <asked>", Seq: 7,
		Trace: &tasks.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	at := func(fence, seq int64) context.Context {
		return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, Worker: "w-1"})
	}
	require.NoError(t, cancelEntry.Apply(at(baseFence, 7), s, p))
	o, err := db.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, "customer <asked>", o.Remark)
	assert.Equal(t, int64(2), o.Version)
	h, err := orders.AllHistory(t.Context(), db, "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(7), h[len(h)-1].Seq, "the position went with the change")

	reqs := up.RequestsWith(HeaderIdempotencyKey, "ev-1")
	require.Len(t, reqs, 1)
	assert.Equal(t, upstreamtest.APIPath+"/orders/SO1/test-custom-kind", reqs[0].Path)
	assert.Equal(t, `{"reason":"customer <asked>"}`, string(reqs[0].Body), "the payload's own members only")
	assert.Equal(t, "7", reqs[0].Header.Get(HeaderSequence))

	// A repeat is a replay: applied once, answered as such.
	res, err := s.Forward(at(baseFence, 7), orders.Change{Type: testkind.Kind.Type, Name: testkind.Kind.Name,
		EventID: "ev-1", OrderNo: "SO1", Body: []byte(`{"reason":"customer <asked>"}`)})
	require.NoError(t, err)
	assert.True(t, res.Replayed)
	assert.Equal(t, int64(2), res.Order.Version)

	// The rules of a fenced write hold through the forward.
	p2 := testkind.Payload{EventID: "ev-2", OrderNo: "SO1", Reason: "late"}
	assert.ErrorIs(t, cancelEntry.Apply(at(baseFence-1, 0), s, p2), orders.ErrStaleFence)
	assert.ErrorIs(t, cancelEntry.Apply(at(baseFence, 7), s, p2), orders.ErrPassed)
	assert.ErrorIs(t, cancelEntry.Apply(at(baseFence, 0), s, testkind.Payload{EventID: "ev-1", OrderNo: "SO1", Reason: "other"}), orders.ErrConflict)
	assert.ErrorIs(t, cancelEntry.Apply(at(baseFence, 0), s, testkind.Payload{EventID: "ev-3", OrderNo: "SO-NONE", Reason: "x"}), orders.ErrNotFound)
	err = cancelEntry.Apply(at(baseFence, 0), s, testkind.Payload{EventID: "ev-4", OrderNo: "SO1"})
	assert.ErrorIs(t, err, orders.ErrInvalid, "the upstream validates the kind's payload")
	assert.True(t, orders.Permanent(err))
	o, err = db.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), o.Version, "no refused change wrote")
}

// Forward checks what it sends before sending: nothing goes out for a
// change without a fence, with an event ID that does not fit a header, a
// name that is not one path segment, or a body that is not an object.
func TestForwardChecksBeforeSending(t *testing.T) {
	t.Parallel()
	up := newCanned(t, http.StatusOK, nil, orderJSON("SO1"))
	s, err := New(up.srv.URL, &staticTokens{tok: "t"}, Config{})
	require.NoError(t, err)
	t.Cleanup(s.CloseIdleConnections)
	good := orders.Change{Type: "t:x", Name: "x", EventID: "ev-1", OrderNo: "SO1", Body: []byte(`{"a":1}`)}
	fenced := orders.WithWrite(t.Context(), orders.Write{Fence: 1})

	_, err = s.Forward(t.Context(), good)
	assert.ErrorIs(t, err, orders.ErrNoFence)
	for _, c := range []func(c *orders.Change){
		func(c *orders.Change) { c.EventID = "ev\n1" },
		func(c *orders.Change) { c.OrderNo = "SO 1" },
		func(c *orders.Change) { c.Name = "" },
		func(c *orders.Change) { c.Name = ".." },
		func(c *orders.Change) { c.Name = "a/b" },
		func(c *orders.Change) { c.Name = "history" },
		func(c *orders.Change) { c.Body = nil },
		func(c *orders.Change) { c.Body = []byte(`[1]`) },
		func(c *orders.Change) { c.Body = []byte(`{"a":`) },
	} {
		bad := good
		c(&bad)
		_, err := s.Forward(fenced, bad)
		assert.ErrorIs(t, err, orders.ErrInvalid, "%+v", bad)
	}
	assert.Zero(t, up.requests.Load(), "nothing was sent")

	res, err := s.Forward(fenced, good)
	require.NoError(t, err)
	assert.Equal(t, "SO1", res.Order.No)
	assert.Equal(t, int64(1), up.requests.Load())
}

// The reference server's endpoint of a forwarded kind refuses a body that
// carries the header's members (they come from the path and the headers),
// and an upstream without the kind's endpoint answers a bare 404, which
// the store reads as a failure to retry, not as a missing order.
func TestForwardedEndpointRefusals(t *testing.T) {
	t.Parallel()
	db := newOracle(t)
	require.NoError(t, db.Put(t.Context(), orders.Order{No: "SO1", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	h := orderapitest.NewHandler(cancelStore{db}, cancelEntry)
	for _, body := range []string{`{"reason":"x","order_no":"SO1"}`, `{"reason":"x","seq":3}`, `{"reason":"x","unknown":1}`, `[]`} {
		rec := postWrite(t, h, "/orders/SO1/test-custom-kind", body)
		assert.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", body, rec.Body.String())
	}
	rec := postWrite(t, h, "/orders/SO1/test-custom-kind", `{"reason":"x"}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())

	without := newRefUpstream(t) // the contract's kinds only
	s := without.store(t, Config{})
	require.NoError(t, without.oracle.Put(t.Context(), orders.Order{No: "SO1", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	err := cancelEntry.Apply(orders.WithWrite(t.Context(), orders.Write{Fence: baseFence}), s,
		testkind.Payload{EventID: "ev-9", OrderNo: "SO1", Reason: "x"})
	assert.ErrorIs(t, err, ErrUpstream)
	assert.NotErrorIs(t, err, orders.ErrNotFound)
	assert.False(t, orders.Permanent(err), "retried: the upstream may deploy the kind's endpoint")
}
