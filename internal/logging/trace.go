package logging

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// WithTrace returns log with the trace_id and span_id of ctx's span, so
// that every line written while a task or a request runs joins its trace;
// it returns log itself when ctx carries no valid span context (tracing
// off, or not sampled and not propagated), at no cost. (It lives here,
// not in package tracing, so that the engine, which logs with log/slog,
// does not link zap.)
func WithTrace(ctx context.Context, log *zap.Logger) *zap.Logger {
	if f := TraceFields(ctx); f != nil {
		return log.With(f...)
	}
	return log
}

// TraceFields returns the trace_id and span_id fields of ctx's span, or
// nil when ctx carries no valid span context.
func TraceFields(ctx context.Context) []zap.Field {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []zap.Field{zap.Stringer("trace_id", sc.TraceID()), zap.Stringer("span_id", sc.SpanID())}
}
