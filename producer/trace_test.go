package producer_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// tracedEnv is an env whose producer traces to an in-memory recorder, with
// a tracer of the same provider for the caller's spans.
type tracedEnv struct {
	env
	rec    *tracetest.SpanRecorder
	tracer trace.Tracer
}

// newTracedEnv is newEnv with cfg.TracerProvider set to a provider that
// records every span.
func newTracedEnv(t *testing.T, cfg producer.Config) tracedEnv {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	return tracedEnv{env: newEnv(t, cfg), rec: rec, tracer: tp.Tracer("caller")}
}

// under runs f under a new span of the caller's, ended after it, and
// returns that span's context.
func (e tracedEnv) under(t *testing.T, f func(ctx context.Context)) trace.SpanContext {
	t.Helper()
	ctx, span := e.tracer.Start(t.Context(), "caller")
	defer span.End()
	f(ctx)
	return span.SpanContext()
}

// sends returns the ended spans of kind producer, in the order they ended.
func (e tracedEnv) sends() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			out = append(out, s)
		}
	}
	return out
}

// onlySend returns the one producer span.
func (e tracedEnv) onlySend(t *testing.T) sdktrace.ReadOnlySpan {
	t.Helper()
	sends := e.sends()
	require.Len(t, sends, 1, "one producer span")
	return sends[0]
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := make(map[string]attribute.Value)
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// traceparent is the W3C traceparent of sc.
func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// stored reads the task back and parses its payload.
func (e env) stored(t *testing.T, queue, id string) (tasks.Payload, string) {
	t.Helper()
	info, err := e.insp.GetTaskInfo(queue, id)
	require.NoError(t, err)
	k := tasks.Kinds().Of(info.Type)
	require.NotNil(t, k, info.Type)
	p, err := k.Parse(info.Payload)
	require.NoError(t, err, "%s", info.Payload)
	return p, string(info.Payload)
}

// requireNoContents fails when any span's name, attribute or event holds
// one of secrets, a payload's contents.
func requireNoContents(t *testing.T, spans []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		kvs := append([]attribute.KeyValue(nil), s.Attributes()...)
		for _, ev := range s.Events() {
			kvs = append(kvs, ev.Attributes...)
		}
		for _, secret := range secrets {
			require.NotContains(t, s.Name(), secret)
			for _, kv := range kvs {
				require.NotContains(t, kv.Value.String(), secret, "span %q attribute %s", s.Name(), kv.Key)
			}
		}
	}
}

// The secrets of the payloads: contents that no span may carry.
const (
	secretAddress = "7 Secret Lane"
	secretRemark  = "call-me-secret"
	secretSKU     = "SKU-SECRET"
	secretReason  = "reason-secret"
)

