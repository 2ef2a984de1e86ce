package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/orderworker/orderworker/internal/telemetry"
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
func fromEnv(t *testing.T, service string, vars map[string]string) *telemetry.Tracing {
	t.Helper()
	tr, err := telemetry.FromEnv(t.Context(), service, env(vars))
	require.NoError(t, err)
	require.True(t, tr.On(), "tracing on")
	require.NotNil(t, tr.Provider())
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// recorder adds an in-memory span recorder to tr's SDK provider.
func recorder(t *testing.T, tr *telemetry.Tracing) *tracetest.SpanRecorder {
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
			tr, err := telemetry.FromEnv(t.Context(), "svc", env(tt.vars))
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
	for _, tr := range []*telemetry.Tracing{nil, {}} {
		assert.False(t, tr.On())
		assert.Nil(t, tr.Provider())
		assert.NoError(t, tr.Shutdown(t.Context()))
	}
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
	tr, err := telemetry.FromEnv(t.Context(), "svc", env(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}))
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
			tr, err := telemetry.FromEnv(t.Context(), "svc", env(tt.vars))
			require.ErrorIs(t, err, telemetry.ErrUnsupported)
			assert.ErrorContains(t, err, tt.msg)
			assert.Nil(t, tr)
		})
	}
}

// An endpoint that is not an absolute http or https URL is an error naming
// its variable: the SDK would export to localhost instead, silently.
func TestFromEnvBadEndpoint(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://%zz"},
	} {
		tr, err := telemetry.FromEnv(t.Context(), "svc", env(map[string]string{tt.name: tt.value}))
		require.ErrorContains(t, err, tt.name+": want an absolute http or https URL", tt.value)
		assert.Nil(t, tr)
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
		tr, err := telemetry.FromEnv(t.Context(), "svc", env(vars))
		require.Error(t, err, "%v", vars)
		assert.ErrorContains(t, err, "OTEL_RESOURCE_ATTRIBUTES")
		assert.Nil(t, tr)
	}
}

// sdkTracer returns a tracer of an SDK provider that records every span.
