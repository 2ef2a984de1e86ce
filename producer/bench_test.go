package producer_test

import (
	"strconv"
	"testing"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// BenchmarkEnqueueModify measures one accepted modify, each to an order of
// its own, from one goroutine: the producer's client-side cost and its
// latency (the tools/bench acceptance runs compare it with raw asynq under
// 8 goroutines).
func BenchmarkEnqueueModify(b *testing.B) {
	db := redistest.New(b)
	p, err := producer.New(db.NewClient(b), producer.Config{KeyPrefix: db.Prefix})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	remark := "leave at the door"
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.EnqueueModify(b.Context(), "SO"+strconv.Itoa(i), tasks.Changes{Remark: &remark}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
