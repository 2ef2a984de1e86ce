package redisstore

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }
