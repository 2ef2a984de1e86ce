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
