// Package telemetry sets OpenTelemetry tracing up for orderworker's
// binaries from the standard OTEL_* variables ([FromEnv], [Start]): the SDK,
// its OTLP HTTP and stdout exporters, and go-redis's hooks
// ([InstrumentRedis]). Tracing is off unless configured.
//
// The libraries (producer, worker, the intake, the stores) depend only on
// OpenTelemetry's API, through package tracing, and take a
// trace.TracerProvider; only the main packages import this one, so that a
// program that embeds the producer or the worker links no exporter.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.uber.org/zap"
)

// Tracing is a process's tracer provider, set up by [FromEnv]. Its zero
// value and nil are tracing off.
type Tracing struct {
	provider *sdktrace.TracerProvider
}

// Provider returns the tracer provider, or nil when tracing is off: the
// value to give the components' TracerProvider settings.
func (t *Tracing) Provider() trace.TracerProvider {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider
}

// On reports whether tracing is on.
func (t *Tracing) On() bool { return t != nil && t.provider != nil }

// Shutdown flushes the spans not yet exported and stops the exporter,
// within ctx. It is a no-op when tracing is off; the error is the
// exporter's, wrapped.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.On() {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("telemetry: shut down: %w", err)
	}
	return nil
}

// ErrUnsupported is matched by the error of [FromEnv] for a setting this
// build does not support (an exporter or OTLP protocol it does not carry).
var ErrUnsupported = errors.New("telemetry: not supported by this build")

// FromEnv sets tracing up from the standard OpenTelemetry variables,
// read through getenv (os.Getenv when nil):
//
//   - OTEL_SDK_DISABLED=true turns it off.
//   - OTEL_TRACES_EXPORTER: "otlp" (OTLP over HTTP, protobuf), "console"
//     (spans printed as JSON to standard output) or "none". Unset, tracing
//     is on, with OTLP, only when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set: off unless configured.
//   - OTEL_EXPORTER_OTLP_PROTOCOL / OTEL_EXPORTER_OTLP_TRACES_PROTOCOL may
//     be "http/protobuf" (the default) only; "grpc" is not built in.
//   - OTEL_EXPORTER_OTLP_HEADERS / OTEL_EXPORTER_OTLP_TRACES_HEADERS
//     (key=value pairs, comma-separated, values URL-encoded) must each be
//     well formed: a malformed entry is an error that names the variable
//     and the entry's position, never its text (it may hold a credential;
//     the SDK would print it to standard error and go on without it).
//   - OTEL_TRACES_SAMPLER: always_on, always_off, traceidratio,
//     parentbased_always_on (the default), parentbased_always_off or
//     parentbased_traceidratio, with OTEL_TRACES_SAMPLER_ARG a ratio
//     between 0 and 1 for the ratio samplers (1 when unset). Another
//     sampler or an argument that does not read is an error (the SDK
//     would sample everything).
//   - OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, or else
//     OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT: the longest string attribute
//     value exported, in characters, longer ones cut to it; -1 for no
//     limit. Defaults to [DefaultAttributeValueLengthLimit] (the SDK's
//     default is no limit, which exported a request path of 64 KiB in
//     full).
//   - The rest is read by the SDK itself: the OTLP endpoint's timeout,
//     compression and certificates (OTEL_EXPORTER_OTLP_*), the batch
//     processor (OTEL_BSP_*), the other span limits (OTEL_SPAN_*), and the
//     resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). service.name
//     defaults to service.
//
// The endpoint, the headers, the sampler, the attribute length limit and
// the service name are read through getenv; the other variables the SDK
// reads from the process's environment. When tracing is off it returns a
// Tracing whose Provider is nil. An error names the variable at fault,
// and never holds the value of a variable that may carry a secret. The
// exporter's own errors (a collector that does not answer) never fail a
// task or a request: the SDK drops the spans and reports to otel's error
// handler, which [SetErrorLog] points at a logger.
func FromEnv(ctx context.Context, service string, getenv func(string) string) (*Tracing, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return &Tracing{}, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if exporter == "" {
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return &Tracing{}, nil
		}
		exporter = "otlp"
	}
	// The settings that need no exporter are checked first, so that an
	// error leaves nothing to shut down.
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	limits, err := spanLimits(getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	switch exporter {
	case "none":
		return &Tracing{}, nil
	case "otlp":
		proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		if proto != "" && proto != "http/protobuf" {
			return nil, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_PROTOCOL %q: only http/protobuf is built in", ErrUnsupported, proto)
		}
		var opts []otlptracehttp.Option
		if opts, err = endpoint(getenv); err != nil {
			return nil, err
		}
		hdr, herr := headers(getenv)
		if herr != nil {
			return nil, herr
		}
		if hdr != nil {
			opts = append(opts, otlptracehttp.WithHeaders(hdr))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	case "console":
		exp, err = stdouttrace.New()
	default:
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER %q: use otlp, console or none", ErrUnsupported, exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s exporter: %w", exporter, err)
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if name := getenv("OTEL_SERVICE_NAME"); name != "" && err == nil {
		res, err = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(name)))
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("telemetry: resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err),
			exp.Shutdown(ctx))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler), sdktrace.WithRawSpanLimits(limits))
	return &Tracing{provider: tp}, nil
}

