package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/orderworker/orderworker/internal/telemetry"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// Redis commands run under a span are its children, without their
// arguments; commands run outside any span (asynq's polling) make none.
func TestInstrumentRedisTracesOnlyChildren(t *testing.T) {
	db := redistest.New(t)
	rdb := db.NewClient(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.WithoutCancel(t.Context())) })
	require.NoError(t, telemetry.InstrumentRedis(rdb, tp))

	require.NoError(t, rdb.Set(t.Context(), db.Prefix+"k", "secret payload", 0).Err())
	require.Empty(t, exp.GetSpans(), "no span without a parent")

	ctx, parent := tp.Tracer("test").Start(t.Context(), "task")
	require.NoError(t, rdb.Set(ctx, db.Prefix+"k", "secret payload", 0).Err())
	parent.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	child := spans[0]
	require.Equal(t, "set", child.Name)
	require.Equal(t, parent.SpanContext().SpanID(), child.Parent.SpanID())
	for _, kv := range child.Attributes {
		require.NotContains(t, kv.Value.String(), "secret", "%s records the arguments", kv.Key)
	}
	require.NoError(t, telemetry.InstrumentRedis(rdb, nil), "nil is tracing off")
}
