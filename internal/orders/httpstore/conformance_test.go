package httpstore

import (
	"testing"

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
