package redisstore

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }
