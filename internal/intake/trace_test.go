package intake

import (
	"context"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// The caller's trace context of the traced requests.
const (
	callerTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID      = "00f067aa0ba902b7"
	callerTraceparent = "00-" + callerTraceID + "-" + callerSpanID + "-01"
	callerTracestate  = "vendor=x"
)

// newTracedEnv is newEnv with Config.TracerProvider (and so the
// producer's) set to a provider that records every span.
func newTracedEnv(t *testing.T) (*env, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return newEnv(t, func(c *Config) { c.TracerProvider = tp }), rec
}

// spanOfKind returns the one ended span of kind k.
func spanOfKind(t *testing.T, rec *tracetest.SpanRecorder, k trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == k {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "one span of kind %s", k)
	return found[0]
}

// storedTrace returns the trace context of the task res names.
func (e *env) storedTrace(t *testing.T, res producer.Result) *tasks.TraceContext {
	t.Helper()
	info, err := e.insp.GetTaskInfo(res.Queue, res.TaskID)
	require.NoError(t, err)
	p, err := tasks.Kinds().Of(info.Type).Parse(info.Payload)
	require.NoError(t, err, "%s", info.Payload)
	assert.Equal(t, res.Seq, p.Header().Seq)
	return p.Header().Trace
}

// traceparentOf is the W3C traceparent of sc.
func traceparentOf(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// requestLog returns the fields of the one access log line of the request
// with ID id.
func (e *env) requestLog(t *testing.T, id string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, entry := range e.logs.FilterMessage("request").All() {
		if f := entry.ContextMap(); f["request_id"] == id {
			found = append(found, f)
		}
	}
	require.Len(t, found, 1, "one access log line of request %s", id)
	return found[0]
}

// A request with traceparent and tracestate is a server span continuing
// that trace, named after its route; the enqueue is its child, and the
// task carries the enqueue's trace context to the workers. The access log
// line joins the trace.
func TestTraceContinuesTheRequestsTrace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, body, route, queue string
	}{
		{"modify", "/v1/orders/SO1/modify", modifyBody, "POST /v1/orders/{order_no}/modify", tasks.QueueModify},
		{"exchange", "/v1/orders/SO1/exchange", exchangeBody, "POST /v1/orders/{order_no}/exchange", tasks.QueueExchange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, rec := newTracedEnv(t)
			r := e.do(t, http.MethodPost, tt.path, tt.body, map[string]string{
				HeaderIdempotencyKey: "evt-1", HeaderRequestID: "req-traced",
				"traceparent": callerTraceparent, "tracestate": callerTracestate,
			})
			require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
			var res producer.Result
			r.decode(t, &res)

			server := spanOfKind(t, rec, trace.SpanKindServer)
			assert.Equal(t, tt.route, server.Name())
			assert.Equal(t, callerTraceID, server.SpanContext().TraceID().String(), "the caller's trace")
			assert.Equal(t, callerSpanID, server.Parent().SpanID().String(), "a child of the caller's span")
			assert.True(t, server.Parent().IsRemote())
			assert.Equal(t, callerTracestate, server.SpanContext().TraceState().String())

			send := spanOfKind(t, rec, trace.SpanKindProducer)
			assert.Equal(t, "send "+tt.queue, send.Name())
			assert.Equal(t, server.SpanContext().TraceID(), send.SpanContext().TraceID())
			assert.Equal(t, server.SpanContext().SpanID(), send.Parent().SpanID(), "the enqueue is the request's child")
			assert.Len(t, rec.Ended(), 2, "no other span")

			assert.Equal(t, &tasks.TraceContext{Traceparent: traceparentOf(send.SpanContext()), Tracestate: callerTracestate},
				e.storedTrace(t, res))

			log := e.requestLog(t, "req-traced")
			assert.Equal(t, callerTraceID, log["trace_id"])
			assert.Equal(t, server.SpanContext().SpanID().String(), log["span_id"])
			assert.Equal(t, tt.route, log["route"])
		})
	}
}

// Without trace headers, or with ones that do not read as W3C trace
// context, the request starts a new trace and is served as any other.
func TestTraceNewTrace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header map[string]string
	}{
		{"no header", nil},
		{"malformed traceparent", map[string]string{"traceparent": "garbage", "tracestate": callerTracestate}},
		{"zero trace ID", map[string]string{"traceparent": "00-00000000000000000000000000000000-" + callerSpanID + "-01"}},
		{"upper case", map[string]string{"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, rec := newTracedEnv(t)
			header := map[string]string{HeaderIdempotencyKey: "evt-1", HeaderRequestID: "req-new"}
			for k, v := range tt.header {
				header[k] = v
			}
			r := e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, header)
			require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
			var res producer.Result
			r.decode(t, &res)

			server := spanOfKind(t, rec, trace.SpanKindServer)
			assert.False(t, server.Parent().IsValid(), "a root span")
			assert.NotEqual(t, callerTraceID, server.SpanContext().TraceID().String())
			assert.Zero(t, server.SpanContext().TraceState().Len(), "no tracestate without its traceparent")
			send := spanOfKind(t, rec, trace.SpanKindProducer)
			assert.Equal(t, server.SpanContext().SpanID(), send.Parent().SpanID())
			assert.Equal(t, &tasks.TraceContext{Traceparent: traceparentOf(send.SpanContext())}, e.storedTrace(t, res))
			assert.Equal(t, server.SpanContext().TraceID().String(), e.requestLog(t, "req-new")["trace_id"])
		})
	}
}