// An enqueue under a span is a "send <queue>" span of kind producer, its
// child, with the messaging attributes, the order and the event; the task
// carries its trace context, the position spliced after it.
func TestTraceEnqueue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		enqueue func(context.Context, *producer.Producer) (producer.Result, error)
		typ     string
		queue   string
	}{
		{"modify", func(ctx context.Context, p *producer.Producer) (producer.Result, error) {
			return p.EnqueueModify(ctx, "SO1", tasks.Changes{Address: new(secretAddress), Remark: new(secretRemark),
				Items: []tasks.Item{{SKU: secretSKU, Qty: 2}}}, producer.WithEventID("evt-m"))
		}, tasks.TypeModify, tasks.QueueModify},
		{"exchange", func(ctx context.Context, p *producer.Producer) (producer.Result, error) {
			return p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: secretSKU, Qty: 1}},
				producer.WithEventID("evt-x"), producer.WithReason(secretReason), producer.WithNewOrderNo("SO2"))
		}, tasks.TypeExchange, tasks.QueueExchange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newTracedEnv(t, producer.Config{})
			var res producer.Result
			parent := e.under(t, func(ctx context.Context) {
				var err error
				res, err = tt.enqueue(ctx, e.p)
				require.NoError(t, err)
			})

			send := e.onlySend(t)
			assert.Equal(t, "send "+tt.queue, send.Name())
			assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
			assert.Equal(t, parent.TraceID(), send.SpanContext().TraceID(), "the caller's trace")
			assert.Equal(t, parent.SpanID(), send.Parent().SpanID(), "a child of the caller's span")
			assert.Equal(t, "github.com/orderworker/orderworker", send.InstrumentationScope().Name)
			assert.Equal(t, codes.Unset, send.Status().Code)
			assert.Empty(t, send.Events())
			a := attrs(send)
			assert.Equal(t, "asynq", a["messaging.system"].AsString())
			assert.Equal(t, "send", a["messaging.operation.type"].AsString())
			assert.Equal(t, "send", a["messaging.operation.name"].AsString())
			assert.Equal(t, tt.queue, a["messaging.destination.name"].AsString())
			assert.Equal(t, res.EventID, a["messaging.message.id"].AsString())
			assert.Equal(t, "SO1", a["orderworker.order_no"].AsString())
			assert.Equal(t, res.EventID, a["orderworker.event_id"].AsString())
			assert.Equal(t, res.Seq, a["orderworker.seq"].AsInt64())
			assert.Equal(t, tt.typ, a["orderworker.task_type"].AsString())
			requireNoContents(t, e.rec.Ended(), secretAddress, secretRemark, secretSKU, secretReason)

			p, raw := e.stored(t, res.Queue, res.TaskID)
			require.NotNil(t, p.Header().Trace, "%s", raw)
			assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(send.SpanContext())}, p.Header().Trace)
			assert.Equal(t, res.Seq, p.Header().Seq)
			assert.True(t, strings.HasSuffix(raw, `,"trace":{"traceparent":"`+traceparent(send.SpanContext())+`"},"seq":`+
				strconv.FormatInt(res.Seq, 10)+`}`), "seq spliced after the trace: %s", raw)
		})
	}
}

// Without a span in the context the enqueue starts a trace of its own.
func TestTraceEnqueueWithoutParent(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	res, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	send := e.onlySend(t)
	assert.False(t, send.Parent().IsValid(), "a root span")
	p, _ := e.stored(t, res.Queue, res.TaskID)
	assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(send.SpanContext())}, p.Header().Trace)
}

// A remote parent's tracestate travels with the task.
func TestTraceEnqueueCarriesTracestate(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	state, err := trace.ParseTraceState("vendor=x,other=y")
	require.NoError(t, err)
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})
	ctx := trace.ContextWithRemoteSpanContext(t.Context(), remote)
	res, err := e.p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	send := e.onlySend(t)
	assert.Equal(t, remote.TraceID(), send.SpanContext().TraceID())
	assert.Equal(t, remote.SpanID(), send.Parent().SpanID())
	p, _ := e.stored(t, res.Queue, res.TaskID)
	assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(send.SpanContext()), Tracestate: "vendor=x,other=y"}, p.Header().Trace)
}

