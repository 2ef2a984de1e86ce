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
//   - The rest is read by the SDK itself: the OTLP endpoint, headers,
//     timeout, compression and certificates (OTEL_EXPORTER_OTLP_*), the
//     sampler (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG; the default is
//     parentbased_always_on), the batch processor (OTEL_BSP_*), the span
//     limits (OTEL_SPAN_*), and the resource (OTEL_SERVICE_NAME,
//     OTEL_RESOURCE_ATTRIBUTES). service.name defaults to service.
//
// The endpoint and the service name are read through getenv; the other
// variables the SDK reads from the process's environment. When tracing is
// off it returns a Tracing whose Provider is nil. An error names the
// variable at fault. The exporter's own errors (a collector that does not
// answer) never fail a task or a request: the SDK drops the spans and
// reports to otel's error handler, which [SetErrorLog] points at a logger.
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
	var exp sdktrace.SpanExporter
	var err error
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
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
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