// Start is [FromEnv] for a main package: with tracing on it points the
// SDK's own errors at log ([SetErrorLog]) and logs "tracing on". stop
// flushes the spans not yet exported and shuts the exporter down, within 5
// seconds of a context that survives ctx's cancellation, logging a
// failure; call it last, after the process's last task or request. log may
// be nil (nothing is logged). The error is FromEnv's.
func Start(ctx context.Context, service string, getenv func(string) string, log *zap.Logger) (t *Tracing, stop func(), err error) {
	if log == nil {
		log = zap.NewNop()
	}
	t, err = FromEnv(ctx, service, getenv)
	if err != nil {
		return nil, nil, err
	}
	if t.On() {
		SetErrorLog(log.Named("tracing"))
		log.Info("tracing on", zap.String("service", service))
	}
	return t, func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(fctx); err != nil {
			log.Warn("tracing: spans not flushed", zap.Error(err))
		}
	}, nil
}

// endpoint returns the OTLP exporter's endpoint option from getenv's
// variables, as the SDK would read them from the environment: the traces
// endpoint as it is, or the base endpoint with /v1/traces appended. A
// value that is not an absolute http or https URL is an error naming its
// variable (the SDK would fall back to localhost silently).
func endpoint(getenv func(string) string) ([]otlptracehttp.Option, error) {
	name, u := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if u == "" {
		name, u = "OTEL_EXPORTER_OTLP_ENDPOINT", getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		if u == "" {
			return nil, nil
		}
		u = strings.TrimRight(u, "/") + "/v1/traces"
	}
	if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return nil, fmt.Errorf("telemetry: %s: want an absolute http or https URL, such as http://collector:4318", name)
	}
	return []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u)}, nil
}

// DefaultAttributeValueLengthLimit is the longest string attribute value a
// span exports, in characters (the SDK counts code points, not bytes),
// unless OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise: longer ones are cut to
// it. It bounds what a span exports, not what it holds until then: the
// SDK's cut is a substring, which keeps the whole value's memory while the
// span waits in the batch processor's queue. What a caller puts in a
// request's path or headers is cut before, by copy, where the span starts
// (the intake's tracing.LimitStartAttributes).
const DefaultAttributeValueLengthLimit = 1024

// spanLimits returns the SDK's span limits (read from the process's
// environment) with the attribute value length limit read through getenv:
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, or else
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, or else
// DefaultAttributeValueLengthLimit. A value that is not an integer of -1
// (no limit) or more is an error naming its variable.
func spanLimits(getenv func(string) string) (sdktrace.SpanLimits, error) {
	limits := sdktrace.NewSpanLimits()
	limits.AttributeValueLengthLimit = DefaultAttributeValueLengthLimit
	for _, name := range []string{"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"} {
		raw := strings.TrimSpace(getenv(name))
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < -1 {
			return limits, fmt.Errorf("telemetry: %s: want a length in characters, or -1 for no limit", name)
		}
		limits.AttributeValueLengthLimit = n
		break
	}
	return limits, nil
}