// The same change sent again under another trace is still the same
// change: a duplicate with the same payload, which is no error on its
// span; the task keeps the first trace.
func TestTraceDuplicateUnderAnotherTrace(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	changes := tasks.Changes{Remark: new("r")}
	var first producer.Result
	e.under(t, func(ctx context.Context) {
		var err error
		first, err = e.p.EnqueueModify(ctx, "SO1", changes, producer.WithEventID("evt-1"))
		require.NoError(t, err)
	})
	again := e.under(t, func(ctx context.Context) {
		_, err := e.p.EnqueueModify(ctx, "SO1", changes, producer.WithEventID("evt-1"))
		var dup *producer.DuplicateError
		require.ErrorAs(t, err, &dup)
		assert.True(t, dup.SamePayload, "the trace context is not part of the change")
		assert.Equal(t, first.Seq, dup.Seq)
	})

	sends := e.sends()
	require.Len(t, sends, 2)
	assert.NotEqual(t, sends[0].SpanContext().TraceID(), again.TraceID(), "two traces")
	dupSpan := sends[1]
	assert.Equal(t, again.TraceID(), dupSpan.SpanContext().TraceID())
	assert.Equal(t, codes.Unset, dupSpan.Status().Code, "a retry of an accepted change is no error")
	assert.Empty(t, dupSpan.Events())
	a := attrs(dupSpan)
	assert.True(t, a["orderworker.duplicate"].AsBool())
	assert.Equal(t, first.Seq, a["orderworker.seq"].AsInt64(), "the position of the task it duplicates")

	p, _ := e.stored(t, first.Queue, first.TaskID)
	assert.Equal(t, traceparent(sends[0].SpanContext()), p.Header().Trace.Traceparent, "the task keeps its trace")
	pending, err := e.insp.ListPendingTasks(tasks.QueueModify)
	require.NoError(t, err)
	assert.Len(t, pending, 1)
}

// Another change under a taken event ID is an error on its span.
func TestTraceConflictingDuplicate(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new(secretRemark + "-1")}, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new(secretRemark + "-2")}, producer.WithEventID("evt-1"))
	require.ErrorIs(t, err, producer.ErrPayloadMismatch)

	sends := e.sends()
	require.Len(t, sends, 2)
	s := sends[1]
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Equal(t, err.Error(), s.Status().Description)
	require.Len(t, s.Events(), 1)
	assert.Equal(t, "exception", s.Events()[0].Name)
	assert.True(t, attrs(s)["orderworker.duplicate"].AsBool())
	requireNoContents(t, sends, secretRemark)
}

// Any other failure is an error on the span, and nothing is enqueued.
func TestTraceEnqueueFails(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := e.p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("evt-1"))
	require.ErrorIs(t, err, producer.ErrUnavailable)
	s := e.onlySend(t)
	assert.Equal(t, codes.Error, s.Status().Code)
	_, hasSeq := attrs(s)["orderworker.seq"]
	assert.False(t, hasSeq, "no position was taken")

	// An invalid payload is refused before any span.
	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{}, producer.WithEventID("evt-2"))
	require.ErrorIs(t, err, tasks.ErrInvalid)
	assert.Len(t, e.sends(), 1)
	e.requireEmpty(t)
}

// With tracing on, the task carries the producer span's trace context in
// place of one the caller's payload had.
func TestTraceReplacesTheCallersTrace(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t, producer.Config{})
	theirs := &tasks.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "t=1"}
	res, err := e.p.Enqueue(t.Context(), tasks.ModifyPayload{EventID: "evt-1", OrderNo: "SO1",
		Changes: tasks.Changes{Remark: new("r")}, Trace: theirs})
	require.NoError(t, err)
	p, _ := e.stored(t, res.Queue, res.TaskID)
	assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(e.onlySend(t).SpanContext())}, p.Header().Trace)
}

// The two-step acceptance carries the trace too: a scheduled change, and
// a change behind a proxy that refuses the one script.
func TestTraceTwoStepPath(t *testing.T) {
	t.Parallel()
	t.Run("scheduled", func(t *testing.T) {
		t.Parallel()
		e := newTracedEnv(t, producer.Config{})
		res, err := e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}},
			producer.WithEventID("later"), producer.WithProcessIn(time.Hour))
		require.NoError(t, err)
		info, err := e.insp.GetTaskInfo(res.Queue, res.TaskID)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, info.State)
		p, _ := e.stored(t, res.Queue, res.TaskID)
		assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(e.onlySend(t).SpanContext())}, p.Header().Trace)
		assert.Equal(t, res.Seq, p.Header().Seq)
	})
	t.Run("behind a sharding proxy", func(t *testing.T) {
		t.Parallel()
		db := redistest.New(t)
		rdb := db.NewClient(t)
		hook := &failEnqueue{match: isAccept, err: redisError("CROSSSLOT Keys in request don't hash to the same slot")}
		hook.armed.Store(true)
		rdb.AddHook(hook)
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix, TracerProvider: tp})
		require.NoError(t, err)
		e := tracedEnv{env: env{p: p, insp: asynq.NewInspectorFromRedisClient(db.Client), db: db}, rec: rec}
		res, err := p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("e1"))
		require.NoError(t, err)
		require.EqualValues(t, 1, hook.seen.Load(), "the one script was refused")
		stored, _ := e.stored(t, res.Queue, res.TaskID)
		assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(e.onlySend(t).SpanContext())}, stored.Header().Trace)
		assert.Equal(t, res.Seq, stored.Header().Seq)
	})
}

