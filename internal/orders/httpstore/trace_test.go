package httpstore

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/worker/orders"
)

// recordingProvider returns a tracer provider that records every span.
func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// clientSpans returns the ended spans of kind client.
func clientSpans(rec *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			out = append(out, s)
		}
	}
	return out
}

// w3c is the W3C traceparent of sc.
func w3c(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// With a TracerProvider each request to the order API is a client span,
// a child of the caller's ("order write"), and the upstream receives its
// traceparent and tracestate: the order API's spans join the change's
// trace.
func TestTraceWrites(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	tp, rec := recordingProvider(t)
	s := u.store(t, Config{TracerProvider: tp})
	ctx := t.Context()
	require.NoError(t, s.Put(orders.WithWrite(ctx, orders.Write{Worker: "admin"}), orders.Order{
		No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "shirt-m", Qty: 1}},
	}))

	state, err := trace.ParseTraceState("vendor=x")
	require.NoError(t, err)
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})
	wctx, write := tp.Tracer("worker").Start(trace.ContextWithRemoteSpanContext(ctx, remote), "order write")
	w := orders.Write{Fence: baseFence, Worker: "worker-1"}
	_, err = s.Modify(orders.WithWrite(wctx, w), "evt-m", "SO1", orders.Changes{Address: new("2 Secret Road")})
	require.NoError(t, err)
	w.Fence++
	_, err = s.Exchange(orders.WithWrite(wctx, w), "evt-x", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "shirt-s", Qty: 1}}})
	require.NoError(t, err)
	write.End()

	spans := clientSpans(rec)
	require.Len(t, spans, 3, "a client span per request: the Put's, the Modify's, the Exchange's")
	assert.False(t, spans[0].Parent().IsValid(), "the Put, without a span in its context, starts a trace")
	for i, ev := range []string{"evt-m", "evt-x"} {
		span := spans[i+1]
		assert.Equal(t, "order API POST", span.Name())
		assert.Equal(t, write.SpanContext().TraceID(), span.SpanContext().TraceID(), ev)
		assert.Equal(t, write.SpanContext().SpanID(), span.Parent().SpanID(), "%s: a child of the write", ev)
		seen := u.RequestsWith(HeaderIdempotencyKey, ev)
		require.Len(t, seen, 1, ev)
		assert.Equal(t, w3c(span.SpanContext()), seen[0].Header.Get("traceparent"), ev)
		assert.Equal(t, "vendor=x", seen[0].Header.Get("tracestate"), ev)
		for _, kv := range span.Attributes() {
			assert.NotContains(t, kv.Value.String(), seen[0].Token, "no token in %s", kv.Key)
			assert.NotContains(t, kv.Value.String(), "Secret Road", "no body in %s", kv.Key)
		}
	}

	// A read is traced the same way.
	_, err = s.Get(ctx, "SO1")
	require.NoError(t, err)
	reqs := u.Requests()
	get := reqs[len(reqs)-1]
	require.Equal(t, http.MethodGet, get.Method)
	spans = clientSpans(rec)
	last := spans[len(spans)-1]
	assert.Equal(t, "order API GET", last.Name())
	assert.False(t, last.Parent().IsValid())
	assert.Equal(t, w3c(last.SpanContext()), get.Header.Get("traceparent"))
}

// A request sent again after a 401 with a fresh token is a span of its
// own, under the same caller's span.
func TestTraceRetryAfter401(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	tp, rec := recordingProvider(t)
	s := u.store(t, Config{TracerProvider: tp})
	ctx := t.Context()
	require.NoError(t, s.Put(orders.WithWrite(ctx, orders.Write{Worker: "admin"}), orders.Order{
		No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "shirt-m", Qty: 1}},
	}))
	u.Expire()

	wctx, write := tp.Tracer("worker").Start(ctx, "order write")
	_, err := s.Modify(orders.WithWrite(wctx, orders.Write{Fence: baseFence, Worker: "w1"}), "evt-m", "SO1", orders.Changes{Remark: new("r")})
	write.End()
	require.NoError(t, err)

	seen := u.RequestsWith(HeaderIdempotencyKey, "evt-m")
	require.Len(t, seen, 2)
	assert.Equal(t, http.StatusUnauthorized, seen[0].Status)
	var under []sdktrace.ReadOnlySpan
	for _, span := range clientSpans(rec) {
		if span.Parent().SpanID() == write.SpanContext().SpanID() {
			under = append(under, span)
		}
	}
	require.Len(t, under, 2)
	for i := range seen {
		assert.Equal(t, w3c(under[i].SpanContext()), seen[i].Header.Get("traceparent"), "request %d", i)
	}
	assert.NotEqual(t, seen[0].Header.Get("traceparent"), seen[1].Header.Get("traceparent"))
}

// Without a TracerProvider no trace header is sent, whatever span the
// caller's context holds.
func TestTraceOff(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	tp, rec := recordingProvider(t)
	s := u.store(t, Config{})
	ctx, span := tp.Tracer("worker").Start(t.Context(), "order write")
	defer span.End()
	require.NoError(t, s.Put(orders.WithWrite(ctx, orders.Write{Worker: "admin"}), orders.Order{
		No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "shirt-m", Qty: 1}},
	}))
	_, err := s.Modify(orders.WithWrite(ctx, orders.Write{Fence: baseFence, Worker: "w1"}), "evt-m", "SO1", orders.Changes{Remark: new("r")})
	require.NoError(t, err)
	reqs := u.Requests()
	require.Len(t, reqs, 2)
	for _, r := range reqs {
		assert.Empty(t, r.Header.Values("traceparent"), "%s %s", r.Method, r.Path)
		assert.Empty(t, r.Header.Values("tracestate"), "%s %s", r.Method, r.Path)
	}
	assert.Empty(t, clientSpans(rec))
}

// CloseIdleConnections closes the idle connections with tracing on too,
// though otelhttp's transport does not pass the call on.
func TestTraceCloseIdleConnections(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  func(*testing.T) Config
	}{
		{"untraced", func(*testing.T) Config { return Config{} }},
		{"traced", func(t *testing.T) Config {
			tp, _ := recordingProvider(t)
			return Config{TracerProvider: tp}
		}},
	}
	for _, tt := range tests {
		closed := make(chan struct{}, 1)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(orderJSON("SO1")))
		}))
		srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				closed <- struct{}{}
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		s, err := New(srv.URL, &staticTokens{tok: "tok"}, tt.cfg(t))
		require.NoError(t, err)
		_, err = s.Get(t.Context(), "SO1")
		require.NoError(t, err, tt.name)

		s.CloseIdleConnections()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the idle connection was not closed", tt.name)
		}
	}
}
