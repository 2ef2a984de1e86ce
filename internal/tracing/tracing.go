// Package tracing is orderworker's one home of OpenTelemetry tracing's
// conventions, on OpenTelemetry's API alone: it carries a change's W3C trace
// context in its task's payload across the queue ([Inject], [Extract]),
// names the spans, their events and attributes, and joins log lines to the
// trace ([Slog]; package logging's WithTrace for zap).
//
// Tracing is off unless configured (package telemetry sets the SDK up for
// the binaries): every instrumented component (producer, intake, worker,
// HTTP order store) takes a nil trace.TracerProvider to mean no spans at
// all, so that the hot path does not even build a span's attributes.
//
// The trace context crosses the queue as the payload's "trace" field
// (tasks.TraceContext, carried as two strings), in the W3C Trace Context format, whatever
// propagators the process has installed: it is part of the task contract,
// which a system that enqueues by hand can follow.
package tracing

import (
	"context"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
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
	// AttrTaskType is the change's task type, e.g. "order:modify".
	AttrTaskType = attribute.Key("orderworker.task_type")
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
	EventInHold  = "taken in the hold"            // a drained run: the lock was kept for it by the change named (AttrHead)
)

// MessagingSystem is the messaging.system of the queue's spans.
const MessagingSystem = "asynq"

// MaxTracestateLen is the longest tracestate [Inject] gives: a task
// payload's bound (tasks.MaxTracestateLen; a test holds them equal).
const MaxTracestateLen = 512

// Inject returns ctx's span context as W3C trace context (a task's
// tasks.TraceContext), or "" for both when ctx has no valid span context.
// A tracestate longer than [MaxTracestateLen] is dropped (the W3C allows
// dropping entries), so that the result always passes the payload's
// validation.
func Inject(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	traceparent, tracestate = c["traceparent"], c["tracestate"]
	if traceparent == "" {
		return "", ""
	}
	if len(tracestate) > MaxTracestateLen {
		tracestate = ""
	}
	return traceparent, tracestate
}

// Extract returns ctx carrying the remote span context of traceparent and
// tracestate, and that span context (invalid when traceparent is "" or
// does not read as W3C trace context: the task then starts a new trace).
func Extract(ctx context.Context, traceparent, tracestate string) (context.Context, trace.SpanContext) {
	if traceparent == "" {
		return ctx, trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
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

// Slog returns log with the trace_id and span_id of ctx's span, so that
// every line written while a task runs joins its trace; it returns log
// itself when ctx carries no valid span context (tracing off, or not
// sampled and not propagated), at no cost. It is for the engine (package
// keyorder), which logs with log/slog; package logging's WithTrace is the
// same for a *zap.Logger.
func Slog(ctx context.Context, log *slog.Logger) *slog.Logger {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return log
	}
	return log.With(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
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
	ctx, _ = Extract(ctx, tp, getenv("TRACESTATE"))
	return ctx
}

// MaxStartAttributeLen is the longest string attribute value that a
// tracer provider of [LimitStartAttributes] lets a span start with, in
// bytes: far above a route's path or a user agent of any client, far below
// the 64 KiB of headers a request may carry.
const MaxStartAttributeLen = 1024

// LimitStartAttributes returns tp with its tracers cutting every string
// attribute value given at a span's start (trace.WithAttributes) to n
// bytes, at a UTF-8 boundary; n below 1 is [MaxStartAttributeLen]. It is
// for instrumentation that copies a request's path, query and headers into
// its spans (otelhttp: url.path, user_agent.original, client.address),
// whatever span limits tp has. A cut value is a copy of its first n bytes,
// so the span, queued for export, does not keep the long value's memory;
// the SDK's own AttributeValueLengthLimit cuts to a substring, which
// would. It returns nil for a nil tp. It is safe for concurrent use when
// tp is.
func LimitStartAttributes(tp trace.TracerProvider, n int) trace.TracerProvider {
	if tp == nil {
		return nil
	}
	if n < 1 {
		n = MaxStartAttributeLen
	}
	return limitedProvider{tp: tp, n: n}
}

type limitedProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
	n  int
}

func (p limitedProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return limitedTracer{t: p.tp.Tracer(name, opts...), n: p.n}
}

type limitedTracer struct {
	embedded.Tracer
	t trace.Tracer
	n int
}

func (t limitedTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	attrs := cfg.Attributes()
	long := false
	for _, a := range attrs {
		long = long || a.Value.Type() == attribute.STRING && len(a.Value.AsString()) > t.n
	}
	if !long {
		return t.t.Start(ctx, name, opts...)
	}
	// The options, rebuilt: a second WithAttributes would only add to
	// the long values.
	cut := make([]attribute.KeyValue, len(attrs))
	for i, a := range attrs {
		if s := a.Value.AsString(); a.Value.Type() == attribute.STRING && len(s) > t.n {
			// A copy: s[:t.n] (which ToValidUTF8 returns as it is when
			// valid) would keep all of s alive as long as the span is
			// queued for export.
			a = a.Key.String(strings.Clone(strings.ToValidUTF8(s[:t.n], "")))
		}
		cut[i] = a
	}
	opts = []trace.SpanStartOption{trace.WithAttributes(cut...), trace.WithLinks(cfg.Links()...), trace.WithSpanKind(cfg.SpanKind())}
	if cfg.NewRoot() {
		opts = append(opts, trace.WithNewRoot())
	}
	if ts := cfg.Timestamp(); !ts.IsZero() {
		opts = append(opts, trace.WithTimestamp(ts))
	}
	return t.t.Start(ctx, name, opts...)
}
