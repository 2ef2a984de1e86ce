package worker

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The spans of a task run, when Config.TracerProvider is set:
//
//	process <queue>          consumer; child of the enqueue's span (the payload's trace), linked to it
//	├── order lock           taking the order's lock in the change's turn; events: waiting for its
//	│                        turn (behind which position), order busy (held by whom), gap skipped,
//	│                        parked, on hold; attributes: the fence and how the lock was granted
//	├── order write          the order store's write (an HTTP store's request is its child)
//	└── order hand-off       the release that passes the turn on; events: the next in line called back
//
// The span names are fixed; order numbers, event IDs and positions are
// attributes, and payload contents never are.

// startRun starts the consumer span of one run of t, as the child of the
// span that enqueued it when its payload carries a trace context (and
// linked to it, per the messaging conventions), or as a new trace. The
// payload is read leniently here, for its trace context only: a malformed
// payload still gets its span, which records why it was archived.
func (w *Worker) startRun(ctx context.Context, t *asynq.Task, r *run) (context.Context, trace.Span) {
	var carried struct {
		Trace *tasks.TraceContext `json:"trace"`
	}
	if len(t.Payload()) <= tasks.MaxPayloadBytes { // a larger one is refused unread
		_ = json.Unmarshal(t.Payload(), &carried) // best effort: no trace, a new one
	}
	var tp, ts string
	if carried.Trace != nil {
		tp, ts = carried.Trace.Traceparent, carried.Trace.Tracestate
	}
	ctx, parent := tracing.Extract(ctx, tp, ts)
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(tracing.MessagingSystem),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(r.Queue),
			semconv.MessagingMessageID(r.TaskID),
			tracing.AttrTaskType.String(clip(t.Type())),
			attribute.Int("orderworker.retried", r.Retried),
			attribute.String("orderworker.worker", w.cfg.ID),
		),
	}
	if parent.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent}))
	}
	return w.tracer.Start(ctx, "process "+r.Queue, opts...)
}

// endRun ends a run's span with its outcome. A wait (busy, not its turn) is
// not an error: the change goes back to its queue as designed.
func endRun(span trace.Span, d *Done) {
	span.SetAttributes(tracing.AttrOutcome.String(d.Outcome))
	if d.OrderNo != "" {
		span.SetAttributes(tracing.AttrOrderNo.String(d.OrderNo), tracing.AttrEventID.String(d.EventID))
	}
	if d.Seq > 0 {
		span.SetAttributes(tracing.AttrSeq.Int64(d.Seq))
	}
	switch d.Outcome {
	case OutcomeOK, OutcomeBusy, OutcomeWaiting:
	default:
		tracing.RecordError(span, d.Err)
	}
	span.End()
}

// noSpan is what startSpan returns with tracing off: made once, so that
// the untraced path allocates nothing for it.
var noSpan trace.Span = noop.Span{}

// startSpan starts an internal span of a run; a nil tracer (tracing off)
// starts nothing and returns ctx with a span that records nothing.
func (w *Worker) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if w.tracer == nil {
		return ctx, noSpan
	}
	return w.tracer.Start(ctx, name)
}

// phase is the engine's RunnerConfig.Phase: the "order lock" span around
// the wait for the order's lock and turn (in a hold: taken at once, kept
// for it by the change before, with the hold's fence), and the "order
// hand-off" span around the run's end.
func (w *Worker) phase(ctx context.Context, p keyorder.Phase, rep *keyorder.Report) (context.Context, func(error)) {
	if w.tracer == nil {
		return ctx, noEnd
	}
	switch p {
	case keyorder.PhaseLock:
		ctx, span := w.tracer.Start(ctx, tracing.SpanLock)
		if rep.Held > 0 {
			return ctx, func(error) { endHeldLock(span, rep) }
		}
		span.SetAttributes(tracing.AttrOrderNo.String(rep.Key), tracing.AttrSeq.Int64(rep.Pos))
		return ctx, func(err error) { endLock(span, rep, err) }
	case keyorder.PhaseEnd:
		ctx, span := w.tracer.Start(ctx, tracing.SpanHandoff)
		return ctx, func(error) {
			span.SetAttributes(attribute.Bool("orderworker.turn_passed", rep.Final && rep.Mode == keyorder.ModeTurn))
			span.End()
		}
	}
	return ctx, noEnd
}

func noEnd(error) {}

// endHeldLock ends the lock's span of a run in a hold: no wait.
func endHeldLock(span trace.Span, rep *keyorder.Report) {
	span.SetAttributes(tracing.AttrOrderNo.String(rep.Key), tracing.AttrSeq.Int64(rep.Pos),
		tracing.AttrFence.Int64(rep.Fence), tracing.AttrLockMode.String(string(ModeTurn)),
		attribute.Int64("orderworker.lock.waited_ms", 0), attribute.Int("orderworker.hold.changes", rep.Held))
	span.AddEvent(tracing.EventInHold, trace.WithAttributes(tracing.AttrHeadSeq.Int64(rep.Prev.Pos), tracing.AttrHead.String(rep.Prev.Label)))
	span.End()
}

// endLock ends the lock's span with how the lock was taken, or why not.
func endLock(span trace.Span, rep *keyorder.Report, err error) {
	span.SetAttributes(attribute.Int64("orderworker.lock.waited_ms", rep.Lock.Waited.Milliseconds()))
	if rep.Skipped > 0 {
		span.SetAttributes(attribute.Int("orderworker.skipped", rep.Skipped))
	}
	var park *keyorder.ParkError
	var busy *keyorder.BusyError
	switch {
	case err == nil:
		span.SetAttributes(tracing.AttrFence.Int64(rep.Fence), tracing.AttrLockMode.String(string(rep.Mode)),
			attribute.Int("orderworker.lock.attempts", rep.Lock.Attempts))
	case errors.As(err, &park):
		te := park.Err
		name := tracing.EventParked
		if te.Paused != nil {
			name = tracing.EventOnHold
		}
		span.AddEvent(name, trace.WithAttributes(tracing.AttrHeadSeq.Int64(te.Head), tracing.AttrHead.String(te.Label),
			tracing.AttrDelay.Int64(park.Delay.Milliseconds())))
	case errors.As(err, &busy):
		span.AddEvent(tracing.EventTimeout, trace.WithAttributes(tracing.AttrHolder.String(busy.Holder)))
	default:
		tracing.RecordError(span, err)
	}
	span.End()
}
