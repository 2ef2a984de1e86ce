package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracedExport is the tracing of (bt): an SDK tracer provider at full
// sampling (AlwaysSample) whose BatchSpanProcessor, with the SDK's default
// queue and batch sizes (as telemetry.FromEnv sets it up), exports over OTLP
// HTTP (protobuf) to a receiver in this process that reads each request's
// body, discards it and answers 200. It counts the spans that ended, the
// spans and the bytes exported: ended minus exported is what the batch
// processor dropped (its queue full).
type tracedExport struct {
	srv   *httptest.Server
	tp    *sdktrace.TracerProvider
	ended atomic.Int64 // spans ended
	spans atomic.Int64 // spans handed to the OTLP exporter
	bytes atomic.Int64 // request bodies the receiver read
	posts atomic.Int64 // export requests the receiver answered
}

// newTracedExport starts the receiver and the provider. Close stops both.
func newTracedExport(ctx context.Context) (*tracedExport, error) {
	t := &tracedExport{}
	t.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		t.bytes.Add(n)
		t.posts.Add(1)
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse: all accepted
	}))
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(t.srv.URL+"/v1/traces"))
	if err != nil {
		t.srv.Close()
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	t.tp = sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(endCounter{&t.ended}),
		sdktrace.WithBatcher(countingExporter{exp, &t.spans}),
	)
	return t, nil
}

// Provider is the tracer provider to give the producer or the worker.
func (t *tracedExport) Provider() trace.TracerProvider { return t.tp }

// Flush exports every span that ended so far.
func (t *tracedExport) Flush(ctx context.Context) error { return t.tp.ForceFlush(ctx) }

// Close flushes and stops the provider (its batch processor's goroutine
// and the exporter), then the receiver.
func (t *tracedExport) Close(ctx context.Context) error {
	err := t.tp.Shutdown(ctx)
	t.srv.Close()
	return err
}

// traceCounts is what a tracedExport counted.
type traceCounts struct{ ended, spans, bytes, posts int64 }

func (t *tracedExport) counts() traceCounts {
	return traceCounts{t.ended.Load(), t.spans.Load(), t.bytes.Load(), t.posts.Load()}
}

// endCounter counts the spans that end, beside the batch processor.
type endCounter struct{ n *atomic.Int64 }

func (endCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c endCounter) OnEnd(sdktrace.ReadOnlySpan)                   { c.n.Add(1) }
func (endCounter) Shutdown(context.Context) error                  { return nil }
func (endCounter) ForceFlush(context.Context) error                { return nil }

// countingExporter counts the spans handed to its exporter.
type countingExporter struct {
	sdktrace.SpanExporter
	n *atomic.Int64
}

func (e countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err == nil {
		e.n.Add(int64(len(spans)))
	}
	return err
}
