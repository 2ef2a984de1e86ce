package tracing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
)

func sdkTracer(t *testing.T) (trace.Tracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("test"), rec
}

// remoteParent returns the test's context under a sampled remote span context with
// tracestate ts.
func remoteParent(t *testing.T, ts string) context.Context {
	t.Helper()
	state, err := trace.ParseTraceState(ts)
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})
	require.True(t, sc.IsValid())
	return trace.ContextWithRemoteSpanContext(t.Context(), sc)
}

func TestInjectExtractRoundTrip(t *testing.T) {
	t.Parallel()
	tracer, _ := sdkTracer(t)
	ctx, span := tracer.Start(remoteParent(t, "vendor=x,other=y"), "send")
	defer span.End()
	sc := span.SpanContext()

	tc := inject(ctx)
	require.NotNil(t, tc)
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", tc.Traceparent)
	assert.Equal(t, "vendor=x,other=y", tc.Tracestate)
	require.NoError(t, tasks.ModifyPayload{EventID: "e", OrderNo: "SO1",
		Changes: tasks.Changes{Remark: new("r")}, Trace: tc}.Validate(), "a payload carries it as it is")

	got, gotSC := extract(t.Context(), tc)
	assert.True(t, gotSC.IsValid())
	assert.True(t, gotSC.IsRemote())
	assert.True(t, gotSC.IsSampled())
	assert.Equal(t, sc.TraceID(), gotSC.TraceID())
	assert.Equal(t, sc.SpanID(), gotSC.SpanID())
	assert.Equal(t, sc.TraceState().String(), gotSC.TraceState().String())
	assert.Equal(t, gotSC, trace.SpanContextFromContext(got), "the context carries it")

	// A span started from the extracted context continues the trace.
	_, child := tracer.Start(got, "process")
	defer child.End()
	assert.Equal(t, sc.TraceID(), child.SpanContext().TraceID())
}

// An unsampled span is carried as such: its flags say so.
func TestInjectUnsampled(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx, span := tp.Tracer("test").Start(t.Context(), "send")
	defer span.End()
	tc := inject(ctx)
	require.NotNil(t, tc)
	assert.True(t, strings.HasSuffix(tc.Traceparent, "-00"), tc.Traceparent)
	_, sc := extract(t.Context(), tc)
	assert.True(t, sc.IsValid())
	assert.False(t, sc.IsSampled())
}

func TestInjectWithoutSpan(t *testing.T) {
	t.Parallel()
	assert.Nil(t, inject(t.Context()))
	// A span that is not valid (a no-op tracer's without a parent).
	ctx, span := noop.NewTracerProvider().Tracer("test").Start(t.Context(), "send")
	defer span.End()
	assert.Nil(t, inject(ctx))
}

// A tracestate longer than tasks.MaxTracestateLen is dropped, the
// traceparent kept: the result always passes the payload's validation.
func TestInjectDropsALongTracestate(t *testing.T) {
	t.Parallel()
	var members []string
	for _, k := range []string{"a", "b", "c"} {
		members = append(members, k+"="+strings.Repeat(k, 200))
	}
	long := strings.Join(members, ",")
	require.Greater(t, len(long), tasks.MaxTracestateLen)
	tracer, _ := sdkTracer(t)
	ctx, span := tracer.Start(remoteParent(t, long), "send")
	defer span.End()
	require.Equal(t, long, span.SpanContext().TraceState().String(), "the span has it")

	tc := inject(ctx)
	require.NotNil(t, tc)
	assert.Empty(t, tc.Tracestate)
	assert.Contains(t, tc.Traceparent, span.SpanContext().SpanID().String())
	require.NoError(t, tasks.ModifyPayload{EventID: "e", OrderNo: "SO1",
		Changes: tasks.Changes{Remark: new("r")}, Trace: tc}.Validate())

	// One at the bound is kept.
	exact := "a=" + strings.Repeat("a", 254) + ",b=" + strings.Repeat("b", tasks.MaxTracestateLen-256-3)
	require.Len(t, exact, tasks.MaxTracestateLen)
	ctx, span2 := tracer.Start(remoteParent(t, exact), "send")
	defer span2.End()
	assert.Equal(t, exact, inject(ctx).Tracestate)
}

