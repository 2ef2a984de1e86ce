// Package tracing is orderworker's one home of OpenTelemetry tracing: it
// sets the SDK up from the standard OTEL_* variables ([FromEnv]), carries a
// change's W3C trace context in its task's payload across the queue
// ([Inject], [Extract]), and names the spans' attributes.
//
// Tracing is off unless configured: [FromEnv] returns a nil provider then,
// and every instrumented component (producer, intake, worker, HTTP order
// store) takes a nil provider to mean no spans at all, so that the hot path
// does not even build a span's attributes.
//
// The trace context crosses the queue as the payload's "trace" field
// (tasks.TraceContext), in the W3C Trace Context format, whatever
// propagators the process has installed: it is part of the task contract,
// which a system that enqueues by hand can follow.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.uber.org/zap"
)

// ScopeName is the instrumentation scope of orderworker's own spans.
const ScopeName = "github.com/orderworker/orderworker"

// Propagator is the propagator of the task contract and of the HTTP hops
// (the intake's request, the HTTP order store's calls): W3C Trace Context.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns orderworker's tracer of tp, or nil when tp is nil
// (tracing off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(ScopeName)
}

// The attributes of orderworker's spans that no semantic convention names.
const (
	// AttrOrderNo is the order a change is of.
	AttrOrderNo = attribute.Key("orderworker.order_no")
	// AttrEventID is the change's event ID (its task ID too).
	AttrEventID = attribute.Key("orderworker.event_id")
	// AttrSeq is the change's position in its order's sequence.
	AttrSeq = attribute.Key("orderworker.seq")
	// AttrFence is the fencing token of the order's lock.
	AttrFence = attribute.Key("orderworker.fence")
	// AttrLockMode is how the lock was granted: turn, passed or free.
	AttrLockMode = attribute.Key("orderworker.lock.mode")
	// AttrOutcome is a task run's outcome (ok, waiting, busy, ...).
	AttrOutcome = attribute.Key("orderworker.outcome")
	// AttrHead is the label of the position whose turn it is (the change
	// waited behind): "<task type> <event ID>".
	AttrHead = attribute.Key("orderworker.head")
	// AttrHeadSeq is that position.
	AttrHeadSeq = attribute.Key("orderworker.head.seq")
	// AttrHolder is the holder of a busy order's lock: "<task type> <task ID>".
	AttrHolder = attribute.Key("orderworker.holder")
	// AttrDelay is how long a change goes back to its queue for, in
	// milliseconds.
	AttrDelay = attribute.Key("orderworker.delay_ms")
	// AttrLeaseLeft is what is left of a busy order's lease, in
	// milliseconds.
	AttrLeaseLeft = attribute.Key("orderworker.lease_left_ms")
	// AttrReason says why (a skip, a park).
	AttrReason = attribute.Key("orderworker.reason")
	// AttrWoken lists the parked changes a hand-off called back.
	AttrWoken = attribute.Key("orderworker.woken")
)

// The names of the worker's spans inside a run ("process <queue>") and of
// the span events that say why a change waited: one home, for the worker,
// the lock and what reads traces (the demo). docs/operations.md, Tracing,
// describes each.
const (
	SpanLock    = "order lock"     // taking the order's lock in the change's turn
	SpanWrite   = "order write"    // the order store's write
	SpanHandoff = "order hand-off" // the release that passes the turn on

	EventWaiting = "waiting for its turn"         // behind the position named (AttrHead)
	EventBusy    = "order busy"                   // the lock is held by AttrHolder
	EventSkipped = "gap skipped"                  // the position named will never get its task
	EventParked  = "parked"                       // back to the queue, behind the position named
	EventOnHold  = "on hold"                      // back to the queue: an operator holds the order
	EventTimeout = "busy past the wait deadline"  // back to the queue: the lock stayed held
	EventWoken   = "called back the next in line" // the parked changes a hand-off called back (AttrWoken)
)

// MessagingSystem is the messaging.system of the queue's spans.
const MessagingSystem = "asynq"

