package httpstore

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

// The HTTP store, against its reference upstream (orderapitest.NewHandler over a Redis
// store, served by upstreamtest), keeps the public store contract:
// storetest's suite, each case with an upstream of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) orders.Store { return newRefUpstream(t).store(t, Config{}) })
}

// The HTTP store serves a kind it has no write for by forwarding it
// (orders.Forwarder), and is held to that kind's own rules through the
// reference upstream: here every kind of the contract is forwarded (the
// store is seen without its Modify and Exchange, and the upstream serves
// no route of its own for them), as a kind added to the contract would
// be, and storetest runs each kind's rules through Forward.
func TestConformanceForwarded(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) orders.Store {
		up := newRefUpstreamOf(t, func(oracle *redisstore.Store) http.Handler {
			return orderapitest.NewHandler(forwardedOnly{oracle})
		})
		s := up.store(t, Config{})
		return struct {
			orders.Store
			orders.Forwarder
		}{s, s}
	})
}

// forwardedOnly is an upstream's store that has none of the contract's
// writes as a method of its own, so that the reference server serves
// every kind at its forwarded endpoint: it applies a forwarded change by
// running the kind's worker entry on the oracle.
type forwardedOnly struct{ oracle *redisstore.Store }

func (s forwardedOnly) Get(ctx context.Context, no string) (orders.Order, error) {
	return s.oracle.Get(ctx, no)
}

func (s forwardedOnly) History(ctx context.Context, no string, q orders.HistoryQuery) (orders.HistoryPage, error) {
	return s.oracle.History(ctx, no, q)
}

func (s forwardedOnly) Put(ctx context.Context, o orders.Order) error { return s.oracle.Put(ctx, o) }

func (s forwardedOnly) Forward(ctx context.Context, c orders.Change) (orders.Result, error) {
	for _, e := range worker.Kinds() {
		if e.Kind.Type != c.Type {
			continue
		}
		p, err := e.Kind.Decode(c.Body)
		if err != nil {
			return orders.Result{}, fmt.Errorf("%w: %w", err, orders.ErrInvalid)
		}
		if err := e.Apply(ctx, s.oracle, p.WithHeader(tasks.Header{EventID: c.EventID, OrderNo: c.OrderNo})); err != nil {
			return orders.Result{}, err
		}
		o, err := s.oracle.Get(ctx, c.OrderNo)
		return orders.Result{Order: o}, err
	}
	return orders.Result{}, fmt.Errorf("kind %s: %w", c.Type, orders.ErrInvalid)
}