// What does not read as W3C trace context gives an invalid span context
// (a new trace), never a panic.
func TestExtractInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tc   *tasks.TraceContext
	}{
		{"nil", nil},
		{"empty", &tasks.TraceContext{}},
		{"garbage", &tasks.TraceContext{Traceparent: "garbage", Tracestate: "also garbage"}},
		{"too short", &tasks.TraceContext{Traceparent: "00-4bf92f3577b34da6-00f067aa0ba902b7-01"}},
		{"zero trace ID", &tasks.TraceContext{Traceparent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}},
		{"zero span ID", &tasks.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}},
		{"version ff", &tasks.TraceContext{Traceparent: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{"upper case hex", &tasks.TraceContext{Traceparent: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"}},
		{"long", &tasks.TraceContext{Traceparent: strings.Repeat("0", tasks.MaxTraceparentLen)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, sc := extract(t.Context(), tt.tc)
			require.NotNil(t, ctx)
			assert.False(t, sc.IsValid())
			assert.False(t, trace.SpanContextFromContext(ctx).IsValid())
		})
	}
}

// A readable traceparent with an unreadable tracestate keeps the trace and
// drops the state.
func TestExtractBadTracestate(t *testing.T) {
	t.Parallel()
	_, sc := extract(t.Context(), &tasks.TraceContext{
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Tracestate:  "not a=valid,,,=state",
	})
	require.True(t, sc.IsValid())
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", sc.SpanID().String())
	assert.Zero(t, sc.TraceState().Len())
}

func TestTracerOfNilIsNil(t *testing.T) {
	t.Parallel()
	assert.Nil(t, tracing.Tracer(nil), "no tracer without a provider")
	assert.NotNil(t, tracing.Tracer(sdktrace.NewTracerProvider()))
}

func TestSlog(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	require.Same(t, log, tracing.Slog(t.Context(), log), "the same logger without a span")

	tracer, _ := sdkTracer(t)
	ctx, span := tracer.Start(t.Context(), "work")
	defer span.End()
	sc := span.SpanContext()
	tracing.Slog(ctx, log).Info("log")
	assert.Contains(t, buf.String(), `"trace_id":"`+sc.TraceID().String()+`"`)
	assert.Contains(t, buf.String(), `"span_id":"`+sc.SpanID().String()+`"`)
}

func TestRecordError(t *testing.T) {
	t.Parallel()
	tracer, rec := sdkTracer(t)
	_, span := tracer.Start(t.Context(), "failed")
	boom := errors.New("boom")
	tracing.RecordError(span, boom)
	span.End()
	_, ok := tracer.Start(t.Context(), "ok")
	tracing.RecordError(ok, nil)
	ok.End()

	// A span that does not record takes nothing, and does not panic.
	tracing.RecordError(trace.SpanFromContext(t.Context()), boom)

	ended := rec.Ended()
	require.Len(t, ended, 2)
	assert.Equal(t, sdktrace.Status{Code: codes.Error, Description: "boom"}, ended[0].Status())
	require.Len(t, ended[0].Events(), 1)
	ev := ended[0].Events()[0]
	assert.Equal(t, "exception", ev.Name)
	assert.Contains(t, ev.Attributes, attribute.String("exception.message", "boom"))

	assert.Equal(t, codes.Unset, ended[1].Status().Code)
	assert.Empty(t, ended[1].Events())
}

// LimitStartAttributes cuts long string attributes given at a span's start,
// at a UTF-8 boundary, and keeps the rest of the options as they were.
func TestLimitStartAttributes(t *testing.T) {
	t.Parallel()
	assert.Nil(t, tracing.LimitStartAttributes(nil, 10))
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tr := tracing.LimitStartAttributes(sdk, 5).Tracer("test")

	_, short := tr.Start(t.Context(), "short", trace.WithAttributes(attribute.String("a", "12345")))
	short.End()
	link := trace.Link{SpanContext: short.SpanContext()}
	_, long := tr.Start(t.Context(), "long", trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot(), trace.WithLinks(link),
		trace.WithAttributes(attribute.String("path", "/pqrä/and/more"), attribute.Int("n", 123456789), attribute.String("s", "ok")))
	long.End()

	ended := rec.Ended()
	require.Len(t, ended, 2)
	assert.Equal(t, []attribute.KeyValue{attribute.String("a", "12345")}, ended[0].Attributes())
	got := ended[1]
	assert.Equal(t, []attribute.KeyValue{attribute.String("path", "/pqr"), attribute.Int("n", 123456789), attribute.String("s", "ok")},
		got.Attributes(), "cut before the split ä; other types as they were")
	assert.Equal(t, trace.SpanKindServer, got.SpanKind())
	require.Len(t, got.Links(), 1)
	assert.Equal(t, short.SpanContext().SpanID(), got.Links()[0].SpanContext.SpanID())
	assert.False(t, got.Parent().IsValid())
}

// A cut value is a copy: the span keeps none of the long value's bytes,
// whether or not the SDK's own length limit cuts it again.
func TestLimitStartAttributesCopies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		value string
		limit int // the SDK's AttributeValueLengthLimit
		want  string
	}{
		{name: "ascii", value: strings.Repeat("A", 60_000), limit: -1, want: "AAAAA"},
		{name: "split rune", value: "/pqrä" + strings.Repeat("B", 60_000), limit: -1, want: "/pqr"},
		{name: "cut again by the sdk", value: strings.Repeat("C", 60_000), limit: 3, want: "CCC"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := tracetest.NewSpanRecorder()
			sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
				sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{AttributeValueLengthLimit: tt.limit, AttributeCountLimit: -1}))
			t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
			_, span := tracing.LimitStartAttributes(sdk, 5).Tracer("test").Start(t.Context(), "long",
				trace.WithAttributes(attribute.String("url.path", tt.value)))
			span.End()

			ended := rec.Ended()
			require.Len(t, ended, 1)
			require.Len(t, ended[0].Attributes(), 1)
			got := ended[0].Attributes()[0].Value.AsString()
			assert.Equal(t, tt.want, got)
			assert.False(t, within(got, tt.value), "the cut value shares the long value's bytes")
		})
	}
}

