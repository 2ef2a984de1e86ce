package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
)

// env returns a getenv of vars only.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// collector is an OTLP/HTTP endpoint over a real socket that notes each
// export it receives and answers it with success.
type collector struct {
	srv *httptest.Server

	mu      sync.Mutex
	exports []export
}

// export is one request the collector received.
type export struct {
	method, path, contentType string
	size                      int
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.exports = append(c.exports, export{r.Method, r.URL.Path, r.Header.Get("Content-Type"), len(b)})
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) received() []export {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]export(nil), c.exports...)
}

// fromEnv sets tracing up from vars, requires it on, and shuts it down at
// cleanup (a second Shutdown is harmless).
func fromEnv(t *testing.T, service string, vars map[string]string) *tracing.Tracing {
	t.Helper()
	tr, err := tracing.FromEnv(t.Context(), service, env(vars))
	require.NoError(t, err)
	require.True(t, tr.On(), "tracing on")
	require.NotNil(t, tr.Provider())
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// recorder adds an in-memory span recorder to tr's SDK provider.
func recorder(t *testing.T, tr *tracing.Tracing) *tracetest.SpanRecorder {
	t.Helper()
	tp, ok := tr.Provider().(*sdktrace.TracerProvider)
	require.True(t, ok, "an SDK provider: %T", tr.Provider())
	rec := tracetest.NewSpanRecorder()
	tp.RegisterSpanProcessor(rec)
	return rec
}

func TestFromEnvOff(t *testing.T) {
	t.Parallel()
	const endpoint = "http://127.0.0.1:1"
	tests := []struct {
		name string
		vars map[string]string
	}{
		{"no variables", nil},
		{"unrelated variables", map[string]string{"OTEL_SERVICE_NAME": "svc", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}},
		{"disabled, any case and spaces", map[string]string{"OTEL_SDK_DISABLED": " TRUE ", "OTEL_TRACES_EXPORTER": "console"}},
		{"disabled wins over a bad exporter", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"}},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}},
		{"exporter none, any case", map[string]string{"OTEL_TRACES_EXPORTER": "None", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr, err := tracing.FromEnv(t.Context(), "svc", env(tt.vars))
			require.NoError(t, err)
			require.NotNil(t, tr)
			assert.False(t, tr.On())
			assert.Nil(t, tr.Provider(), "an untyped nil: the components' off")
			assert.NoError(t, tr.Shutdown(t.Context()))
		})
	}
}

// A nil or zero Tracing is tracing off.
func TestTracingNilIsOff(t *testing.T) {
	t.Parallel()
	for _, tr := range []*tracing.Tracing{nil, {}} {
		assert.False(t, tr.On())
		assert.Nil(t, tr.Provider())
		assert.NoError(t, tr.Shutdown(t.Context()))
	}
	assert.Nil(t, tracing.Tracer(nil), "no tracer without a provider")
	assert.NotNil(t, tracing.Tracer(sdktrace.NewTracerProvider()))
}

// OTLP over HTTP: the spans reach the endpoint's /v1/traces, at the latest
// when Shutdown flushes them.
func TestFromEnvOTLP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		vars     func(url string) map[string]string
		wantPath string
	}{
		{"base endpoint", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u}
		}, "/v1/traces"},
		{"base endpoint with a slash, exporter and protocol named", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u + "/", "OTEL_TRACES_EXPORTER": "otlp",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
		}, "/v1/traces"},
		{"base endpoint with a path", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u + "/otlp"}
		}, "/otlp/v1/traces"},
		{"traces endpoint, as it is", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": u + "/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": u + "/base",
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
		}, "/custom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCollector(t)
			tr := fromEnv(t, "svc", tt.vars(c.srv.URL))
			_, span := tr.Provider().Tracer("test").Start(t.Context(), "work")
			span.End()
			require.NoError(t, tr.Shutdown(t.Context()))

			got := c.received()
			require.NotEmpty(t, got, "Shutdown flushed the span")
			for _, e := range got {
				assert.Equal(t, http.MethodPost, e.method)
				assert.Equal(t, tt.wantPath, e.path)
				assert.Equal(t, "application/x-protobuf", e.contentType)
				assert.Positive(t, e.size, "the export carries the span")
			}
			assert.NoError(t, tr.Shutdown(t.Context()), "a second Shutdown")
		})
	}
}

// OTEL_TRACES_EXPORTER=otlp alone turns tracing on, with the SDK's default
// endpoint.
func TestFromEnvOTLPWithoutEndpoint(t *testing.T) {
	t.Parallel()
	tr, err := tracing.FromEnv(t.Context(), "svc", env(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}))
	require.NoError(t, err)
	assert.True(t, tr.On())
	require.NoError(t, tr.Shutdown(t.Context()), "nothing to flush")
}

func TestFromEnvConsole(t *testing.T) {
	t.Parallel()
	tr := fromEnv(t, "svc", map[string]string{"OTEL_TRACES_EXPORTER": " Console "})
	assert.NoError(t, tr.Shutdown(t.Context()))
}

