package logging_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/logging"
)

func TestWithTrace(t *testing.T) {
	t.Parallel()
	assert.Nil(t, logging.TraceFields(t.Context()), "no span")

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 1}, SpanID: trace.SpanID{0x00, 0xf0, 2}, TraceFlags: trace.FlagsSampled})
	require.True(t, sc.IsValid())
	ctx := trace.ContextWithSpanContext(t.Context(), sc)

	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	log.Info("fields", logging.TraceFields(ctx)...)
	logging.WithTrace(ctx, log).Info("log")
	logging.WithTrace(t.Context(), log).Info("without")
	require.Equal(t, log, logging.WithTrace(t.Context(), log), "the same logger without a span")

	entries := logs.AllUntimed()
	require.Len(t, entries, 3)
	want := map[string]any{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
	assert.Equal(t, want, entries[0].ContextMap())
	assert.Equal(t, want, entries[1].ContextMap())
	assert.Empty(t, entries[2].ContextMap())
}