// within reports whether sub's bytes lie in s's.
func within(sub, s string) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.StringData(sub))), uintptr(unsafe.Pointer(unsafe.StringData(s)))
	return p >= lo && p < lo+uintptr(len(s))
}

// A long value given at a span's start is garbage once the span started:
// the span, still held (as the batcher holds it until export), does not
// keep it alive.
func TestLimitStartAttributesFreesTheLongValue(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tr := tracing.LimitStartAttributes(sdk, 0).Tracer("test")

	freed := make(chan struct{})
	func() {
		long := strings.Repeat("A", 60_000)
		runtime.AddCleanup(unsafe.StringData(long), func(chan struct{}) { close(freed) }, freed)
		_, span := tr.Start(t.Context(), "long", trace.WithAttributes(attribute.String("url.path", long)))
		span.End()
	}()
	// A cleanup runs on its own goroutine after the collection that
	// found its object unreachable: collect until it ran, for 5 s at most.
	deadline := time.After(5 * time.Second)
	for done := false; !done; {
		runtime.GC()
		select {
		case <-freed:
			done = true
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("the long value is still alive, held by the span")
		}
	}
	ended := rec.Ended()
	require.Len(t, ended, 1)
	assert.Len(t, ended[0].Attributes()[0].Value.AsString(), tracing.MaxStartAttributeLen)
}

// inject and extract carry a span context in a task's trace context, as
// the producer and the worker do.
func inject(ctx context.Context) *tasks.TraceContext {
	tp, ts := tracing.Inject(ctx)
	if tp == "" {
		return nil
	}
	return &tasks.TraceContext{Traceparent: tp, Tracestate: ts}
}

func extract(ctx context.Context, tc *tasks.TraceContext) (context.Context, trace.SpanContext) {
	if tc == nil {
		return tracing.Extract(ctx, "", "")
	}
	return tracing.Extract(ctx, tc.Traceparent, tc.Tracestate)
}

// The bound Inject keeps to is the payloads'.
func TestMaxTracestateLenIsThePayloads(t *testing.T) {
	t.Parallel()
	assert.Equal(t, tasks.MaxTracestateLen, tracing.MaxTracestateLen)
}
