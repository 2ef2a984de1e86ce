package producer_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(closeExampleRedisAfter{m}))
}

// closeExampleRedisAfter runs the tests and then stops the examples' Redis.
type closeExampleRedisAfter struct{ m interface{ Run() int } }

func (r closeExampleRedisAfter) Run() int {
	defer stopExampleRedis()
	return r.m.Run()
}