// The samplers of OTEL_TRACES_SAMPLER, as the OpenTelemetry specification
// names them; the SDK builds no others.
const samplerNames = "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"

// samplerFromEnv returns the sampler of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG, read through getenv, as the SDK would build it
// (parentbased_always_on when unset). A sampler the SDK does not build,
// which it would replace by sampling everything, and an argument that is
// not a ratio between 0 and 1 are errors naming the variable, not its
// value.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return nil, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG: want a ratio between 0 and 1 for %s", name)
		}
		return sdktrace.TraceIDRatioBased(f), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(s), nil
	}
	return nil, fmt.Errorf("%w: OTEL_TRACES_SAMPLER: not a sampler this build has; use %s", ErrUnsupported, samplerNames)
}

// headers returns the OTLP exporter's headers from getenv's
// OTEL_EXPORTER_OTLP_TRACES_HEADERS, or else OTEL_EXPORTER_OTLP_HEADERS,
// read as the SDK reads them (key=value pairs, comma-separated, each value
// URL-decoded and trimmed), or nil when neither is set. An entry the SDK
// would drop, printing it to standard error (no '=', a key that is not an
// HTTP token, a value that does not URL-decode, an empty entry), is an
// error naming the variable and the entry's position, not its text: the
// headers usually carry a collector's credential.
func headers(getenv func(string) string) (map[string]string, error) {
	name, raw := "OTEL_EXPORTER_OTLP_TRACES_HEADERS", getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
	if raw == "" {
		name, raw = "OTEL_EXPORTER_OTLP_HEADERS", getenv("OTEL_EXPORTER_OTLP_HEADERS")
		if raw == "" {
			return nil, nil
		}
	}
	entries := strings.Split(raw, ",")
	out := make(map[string]string, len(entries))
	for i, entry := range entries {
		bad := func(why string) error {
			return fmt.Errorf("telemetry: %s: entry %d of %d %s; want key=value pairs, comma-separated, values URL-encoded (the value is not shown: it may hold a credential)",
				name, i+1, len(entries), why)
		}
		k, v, ok := strings.Cut(entry, "=")
		k = strings.TrimSpace(k)
		switch {
		case strings.TrimSpace(entry) == "":
			return nil, bad("is empty")
		case !ok:
			return nil, bad("has no '='")
		case !isToken(k):
			return nil, bad("has a key that is not a valid header name")
		}
		dv, err := url.PathUnescape(v)
		if err != nil {
			return nil, bad("has a value that does not URL-decode")
		}
		out[k] = strings.TrimSpace(dv)
	}
	return out, nil
}

// isToken reports whether s is an HTTP token (RFC 9110), what a header
// name must be: the SDK's own test.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// SetErrorLog sends the OpenTelemetry SDK's own errors (an export that
// failed, a span dropped) to log, at warn level, instead of the standard
// library's log. It sets a process-wide handler, for main packages.
func SetErrorLog(log *zap.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed; the spans are dropped", zap.Error(err))
	}))
}

// InstrumentRedis adds go-redis's OpenTelemetry hook (redisotel) to rdb:
// each Redis command or pipeline run under a span (a task's lock, its
// write, an enqueue) becomes its child span. Commands run outside any
// span (asynq's polling, heartbeats and recovery, the lock's notices)
// make no spans, so that they do not start a trace each. The commands'
// arguments are never recorded: they hold the payloads. It returns
// redisotel's error for a client type it does not know.
func InstrumentRedis(rdb redis.UniversalClient, tp trace.TracerProvider) error {
	if tp == nil {
		return nil
	}
	err := redisotel.InstrumentTracing(rdb,
		redisotel.WithTracerProvider(childrenOnly{tp: tp}),
		redisotel.WithDBStatement(false),
		redisotel.WithCallerEnabled(false))
	if err != nil {
		return fmt.Errorf("telemetry: instrument Redis: %w", err)
	}
	return nil
}

// childrenOnly is a tracer provider whose tracers start a span only under
// a valid parent span context; elsewhere they return the context's
// (non-recording) span.
type childrenOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childrenOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{t: c.tp.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	t trace.Tracer
}

func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return c.t.Start(ctx, name, opts...)
}
