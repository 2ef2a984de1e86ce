package producer_test

import (
	"context"
	"strconv"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// BenchmarkEnqueueModify measures one accepted modify, each to an order of
// its own, from one goroutine: the producer's client-side cost and its
// latency (the tools/bench acceptance runs compare it with raw asynq under
// 8 goroutines).
func BenchmarkEnqueueModify(b *testing.B) {
	benchEnqueueModify(b, nil)
}

// BenchmarkEnqueueModifyTraced is BenchmarkEnqueueModify with tracing on at
// full sampling: a producer span per enqueue, its trace context carried in
// the task, the spans handed by the SDK's batch processor to an exporter
// that discards them. Compare it with BenchmarkEnqueueModify of the same
// run.
func BenchmarkEnqueueModifyTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardSpans{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	benchEnqueueModify(b, tp)
}

// discardSpans is a span exporter that drops what it gets.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

func benchEnqueueModify(b *testing.B, tp trace.TracerProvider) {
	db := redistest.New(b)
	p, err := producer.New(db.NewClient(b), producer.Config{KeyPrefix: db.Prefix, TracerProvider: tp})
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