func TestFromEnvUnsupported(t *testing.T) {
	t.Parallel()
	const endpoint = "http://127.0.0.1:1"
	tests := []struct {
		name string
		vars map[string]string
		msg  string
	}{
		{"grpc protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			`OTEL_EXPORTER_OTLP_PROTOCOL "grpc"`},
		{"grpc traces protocol", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			`"grpc"`},
		{"the traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			`"grpc"`},
		{"http/json", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			`"http/json"`},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"},
			`OTEL_TRACES_EXPORTER "zipkin"`},
		{"unknown exporter with an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
			`OTEL_TRACES_EXPORTER "jaeger"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr, err := tracing.FromEnv(t.Context(), "svc", env(tt.vars))
			require.ErrorIs(t, err, tracing.ErrUnsupported)
			assert.ErrorContains(t, err, tt.msg)
			assert.Nil(t, tr)
		})
	}
}

// The resource names the service: the name given, or OTEL_SERVICE_NAME.
func TestFromEnvServiceName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vars map[string]string
		want string
	}{
		{"default", nil, "orderworker-test"},
		{"OTEL_SERVICE_NAME", map[string]string{"OTEL_SERVICE_NAME": "billing-intake"}, "billing-intake"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCollector(t)
			vars := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.srv.URL}
			for k, v := range tt.vars {
				vars[k] = v
			}
			tr := fromEnv(t, "orderworker-test", vars)
			rec := recorder(t, tr)
			_, span := tr.Provider().Tracer("test").Start(t.Context(), "work")
			span.End()
			require.NoError(t, tr.Shutdown(t.Context()))

			ended := rec.Ended()
			require.Len(t, ended, 1)
			res := ended[0].Resource()
			name, ok := res.Set().Value(semconv.ServiceNameKey)
			require.True(t, ok, "service.name: %v", res)
			assert.Equal(t, tt.want, name.AsString())
			lang, ok := res.Set().Value(semconv.TelemetrySDKLanguageKey)
			require.True(t, ok, "the SDK's attributes: %v", res)
			assert.Equal(t, "go", lang.AsString())
		})
	}
}

// OTEL_RESOURCE_ATTRIBUTES is read from the process's environment (the
// SDK's own reading); a malformed one is an error naming the variables,
// whether or not OTEL_SERVICE_NAME is set too.
func TestFromEnvResourceAttributes(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging,team=orders")
	c := newCollector(t)
	tr := fromEnv(t, "svc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.srv.URL})
	rec := recorder(t, tr)
	_, span := tr.Provider().Tracer("test").Start(t.Context(), "work")
	span.End()
	require.NoError(t, tr.Shutdown(t.Context()))
	require.Len(t, rec.Ended(), 1)
	team, ok := rec.Ended()[0].Resource().Set().Value("team")
	require.True(t, ok)
	assert.Equal(t, "orders", team.AsString())

	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign")
	for _, vars := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": c.srv.URL},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": c.srv.URL, "OTEL_SERVICE_NAME": "named"},
	} {
		tr, err := tracing.FromEnv(t.Context(), "svc", env(vars))
		require.Error(t, err, "%v", vars)
		assert.ErrorContains(t, err, "OTEL_RESOURCE_ATTRIBUTES")
		assert.Nil(t, tr)
	}
}

// sdkTracer returns a tracer of an SDK provider that records every span.
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

	tc := tracing.Inject(ctx)
	require.NotNil(t, tc)
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", tc.Traceparent)
	assert.Equal(t, "vendor=x,other=y", tc.Tracestate)
	require.NoError(t, tasks.ModifyPayload{EventID: "e", OrderNo: "SO1",
		Changes: tasks.Changes{Remark: new("r")}, Trace: tc}.Validate(), "a payload carries it as it is")

	got, gotSC := tracing.Extract(t.Context(), tc)
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
	tc := tracing.Inject(ctx)
	require.NotNil(t, tc)
	assert.True(t, strings.HasSuffix(tc.Traceparent, "-00"), tc.Traceparent)
	_, sc := tracing.Extract(t.Context(), tc)
	assert.True(t, sc.IsValid())
	assert.False(t, sc.IsSampled())
}

func TestInjectWithoutSpan(t *testing.T) {
	t.Parallel()
	assert.Nil(t, tracing.Inject(t.Context()))
	// A span that is not valid (a no-op tracer's without a parent).
	ctx, span := noop.NewTracerProvider().Tracer("test").Start(t.Context(), "send")
	defer span.End()
	assert.Nil(t, tracing.Inject(ctx))
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

	tc := tracing.Inject(ctx)
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
	assert.Equal(t, exact, tracing.Inject(ctx).Tracestate)
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
			ctx, sc := tracing.Extract(t.Context(), tt.tc)
			require.NotNil(t, ctx)
			assert.False(t, sc.IsValid())
			assert.False(t, trace.SpanContextFromContext(ctx).IsValid())
			assert.Nil(t, tracing.LogFields(ctx))
		})
	}
}

// A readable traceparent with an unreadable tracestate keeps the trace and
// drops the state.
func TestExtractBadTracestate(t *testing.T) {
	t.Parallel()
	_, sc := tracing.Extract(t.Context(), &tasks.TraceContext{
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Tracestate:  "not a=valid,,,=state",
	})
	require.True(t, sc.IsValid())
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", sc.SpanID().String())
	assert.Zero(t, sc.TraceState().Len())
}

func TestLogFields(t *testing.T) {
	t.Parallel()
	assert.Nil(t, tracing.LogFields(t.Context()), "no span")

	tracer, _ := sdkTracer(t)
	ctx, span := tracer.Start(t.Context(), "work")
	defer span.End()
	sc := span.SpanContext()

	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	log.Info("fields", tracing.LogFields(ctx)...)
	tracing.Log(ctx, log).Info("log")
	tracing.Log(t.Context(), log).Info("without")
	require.Equal(t, log, tracing.Log(t.Context(), log), "the same logger without a span")

	entries := logs.AllUntimed()
	require.Len(t, entries, 3)
	want := map[string]any{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
	assert.Equal(t, want, entries[0].ContextMap())
	assert.Equal(t, want, entries[1].ContextMap())
	assert.Empty(t, entries[2].ContextMap())
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