// The probes are not traced, and their log lines have no trace.
func TestTraceNotTheProbes(t *testing.T) {
	t.Parallel()
	e, rec := newTracedEnv(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(t, http.MethodGet, path, "", map[string]string{"traceparent": callerTraceparent, HeaderRequestID: "req" + path[1:]})
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
		log := e.requestLog(t, "req"+path[1:])
		assert.NotContains(t, log, "trace_id", path)
		assert.NotContains(t, log, "span_id", path)
	}
	assert.Empty(t, rec.Ended(), "no span")
}

// The trace context comes from the headers only: a body carrying one is
// refused, as a body carrying seq is, and nothing is enqueued.
func TestTraceInTheBodyRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, body string
	}{
		{"modify", "/v1/orders/SO1/modify",
			`{"changes":{"remark":"r"},"trace":{"traceparent":"` + callerTraceparent + `"}}`},
		{"exchange", "/v1/orders/SO1/exchange",
			`{"items":[{"sku":"B","qty":1}],"trace":{"traceparent":"` + callerTraceparent + `","tracestate":"v=1"}}`},
		{"empty trace", "/v1/orders/SO1/modify", `{"changes":{"remark":"r"},"trace":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, rec := newTracedEnv(t)
			r := e.do(t, http.MethodPost, tt.path, tt.body, map[string]string{
				HeaderIdempotencyKey: "evt-1", "traceparent": callerTraceparent,
			})
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
			body := r.errorBody(t)
			assert.Equal(t, codeInvalidField, body.Error.Code)
			assert.Equal(t, "trace", body.Error.Field)
			assert.Zero(t, e.queued(t), "nothing enqueued")
			spanOfKind(t, rec, trace.SpanKindServer)
			assert.Len(t, rec.Ended(), 1, "no enqueue span")
		})
	}
}

// Without a TracerProvider the trace headers are ignored: no span, no
// trace in the task or the log line.
func TestTraceOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	r := e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{
		HeaderIdempotencyKey: "evt-1", HeaderRequestID: "req-off", "traceparent": callerTraceparent,
	})
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var res producer.Result
	r.decode(t, &res)
	assert.Nil(t, e.storedTrace(t, res))
	log := e.requestLog(t, "req-off")
	assert.NotContains(t, log, "trace_id")
	assert.NotContains(t, log, "span_id")
}

// A request the intake refuses before its handler (no key, a wrong key, an
// enqueue key on an action, an empty bucket) or for a route it does not
// serve starts no span, however long its path and whatever traceparent it
// carries: an outsider can neither grow the exporter's queue nor join a
// trace. An admitted request still continues the caller's trace, and the
// attributes it copies from the request are cut.
func TestTraceNotForRefusedRequests(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	const adminKey = "admin-key-0123456789abcdef"
	e := newEnv(t, func(c *Config) {
		c.TracerProvider, c.AdminKeys = tp, []string{adminKey}
		c.KeyLimits = map[int]Limit{2: {Rate: 0.001, Burst: 1}}
		manyRefusals(c)
	})
	long := strings.Repeat("A", 60<<10)
	traced := map[string]string{"traceparent": callerTraceparent, "tracestate": callerTracestate, "User-Agent": long}
	with := func(h map[string]string) map[string]string {
		out := maps.Clone(traced)
		maps.Copy(out, h)
		return out
	}
	e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{"Authorization": "Bearer " + key2, HeaderIdempotencyKey: "evt-0"})
	rec2 := len(rec.Ended())
	refused := []struct {
		name, method, path string
		header             map[string]string
		status             int
	}{
		{"no key", http.MethodGet, "/v1/orders/" + long, with(map[string]string{"Authorization": ""}), http.StatusUnauthorized},
		{"wrong key", http.MethodPost, "/v1/orders/" + long + "/modify", with(map[string]string{"Authorization": "Bearer wrong-key-0123456789abcdef"}), http.StatusUnauthorized},
		{"no admin key", http.MethodPost, "/v1/orders/SO1/actions/hold", with(nil), http.StatusForbidden},
		{"empty bucket", http.MethodPost, "/v1/orders/SO1/modify", with(map[string]string{"Authorization": "Bearer " + key2, HeaderIdempotencyKey: "evt-1"}), http.StatusTooManyRequests},
		{"no such route", http.MethodGet, "/v1/" + long, with(nil), http.StatusNotFound},
		{"no such method", http.MethodDelete, "/v1/orders/SO1", with(nil), http.StatusMethodNotAllowed},
	}
	for _, tt := range refused {
		for range 20 {
			r := e.do(t, tt.method, tt.path, modifyBody, tt.header)
			require.Equal(t, tt.status, r.status, "%s: %s", tt.name, r.body)
		}
	}
	assert.Equal(t, rec2, len(rec.Ended()), "no span for a refused request")
	assert.Equal(t, rec2, len(rec.Started()), "none started either")

	r := e.do(t, http.MethodGet, "/v1/orders/"+long, "", with(map[string]string{HeaderRequestID: "req-long"}))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	server := rec.Ended()[len(rec.Ended())-1]
	assert.Equal(t, "GET /v1/orders/{order_no}", server.Name())
	assert.Equal(t, callerTraceID, server.SpanContext().TraceID().String(), "an admitted request continues the caller's trace")
	assert.Equal(t, callerSpanID, server.Parent().SpanID().String())
	cut := map[string]bool{}
	for _, a := range server.Attributes() {
		assert.LessOrEqual(t, len(a.Value.String()), tracing.MaxStartAttributeLen, "%s", a.Key)
		cut[string(a.Key)] = len(a.Value.String()) == tracing.MaxStartAttributeLen
	}
	assert.True(t, cut["url.path"], "the path is there, cut")
	assert.True(t, cut["user_agent.original"], "the user agent is there, cut")
	assert.Equal(t, callerTraceID, e.requestLog(t, "req-long")["trace_id"])
}
