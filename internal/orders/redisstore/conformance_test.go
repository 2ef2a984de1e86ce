package redisstore

import (
	"testing"

	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

// The Redis store keeps the public store contract: storetest's suite, each
// case on its own key prefix.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) orders.Store { return newStore(t) })
}

// A store that serves some kinds only passes the rules of its writes: the
// suite skips the others' rules, and runs the rules of every fenced write
// for the writes it has.
func TestConformanceOfAPartialStore(t *testing.T) {
	t.Parallel()
	type modifyOnly struct {
		orders.Store
		orders.Modifier
	}
	type exchangeOnly struct {
		orders.Store
		orders.Exchanger
	}
	t.Run("modify only", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) orders.Store { s := newStore(t); return modifyOnly{s, s} })
	})
	t.Run("exchange only", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) orders.Store { s := newStore(t); return exchangeOnly{s, s} })
	})
	t.Run("reads only", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) orders.Store { return struct{ orders.Store }{newStore(t)} })
	})
}