// Inject returns ctx's span context as a task's trace context, or nil
// when ctx has no valid span context. A tracestate longer than
// tasks.MaxTracestateLen is dropped (the W3C allows dropping entries), so
// that the result always passes the payload's validation.
func Inject(ctx context.Context) *tasks.TraceContext {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	tc := &tasks.TraceContext{Traceparent: c["traceparent"], Tracestate: c["tracestate"]}
	if tc.Traceparent == "" {
		return nil
	}
	if len(tc.Tracestate) > tasks.MaxTracestateLen {
		tc.Tracestate = ""
	}
	return tc
}

// Extract returns ctx carrying tc's remote span context, and that span
// context (invalid when tc is nil or does not read as W3C trace context:
// the task then starts a new trace).
func Extract(ctx context.Context, tc *tasks.TraceContext) (context.Context, trace.SpanContext) {
	if tc == nil {
		return ctx, trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": tc.Traceparent}
	if tc.Tracestate != "" {
		c["tracestate"] = tc.Tracestate
	}
	// Extracted on its own, so that a value that does not read leaves ctx
	// as it was rather than taking ctx's own span for the remote one.
	sc := trace.SpanContextFromContext(Propagator.Extract(context.Background(), c))
	if !sc.IsValid() {
		return ctx, sc
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), sc
}

// RecordError records err on span and sets its status to Error, when span
// records and err is not nil.
func RecordError(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

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
		return fmt.Errorf("tracing: shut down: %w", err)
	}
	return nil
}

// ErrUnsupported is matched by the error of [FromEnv] for a setting this
// build does not support (an exporter or OTLP protocol it does not carry).
var ErrUnsupported = errors.New("tracing: not supported by this build")

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
		exp, err = otlptracehttp.New(ctx, endpoint(getenv)...)
	case "console":
		exp, err = stdouttrace.New()
	default:
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER %q: use otlp, console or none", ErrUnsupported, exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", exporter, err)
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
		return nil, errors.Join(fmt.Errorf("tracing: resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err),
			exp.Shutdown(ctx))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{provider: tp}, nil
}

// endpoint returns the OTLP exporter's endpoint option from getenv's
// variables, as the SDK would read them from the environment: the traces
// endpoint as it is, or the base endpoint with /v1/traces appended.
func endpoint(getenv func(string) string) []otlptracehttp.Option {
	if u := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); u != "" {
		return []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u)}
	}
	if u := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); u != "" {
		return []otlptracehttp.Option{otlptracehttp.WithEndpointURL(strings.TrimRight(u, "/") + "/v1/traces")}
	}
	return nil
}

// SetErrorLog sends the OpenTelemetry SDK's own errors (an export that
// failed, a span dropped) to log, at warn level, instead of the standard
// library's log. It sets a process-wide handler, for main packages.
func SetErrorLog(log *zap.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed; the spans are dropped", zap.Error(err))
	}))
}

// Log returns log with the trace_id and span_id of ctx's span, so that
// every line written while a task or a request runs joins its trace; it
// returns log itself when ctx carries no valid span context (tracing off,
// or not sampled and not propagated), at no cost.
func Log(ctx context.Context, log *zap.Logger) *zap.Logger {
	if f := LogFields(ctx); f != nil {
		return log.With(f...)
	}
	return log
}

// LogFields returns the trace_id and span_id fields of ctx's span, or nil
// when ctx carries no valid span context.
func LogFields(ctx context.Context) []zap.Field {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []zap.Field{zap.Stringer("trace_id", sc.TraceID()), zap.Stringer("span_id", sc.SpanID())}
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
		return fmt.Errorf("tracing: instrument Redis: %w", err)
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

// ExtractEnv returns ctx carrying the remote span context of the
// TRACEPARENT and TRACESTATE variables read through getenv (the
// OpenTelemetry convention for passing a trace to a command-line
// process), or ctx itself when TRACEPARENT is unset or malformed.
func ExtractEnv(ctx context.Context, getenv func(string) string) context.Context {
	tp := getenv("TRACEPARENT")
	if tp == "" {
		return ctx
	}
	ctx, _ = Extract(ctx, &tasks.TraceContext{Traceparent: tp, Tracestate: getenv("TRACESTATE")})
	return ctx
}