// On a Redis Cluster (two steps: the claim and positions in the order's
// slot, the task in the queue's) the task carries the trace.
func TestTraceOnCluster(t *testing.T) {
	t.Parallel()
	db := redistest.NewCluster(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, TracerProvider: tp})
	require.NoError(t, err)
	defer p.Close()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	ctx, parent := tp.Tracer("caller").Start(t.Context(), "caller")
	res, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID(db.Prefix+"e1"))
	parent.End()
	require.NoError(t, err)
	// asynq's keys carry no test prefix: delete the task.
	defer func() { _ = insp.DeleteTask(res.Queue, res.TaskID) }()

	e := tracedEnv{env: env{p: p, insp: insp}, rec: rec}
	send := e.onlySend(t)
	assert.Equal(t, parent.SpanContext().SpanID(), send.Parent().SpanID())
	stored, _ := e.stored(t, res.Queue, res.TaskID)
	assert.Equal(t, &tasks.TraceContext{Traceparent: traceparent(send.SpanContext())}, stored.Header().Trace)
	assert.Equal(t, res.Seq, stored.Header().Seq)
}

// Without a TracerProvider no trace field is added, whatever span the
// context holds; a trace context the caller's payload has is enqueued as
// given, on the one-script path and the two-step one, and one that breaks
// the field's bounds is refused.
func TestNoTracerProvider(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("caller").Start(t.Context(), "caller")
	defer span.End()

	res, err := e.p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("plain"))
	require.NoError(t, err)
	p, raw := e.stored(t, res.Queue, res.TaskID)
	assert.Nil(t, p.Header().Trace)
	assert.NotContains(t, raw, `"trace"`)

	theirs := &tasks.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "t=1"}
	for _, tt := range []struct {
		id   string
		opts []producer.Option
	}{
		{"theirs", nil},
		{"theirs-later", []producer.Option{producer.WithProcessIn(time.Hour)}},
	} {
		res, err = e.p.Enqueue(ctx, tasks.ModifyPayload{EventID: tt.id, OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}, Trace: theirs}, tt.opts...)
		require.NoError(t, err, tt.id)
		p, raw = e.stored(t, res.Queue, res.TaskID)
		assert.Equal(t, theirs, p.Header().Trace, tt.id)
		assert.Equal(t, res.Seq, p.Header().Seq, tt.id)
		assert.Contains(t, raw, `,"trace":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"t=1"},"seq":`, tt.id)
	}

	// The same change under another trace context is its duplicate.
	_, err = e.p.Enqueue(ctx, tasks.ModifyPayload{EventID: "theirs", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")},
		Trace: &tasks.TraceContext{Traceparent: "00-11111111111111111111111111111111-2222222222222222-01"}})
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.True(t, dup.SamePayload)

	_, err = e.p.Enqueue(ctx, tasks.ModifyPayload{EventID: "bad", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")},
		Trace: &tasks.TraceContext{Traceparent: "00\n"}})
	var fe *tasks.FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "trace.traceparent", fe.Field)
	_, err = e.insp.GetTaskInfo(tasks.QueueModify, "bad")
	require.Error(t, err, "nothing enqueued")
	assert.Empty(t, rec.Ended(), "the producer made no span")
}
