package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

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
	auth                      string // the Authorization header
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
		c.exports = append(c.exports, export{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), len(b)})
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

// The exporter's headers come from OTEL_EXPORTER_OTLP_HEADERS, or
// OTEL_EXPORTER_OTLP_TRACES_HEADERS, which wins, URL-decoded.
func TestFromEnvHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vars map[string]string
		want string
	}{
		{"generic", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20generic-secret, x-team=orders"}, "Bearer generic-secret"},
		{"traces wins", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20generic",
			"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20traces"}, "Bearer traces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCollector(t)
			tt.vars["OTEL_EXPORTER_OTLP_ENDPOINT"] = c.srv.URL
			tr := fromEnv(t, "svc", tt.vars)
			_, span := tr.Provider().Tracer("test").Start(t.Context(), "work")
			span.End()
			require.NoError(t, tr.Shutdown(t.Context()))
			got := c.received()
			require.NotEmpty(t, got)
			assert.Equal(t, tt.want, got[0].auth)
		})
	}
}

// A malformed OTEL_EXPORTER_OTLP_HEADERS stops the process at start with
// an error that names the variable and the entry's position, and never
// holds the text: it usually carries the collector's credential (the SDK
// printed it to standard error and went on without it).
func TestFromEnvMalformedHeadersHidden(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-collector-token"
	tests := []struct {
		name, variable, value, msg string
	}{
		{"no equals sign", "OTEL_EXPORTER_OTLP_HEADERS", "Authorization Bearer " + secret, "entry 1 of 1 has no '='"},
		{"second entry", "OTEL_EXPORTER_OTLP_HEADERS", "x-team=orders,Authorization:Bearer " + secret, "entry 2 of 2 has no '='"},
		{"bad key", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "Author ization" + secret + "=x", "entry 1 of 1 has a key that is not a valid header name"},
		{"bad escape", "OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%zz" + secret, "entry 1 of 1 has a value that does not URL-decode"},
		{"empty entry", "OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20" + secret + ",", "entry 2 of 2 is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr, err := telemetry.FromEnv(t.Context(), "svc", env(map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", tt.variable: tt.value}))
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorContains(t, err, tt.variable+": "+tt.msg)
			assert.NotContains(t, err.Error(), secret)
			assert.NotContains(t, err.Error(), "Bearer")
		})
	}
}

// An OTEL_TRACES_SAMPLER the SDK does not build (it sampled everything)
// or an OTEL_TRACES_SAMPLER_ARG that is not a ratio stops the process at
// start, naming the variable and not echoing its value.
func TestFromEnvBadSampler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		sampler     string
		arg         string
		msg, hidden string
	}{
		{"unknown", "sample-secretly", "", "OTEL_TRACES_SAMPLER: not a sampler this build has", "secretly"},
		{"jaeger remote", "parentbased_jaeger_remote", "", "OTEL_TRACES_SAMPLER: not a sampler", "jaeger"},
		{"ratio not a number", "traceidratio", "tenpercent", "OTEL_TRACES_SAMPLER_ARG: want a ratio", "tenpercent"},
		{"ratio above one", "parentbased_traceidratio", "10.5", "OTEL_TRACES_SAMPLER_ARG: want a ratio", "10.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr, err := telemetry.FromEnv(t.Context(), "svc", env(map[string]string{"OTEL_TRACES_EXPORTER": "console",
				"OTEL_TRACES_SAMPLER": tt.sampler, "OTEL_TRACES_SAMPLER_ARG": tt.arg}))
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.ErrorContains(t, err, tt.msg)
			assert.NotContains(t, err.Error(), tt.hidden)
		})
	}
}

// The samplers the SDK builds are taken, in any case: always_off records
// nothing, a ratio of 0 neither, always_on everything.
func TestFromEnvSampler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		sampler string
		arg     string
		sampled bool
	}{
		{"default", "", "", true},
		{"always_on", "always_on", "", true},
		{"always_off", " Always_Off ", "", false},
		{"parentbased_always_off", "parentbased_always_off", "", false},
		{"traceidratio 0", "traceidratio", "0", false},
		{"traceidratio unset is 1", "traceidratio", "", true},
		{"parentbased_traceidratio 1", "parentbased_traceidratio", "1", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := fromEnv(t, "svc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": newCollector(t).srv.URL,
				"OTEL_TRACES_SAMPLER": tt.sampler, "OTEL_TRACES_SAMPLER_ARG": tt.arg})
			_, span := tr.Provider().Tracer("test").Start(t.Context(), "work")
			assert.Equal(t, tt.sampled, span.SpanContext().IsSampled())
			span.End()
		})
	}
}

// String attributes are cut to DefaultAttributeValueLengthLimit, or to
// the length the variables say; -1 is no limit; a bad value is an error
// naming its variable.
func TestFromEnvAttributeValueLengthLimit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("p", 64<<10)
	tests := []struct {
		name string
		vars map[string]string
		want int
	}{
		{"default", nil, telemetry.DefaultAttributeValueLengthLimit},
		{"generic", map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"}, 100},
		{"span wins", map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50"}, 50},
		{"no limit", map[string]string{"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1"}, len(long)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": newCollector(t).srv.URL}
			for k, v := range tt.vars {
				vars[k] = v
			}
			tr := fromEnv(t, "svc", vars)
			rec := recorder(t, tr)
			_, span := tr.Provider().Tracer("test").Start(t.Context(), "work", trace.WithAttributes(attribute.String("url.path", long)))
			span.End()
			require.Len(t, rec.Ended(), 1)
			attrs := rec.Ended()[0].Attributes()
			require.Len(t, attrs, 1)
			assert.Len(t, attrs[0].Value.AsString(), tt.want)
		})
	}
	for _, name := range []string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"} {
		for _, bad := range []string{"many", "-2", "1.5"} {
			_, err := telemetry.FromEnv(t.Context(), "svc", env(map[string]string{"OTEL_TRACES_EXPORTER": "console", name: bad}))
			require.ErrorContains(t, err, name+": want a length in characters", bad)
		}
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
