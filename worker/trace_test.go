package worker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// tracer is an SDK tracer provider whose ended spans the test reads.
type tracer struct {
	*sdktrace.TracerProvider
	spans *tracetest.InMemoryExporter
}

func newTracer(t *testing.T) tracer {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.WithoutCancel(t.Context())) })
	return tracer{tp, exp}
}

// of returns the ended spans of trace id, in the order they ended.
func (tr tracer) of(id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range tr.spans.GetSpans() {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

func named(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(kvs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// One change that waits behind a slow predecessor: its trace holds the
// enqueue (a producer span), each of its runs (consumer spans, children of
// and linked to the enqueue), the wait as an event naming the predecessor,
// the lock with its fence, the store's write and the hand-off; its log line
// carries the trace's ID.
func TestTraceOfAChangeThatWaitsBehindItsPredecessor(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-TR")
	tr := newTracer(t)
	r := newRuns()
	core, logs := observer.New(zapcore.InfoLevel)
	inWrite, release, waits := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	onWait := func(_, meta, _ string) {
		if strings.HasSuffix(meta, " ev-second") {
			once.Do(func() { close(waits) })
		}
	}
	held := storehook.Kinds(nil, func(ctx context.Context, _, ev, _ string) error {
		if ev == "ev-first" {
			close(inWrite)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	e.startWorker(worker.Config{Concurrency: 4, TracerProvider: tr, OnDone: r.add, OnLockWait: onWait, Logger: zap.New(core),
		Kinds: held}, nil)
	// The second change, accepted while the first runs, is parked; a park
	// of 1 s (asynq's least) brings it back to wait while the first is
	// still held in its write. With the default park (30 s) the wait below
	// raced its own timeout.
	p := e.producer(producer.Config{TracerProvider: tr, ParkFor: time.Second})
	up := tr.Tracer("upstream")

	ctx1, s1 := up.Start(t.Context(), "upstream 1")
	_, err := p.EnqueueModify(ctx1, "SO-TR", tasks.Changes{Remark: new("REMARK-ONE")}, producer.WithEventID("ev-first"))
	require.NoError(t, err)
	s1.End()
	select {
	case <-inWrite:
	case <-time.After(30 * time.Second):
		t.Fatal("the first change never reached its write")
	}
	ctx2, s2 := up.Start(t.Context(), "upstream 2")
	_, err = p.EnqueueModify(ctx2, "SO-TR", tasks.Changes{Remark: new("REMARK-TWO")}, producer.WithEventID("ev-second"))
	require.NoError(t, err)
	s2.End()
	select {
	case <-waits: // the second waits behind the first
	case <-time.After(30 * time.Second):
		t.Fatal("the second change never waited")
	}
	close(release)
	r.waitFor(t, "ev-second", 30*time.Second, worker.OutcomeOK)

	id := s2.SpanContext().TraceID()
	spans := tr.of(id)
	require.NotEqual(t, s1.SpanContext().TraceID(), id, "two upstream requests, two traces")

	send := named(spans, "send "+tasks.QueueModify)
	require.Len(t, send, 1)
	require.Equal(t, trace.SpanKindProducer, send[0].SpanKind)
	require.Equal(t, s2.SpanContext().SpanID(), send[0].Parent.SpanID(), "the enqueue is a child of the caller's span")

	runs := named(spans, "process "+tasks.QueueModify)
	require.NotEmpty(t, runs)
	var waited bool
	for _, run := range runs {
		require.Equal(t, trace.SpanKindConsumer, run.SpanKind)
		require.Equal(t, send[0].SpanContext.SpanID(), run.Parent.SpanID(), "each run is a child of the enqueue")
		require.Len(t, run.Links, 1)
		require.Equal(t, send[0].SpanContext.SpanID(), run.Links[0].SpanContext.SpanID(), "and linked to it")
		v, _ := attr(run.Attributes, "messaging.message.id")
		require.Equal(t, "ev-second", v.AsString())
		v, _ = attr(run.Attributes, "orderworker.order_no")
		require.Equal(t, "SO-TR", v.AsString())
	}
	for _, l := range named(spans, "order lock") {
		for _, ev := range l.Events {
			if ev.Name == "waiting for its turn" {
				head, _ := attr(ev.Attributes, "orderworker.head")
				require.Equal(t, tasks.PositionLabel(tasks.TypeModify, "ev-first"), head.AsString())
				waited = true
			}
		}
	}
	require.True(t, waited, "the wait behind the first change is an event of the second's lock span")
	last := runs[len(runs)-1]
	v, _ := attr(last.Attributes, "orderworker.outcome")
	require.Equal(t, worker.OutcomeOK, v.AsString())
	locked := named(spans, "order lock")
	fence, ok := attr(locked[len(locked)-1].Attributes, "orderworker.fence")
	require.True(t, ok, "the lock span carries the fence")
	require.Positive(t, fence.AsInt64())
	write := named(spans, "order write")
	require.Len(t, write, 1, "one write")
	require.Equal(t, last.SpanContext.SpanID(), write[0].Parent.SpanID())
	require.Len(t, named(spans, "order hand-off"), 1)
	for _, s := range spans {
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "REMARK", "payload contents are never attributes (%s on %s)", kv.Key, s.Name)
		}
	}

	// The log line of each run of the second change carries its trace.
	lines := logs.FilterMessageSnippet("task").FilterField(zap.String("event_id", "ev-second")).All()
	require.NotEmpty(t, lines)
	for _, l := range lines {
		require.Equal(t, id.String(), l.ContextMap()["trace_id"], "log line %q", l.Message)
	}
}

// A task enqueued by hand without a trace context runs as a new trace; one
// whose trace context does not read as W3C runs as a new trace too, and a
// worker without tracing ignores a valid one. All three are applied.
func TestTraceContextIsOptional(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-TO")
	tr := newTracer(t)
	r := newRuns()
	e.startWorker(worker.Config{TracerProvider: tr, OnDone: r.add}, nil)

	e.modify("SO-TO", "by-hand", tasks.Changes{Remark: new("by hand")})
	bad := tasks.ModifyPayload{EventID: "bad-trace", OrderNo: "SO-TO", Changes: tasks.Changes{Remark: new("bad")},
		Trace: &tasks.TraceContext{Traceparent: "not-a-traceparent", Tracestate: "x"}}
	task, err := tasks.NewTask(bad)
	require.NoError(t, err)
	e.enqueue(task, tasks.QueueModify, "bad-trace")
	r.waitFor(t, "by-hand", 30*time.Second, worker.OutcomeOK)
	r.waitFor(t, "bad-trace", 30*time.Second, worker.OutcomeOK)
	for _, s := range tr.spans.GetSpans() {
		if strings.HasPrefix(s.Name, "process ") {
			require.False(t, s.Parent.IsValid(), "%s: a new trace", s.Name)
			require.Empty(t, s.Links)
		}
	}
}

// A run that fails records the error on its spans: the run's and the
// write's.
func TestTraceRecordsErrors(t *testing.T) {
	e := newEnv(t)
	tr := newTracer(t)
	r := newRuns()
	e.startWorker(worker.Config{TracerProvider: tr, OnDone: r.add}, nil)
	e.modify("SO-NONE", "ev-missing", tasks.Changes{Remark: new("x")}) // no such order
	d := r.waitFor(t, "ev-missing", 30*time.Second)
	require.Equal(t, worker.OutcomeRejected, d.Outcome)
	var run, write *tracetest.SpanStub
	for _, s := range tr.spans.GetSpans() {
		switch s.Name {
		case "process " + tasks.QueueModify:
			run = &s
		case "order write":
			write = &s
		}
	}
	require.NotNil(t, run)
	require.NotNil(t, write)
	require.Equal(t, codes.Error, run.Status.Code)
	require.Equal(t, codes.Error, write.Status.Code)
	require.NotEmpty(t, run.Events, "the error is recorded as an event")
	v, _ := attr(run.Attributes, "orderworker.outcome")
	require.Equal(t, worker.OutcomeRejected, v.AsString())
}

// A store write that panics still ends its "order write" span, and the
// run's span records the failure.
func TestTraceEndsTheWriteSpanOnAPanic(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-TP")
	tr := newTracer(t)
	r := newRuns()
	e.startWorker(worker.Config{TracerProvider: tr, OnDone: r.add,
		Kinds: storehook.Kinds(nil, func(context.Context, string, string, string) error { panic("handler bug") })}, nil)
	e.modify("SO-TP", "ev-panic", tasks.Changes{Remark: new("x")})
	d := r.waitFor(t, "ev-panic", 30*time.Second)
	require.Equal(t, worker.OutcomeError, d.Outcome)
	write := named(tr.spans.GetSpans(), "order write")
	require.NotEmpty(t, write, "the write's span ended despite the panic")
	runs := named(tr.spans.GetSpans(), "process "+tasks.QueueModify)
	require.NotEmpty(t, runs)
	require.Equal(t, codes.Error, runs[0].Status.Code)
}
