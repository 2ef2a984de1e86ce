package worker_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// BenchmarkTaskRun measures the worker's runs of modifies end to end
// through asynq on one Redis, without simulated work: b.N modifies, each to
// an order of its own, enqueued by the producer before the timer starts,
// then one worker (concurrency 10) started and timed until it has applied
// them all. ns/op is wall time per task; allocs/op and B/op count the whole
// process's allocations per task, asynq's and go-redis's included.
//
// tracing=off is the worker with no TracerProvider; tracing=on gives it,
// and the producer (so that each task carries its enqueue's trace
// context), an SDK tracer provider at full sampling whose batch processor
// hands every span to an exporter that discards it: the instrumentation
// and the SDK's cost, without the OTLP encoding (tools/bench's (bt) has
// it).
func BenchmarkTaskRun(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchTaskRun(b, nil) })
	b.Run("tracing=on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardSpans{}))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		benchTaskRun(b, tp)
	})
}

// discardSpans is a span exporter that drops what it gets.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

func benchTaskRun(b *testing.B, tp trace.TracerProvider) {
	db := redistest.New(b)
	ctx := b.Context()
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	if err != nil {
		b.Fatal(err)
	}
	p, err := producer.New(db.NewClient(b), producer.Config{KeyPrefix: db.Prefix, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	remark := "leave at the door"
	n := b.N
	err = forEach(n, 16, func(i int) error {
		no := "SO" + strconv.Itoa(i)
		if err := store.Put(ctx, orders.Order{No: no, Address: "seeded", Items: []orders.Item{{SKU: "A", Qty: 1}}}); err != nil {
			return err
		}
		_, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: &remark})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}

	var applied, other atomic.Int64
	done := make(chan struct{})
	w, err := worker.New(db.NewClient(b), store, worker.Config{
		KeyPrefix:      db.Prefix,
		Concurrency:    10,
		ID:             "bench",
		TracerProvider: tp,
		OnDone: func(d worker.Done) {
			if d.Outcome != worker.OutcomeOK {
				other.Add(1)
				return
			}
			if applied.Add(1) == int64(n) {
				close(done)
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	select {
	case <-done:
	case <-timeout.C:
	}
	b.StopTimer()
	w.Shutdown()
	if got := applied.Load(); got != int64(n) {
		b.Fatalf("%d of %d tasks applied after a minute (%d other runs)", got, n, other.Load())
	}
	b.ReportMetric(float64(other.Load())/float64(n), "waits/op")
}

// forEach calls f(0) … f(n-1) from up to width goroutines and returns the
// first error; every goroutine has ended when it returns.
func forEach(n, width int, f func(i int) error) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range min(width, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}
