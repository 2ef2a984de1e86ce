package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/httpstore"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/logtest"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/otlptest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// waitLong bounds every wait of the end-to-end tests: generous, for a
// loaded machine; the tests take a few seconds when all is well.
const waitLong = 30 * time.Second

// The span names the tests look for (worker/trace.go, internal/intake,
// producer, internal/orders/httpstore).
var (
	spanModifyRequest = "POST /v1/orders/{order_no}/modify"
	spanGetRequest    = "GET /v1/orders/{order_no}"
	spanSend          = "send " + tasks.QueueModify
	spanProcess       = "process " + tasks.QueueModify
	spanLock          = "order lock"
	spanWrite         = "order write"
	spanHandoff       = "order hand-off"
	spanAPIPost       = "order API " + http.MethodPost
	spanAPIGet        = "order API " + http.MethodGet
)

// TestTraceEndToEnd runs the intake ("producer serve"), a worker and the
// fake order API (upstreamtest, ORDER_STORE=http on both) as the issue
// asks, the two processes exporting to an OTLP/HTTP receiver of the
// test's. Two modifies of one order are sent with a traceparent each; the
// first one's write is held at the order API until the second, accepted
// behind it, is parked (in asynq's retry set). For each change it checks
// that every span (the intake's server span, the enqueue, each worker run
// and its lock, write, order API call and hand-off) is in the trace the
// request's traceparent started, parented as the pipeline runs; that the
// order API saw the trace in traceparent; and that the worker's and the
// intake's log lines carry it. The second change runs in the first one's
// hold: its run's lock span has the event taken in the hold, naming the
// first, with the hold's fence (should the timing make it run otherwise,
// every run of it still has its lock span and its trace is whole). A read
// through the intake joins its caller's trace up to the order API too.
func TestTraceEndToEnd(t *testing.T) {
	redistest.SkipShort(t, "binaries run as processes")
	workerBin, intakeBin := buildBinaries(t)

	t.Run("on", func(t *testing.T) { testTraceOn(t, workerBin, intakeBin) })
	t.Run("off", func(t *testing.T) { testTraceOff(t, workerBin, intakeBin) })
}

// The trace contexts the tests' requests carry: trace ID, parent span ID.
const (
	trace1, parent1 = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	trace2, parent2 = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	trace3, parent3 = "5c2a7d4e8f1b3a6c9d0e2f4a6b8c0d1e", "1a2b3c4d5e6f7a8b"
	traceOff        = "6e0c63257de34c926f9efcd03927272e"
)

func traceparent(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

func testTraceOn(t *testing.T, workerBin, intakeBin string) {
	db := redistest.New(t)
	db.RequireProcess(t, "worker and intake processes share the Redis")
	ctx := t.Context()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

	// The order API, its first write of ev-1 held until the test opens it.
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	hold := newWriteGate("ev-1")
	api := upstreamtest.New(t, hold.wrap(orderapitest.NewHandler(oracle)))
	t.Cleanup(hold.open) // before api's Close, which waits for the held request
	require.NoError(t, oracle.Put(ctx, orders.Order{No: "SO-T", Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	rec := otlptest.New(t)

	env := append(storeEnv(db, api),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+rec.URL(),
		"OTEL_BSP_SCHEDULE_DELAY=100", // ms: the batches leave soon
	)
	intake := startProcess(t, "intake", intakeBin, []string{"serve"}, append(env,
		"OTEL_SERVICE_NAME=e2e-intake", "INTAKE_ADDR=127.0.0.1:0", "INTAKE_API_KEYS="+intakeKey)...)
	worker := startProcess(t, "worker", workerBin, nil, append(env,
		"OTEL_SERVICE_NAME=e2e-worker", "OPS_ADDR=off", "LOG_LEVEL=debug",
		// A change that waits behind another goes back to its queue soon,
		// parked for GAP_WAIT at most: should the call back miss it (it
		// comes as the run ends), the test is a few seconds slower.
		"MODIFY_WAIT_DEADLINE=300ms", "GAP_WAIT=5s")...)
	base := intake.listening(t)
	for _, p := range []*process{intake, worker} {
		p.log.waitFor(t, p.name+" tracing on", func(l logLine) bool { return l["msg"] == "tracing on" })
	}

	// ev-1 reaches the order API and is held there; ev-2, accepted behind
	// it, is parked at acceptance.
	mod1 := send(t, base, http.MethodPost, "/v1/orders/SO-T/modify", traceparent(trace1, parent1), "ev-1", `{"changes":{"remark":"first"}}`)
	require.Equal(t, http.StatusAccepted, mod1.status, "%s", mod1.body)
	seq1 := mod1.seq(t)
	hold.waitEntered(t)
	mod2 := send(t, base, http.MethodPost, "/v1/orders/SO-T/modify", traceparent(trace2, parent2), "ev-2", `{"changes":{"remark":"second"}}`)
	require.Equal(t, http.StatusAccepted, mod2.status, "%s", mod2.body)
	seq2 := mod2.seq(t)
	label1 := tasks.PositionLabel(tasks.TypeModify, "ev-1")
	info, err := insp.GetTaskInfo(tasks.QueueModify, "ev-2")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateRetry, info.State, "ev-2 is parked at acceptance, behind ev-1")
	hold.open()

	// A read through the intake, under a third trace.
	get := send(t, base, http.MethodGet, "/v1/orders/SO-T", traceparent(trace3, parent3), "", "")
	require.Equal(t, http.StatusOK, get.status, "%s", get.body)

	// Every span of both changes (each ends before its parent: the runs'
	// spans come last) and of the read.
	ranOK := func(ss otlptest.Spans) bool {
		return len(ss.Named(spanProcess).Filter(func(s otlptest.Span) bool { return s.Attributes["orderworker.outcome"] == "ok" })) == 1
	}
	spans := rec.WaitFor(t, waitLong, "the spans of both changes and of the read", func(ss otlptest.Spans) bool {
		return ranOK(ss.Trace(trace1)) && ranOK(ss.Trace(trace2)) &&
			len(ss.Trace(trace1).Named(spanModifyRequest)) == 1 && len(ss.Trace(trace2).Named(spanModifyRequest)) == 1 &&
			len(ss.Trace(trace3).Named(spanGetRequest)) == 1
	})
	first := checkChangeTrace(t, spans, api, worker.log, trace1, parent1, "ev-1", seq1, 1)
	second := checkChangeTrace(t, spans, api, worker.log, trace2, parent2, "ev-2", seq2, 1)

	// ev-2's applying run was taken in ev-1's hold: its own run, whose
	// lock span (the lock ev-1 kept for it, in its turn, no wait, the
	// hold's fence) names ev-1 by its position's label and seq, and whose
	// log line says drained. Should the timing have made it run otherwise
	// (its park ended while ev-1 still held the order), ev-1's hand-off
	// called it back instead.
	firstLock := children(t, spans, first.run, spanLock)
	lock2 := children(t, spans, second.run, spanLock)
	done2 := worker.log.waitFor(t, "ev-2's task done line", func(l logLine) bool {
		return l["msg"] == "task done" && l["event_id"] == "ev-2" && l["span_id"] == second.run.SpanID
	})
	inHold := otlptest.Attributes{"orderworker.head": label1, "orderworker.head.seq": strconv.FormatInt(seq1, 10)}
	if lock2.HasEvent("taken in the hold", otlptest.Attributes{"orderworker.head": label1}) {
		assert.True(t, lock2.HasEvent("taken in the hold", inHold), "%s", lock2)
		assert.Equal(t, strconv.FormatInt(seq2, 10), lock2.Attributes["orderworker.seq"], "%s", lock2)
		assert.Equal(t, "turn", lock2.Attributes["orderworker.lock.mode"], "%s", lock2)
		assert.Equal(t, "0", lock2.Attributes["orderworker.lock.waited_ms"], "%s", lock2)
		assert.Equal(t, firstLock.Attributes["orderworker.fence"], lock2.Attributes["orderworker.fence"], "the hold's fence: %s", lock2)
		assert.Equal(t, true, done2["drained"], "%v", done2)
	} else {
		t.Logf("ev-2 did not run in ev-1's hold:\n%s", spans.Trace(trace2))
		assert.NotContains(t, done2, "drained", "%v", done2)
		handoff := children(t, spans, first.run, spanHandoff)
		woken, _ := json.Marshal([]string{tasks.PositionLabel(tasks.TypeModify, "ev-2")})
		assert.True(t, handoff.HasEvent("called back the next in line", otlptest.Attributes{"orderworker.woken": string(woken)}), "%s", handoff)
	}

	// The read: the intake's server span continues the caller's trace, and
	// the intake's own order API call joins it.
	read := only(t, spans.Trace(trace3), spanGetRequest)
	assert.Equal(t, parent3, read.ParentSpanID)
	assert.Equal(t, "e2e-intake", read.Service)
	apiGet := children(t, spans, read, spanAPIGet)
	assert.Equal(t, "client", apiGet.Kind)
	var gets []upstreamtest.Request
	for _, r := range api.Requests() {
		if r.Method == http.MethodGet && r.Path == upstreamtest.APIPath+"/orders/SO-T" {
			gets = append(gets, r)
		}
	}
	require.Len(t, gets, 1, "the intake's read reached the order API once")
	assert.Equal(t, traceparent(trace3, apiGet.SpanID), gets[0].Header.Get("Traceparent"), "the order API saw the read's trace")

	// The access log lines carry their request's span.
	for _, r := range []struct {
		resp    response
		traceID string
		name    string
	}{{mod1, trace1, spanModifyRequest}, {mod2, trace2, spanModifyRequest}, {get, trace3, spanGetRequest}} {
		line := intake.log.waitFor(t, "the access log line of "+r.resp.requestID, func(l logLine) bool {
			return l["msg"] == "request" && l["request_id"] == r.resp.requestID
		})
		server := only(t, spans.Trace(r.traceID), r.name)
		assert.Equal(t, r.traceID, line["trace_id"], "%v", line)
		assert.Equal(t, server.SpanID, line["span_id"], "%v", line)
	}

	// The batches flush at exit, without an error; every export was one the
	// receiver could read.
	intake.stop(t)
	worker.stop(t)
	for _, p := range []*process{intake, worker} {
		for _, l := range p.log.snapshot() {
			msg, _ := l["msg"].(string)
			assert.NotContains(t, msg, "tracing:", "%s: %v", p.name, l)
		}
	}
	assert.Empty(t, rec.Rejected())
}

// changeSpans are the spans of one change's successful run.
type changeSpans struct {
	send, run otlptest.Span
}

// checkChangeTrace checks the spans, the order API's request and the
// worker's log lines (worker) of the modify eventID at position seq, sent with
// traceparent(traceID, parentID), that ran at least minRuns times: once
// applied, the other times waiting.
func checkChangeTrace(t *testing.T, all otlptest.Spans, api *upstreamtest.Server, worker *jsonLog, traceID, parentID, eventID string, seq int64, minRuns int) changeSpans {
	t.Helper()
	spans := all.Trace(traceID)
	// No span of the change is in another trace.
	for _, s := range all {
		if s.Attributes["orderworker.event_id"] == eventID || s.Attributes["messaging.message.id"] == eventID {
			assert.Equal(t, traceID, s.TraceID, "%s's span in another trace: %s", eventID, s)
		}
	}

	server := only(t, spans, spanModifyRequest)
	assert.Equal(t, "server", server.Kind)
	assert.Equal(t, "e2e-intake", server.Service)
	assert.Equal(t, parentID, server.ParentSpanID, "the intake continues the request's trace")

	send := children(t, spans, server, spanSend)
	assert.Equal(t, "producer", send.Kind)
	assert.Equal(t, "e2e-intake", send.Service)
	assert.Equal(t, eventID, send.Attributes["orderworker.event_id"])
	assert.Equal(t, strconv.FormatInt(seq, 10), send.Attributes["orderworker.seq"])
	assert.Equal(t, tasks.QueueModify, send.Attributes["messaging.destination.name"])

	procs := spans.Named(spanProcess)
	require.GreaterOrEqual(t, len(procs), minRuns, "%s's runs:\n%s", eventID, spans)
	var ok otlptest.Span
	applied := 0
	for _, p := range procs {
		assert.Equal(t, "consumer", p.Kind)
		assert.Equal(t, "e2e-worker", p.Service)
		assert.Equal(t, send.SpanID, p.ParentSpanID, "each run is a child of the enqueue: %s", p)
		assert.True(t, p.LinksTo(send), "each run links to the enqueue: %s", p)
		assert.Equal(t, eventID, p.Attributes["orderworker.event_id"])
		assert.Equal(t, eventID, p.Attributes["messaging.message.id"])
		children(t, spans, p, spanLock)
		switch p.Attributes["orderworker.outcome"] {
		case "ok":
			ok = p
			applied++
		case "waiting":
		default:
			t.Errorf("%s's run neither applied it nor waited: %s", eventID, p)
		}
	}
	require.Equal(t, 1, applied, "%s has one run that applied it:\n%s", eventID, spans)
	lock := children(t, spans, ok, spanLock)
	write := children(t, spans, ok, spanWrite)
	children(t, spans, ok, spanHandoff)
	assert.NotEmpty(t, lock.Attributes["orderworker.fence"], "%s", lock)
	assert.Equal(t, lock.Attributes["orderworker.fence"], write.Attributes["orderworker.fence"])
	post := children(t, spans, write, spanAPIPost)
	assert.Equal(t, "client", post.Kind)
	assert.Equal(t, "e2e-worker", post.Service)

	// The order API saw the write under the client span, with the fence.
	writes := api.RequestsWith(httpstore.HeaderIdempotencyKey, eventID)
	require.NotEmpty(t, writes, "the order API saw %s", eventID)
	for _, w := range writes {
		assert.Equal(t, traceparent(traceID, post.SpanID), w.Header.Get("Traceparent"), "the order API saw %s's trace", eventID)
		assert.Equal(t, lock.Attributes["orderworker.fence"], w.Header.Get(httpstore.HeaderFencingToken))
	}

	// Every worker line about the change carries its trace; the last
	// run's, its span.
	line := worker.waitFor(t, eventID+"'s task done line", func(l logLine) bool {
		return l["msg"] == "task done" && l["event_id"] == eventID
	})
	assert.Equal(t, traceID, line["trace_id"], "%v", line)
	assert.Equal(t, ok.SpanID, line["span_id"], "%v", line)
	n := 0
	for _, l := range worker.snapshot() {
		if l["event_id"] == eventID || l["task_id"] == eventID {
			n++
			assert.Equal(t, traceID, l["trace_id"], "a worker line about %s without its trace: %v", eventID, l)
			assert.NotEmpty(t, l["span_id"], "%v", l)
		}
	}
	assert.GreaterOrEqual(t, n, len(procs), "a line per run of %s", eventID)
	return changeSpans{send: send, run: ok}
}

func testTraceOff(t *testing.T, workerBin, intakeBin string) {
	db := redistest.New(t)
	db.RequireProcess(t, "worker and intake processes share the Redis")
	ctx := t.Context()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	api := upstreamtest.New(t, orderapitest.NewHandler(oracle))
	require.NoError(t, oracle.Put(ctx, orders.Order{No: "SO-OFF", Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	rec := otlptest.New(t)

	// The intake as deployed without tracing: no OTEL variable. The worker
	// with the endpoint set but the SDK switched off.
	env := storeEnv(db, api)
	intake := startProcess(t, "intake", intakeBin, []string{"serve"}, append(env,
		"INTAKE_ADDR=127.0.0.1:0", "INTAKE_API_KEYS="+intakeKey)...)
	worker := startProcess(t, "worker", workerBin, nil, append(env, "OPS_ADDR=off", "LOG_LEVEL=debug",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+rec.URL(), "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SDK_DISABLED=true")...)
	base := intake.listening(t)

	mod := send(t, base, http.MethodPost, "/v1/orders/SO-OFF/modify", traceparent(traceOff, parent1), "ev-off", `{"changes":{"remark":"untraced"}}`)
	require.Equal(t, http.StatusAccepted, mod.status, "%s", mod.body)
	done := worker.log.waitFor(t, "ev-off's task done line", func(l logLine) bool {
		return l["msg"] == "task done" && l["event_id"] == "ev-off"
	})
	assert.NotContains(t, done, "trace_id")
	assert.NotContains(t, done, "span_id")
	access := intake.log.waitFor(t, "the access log line", func(l logLine) bool {
		return l["msg"] == "request" && l["request_id"] == mod.requestID
	})
	assert.NotContains(t, access, "trace_id")

	// The task carries no trace context, and the order API saw none.
	info, err := insp.GetTaskInfo(tasks.QueueModify, "ev-off")
	require.NoError(t, err)
	assert.NotContains(t, string(info.Payload), `"trace"`)
	writes := api.RequestsWith(httpstore.HeaderIdempotencyKey, "ev-off")
	require.NotEmpty(t, writes)
	for _, w := range writes {
		assert.Empty(t, w.Header.Get("Traceparent"))
	}

	// Nothing was sent, not even at exit.
	intake.stop(t)
	worker.stop(t)
	for _, p := range []*process{intake, worker} {
		for _, l := range p.log.snapshot() {
			assert.NotEqual(t, "tracing on", l["msg"], "%s", p.name)
		}
	}
	assert.Zero(t, rec.Exports())
	assert.Empty(t, rec.Rejected())
}

// storeEnv is the environment of a process with ORDER_STORE=http on api,
// on db.
func storeEnv(db *redistest.DB, api *upstreamtest.Server) []string {
	return []string{
		"REDIS_URL=" + db.URL(),
		"KEY_PREFIX=" + db.Prefix,
		"LOG_FORMAT=json",
		"ORDER_STORE=http",
		"ORDER_API_URL=" + api.APIURL(),
		"ORDER_API_TIMEOUT=60s", // a held write is not cut off
		"TOKEN_URL=" + api.TokenURL(),
		"TOKEN_CLIENT_ID=" + upstreamtest.ClientID,
		"TOKEN_CLIENT_SECRET=" + upstreamtest.ClientSecret,
	}
}

// only returns the one span of spans named name.
func only(t *testing.T, spans otlptest.Spans, name string) otlptest.Span {
	t.Helper()
	named := spans.Named(name)
	require.Len(t, named, 1, "spans named %q in:\n%s", name, spans)
	return named[0]
}

// children returns the one child of parent named name.
func children(t *testing.T, spans otlptest.Spans, parent otlptest.Span, name string) otlptest.Span {
	t.Helper()
	return only(t, spans.Children(parent), name)
}

// writeGate holds the order API's writes of one event ID until open.
type writeGate struct {
	eventID     string
	entered     chan struct{} // closed when the first write arrives
	enteredOnce sync.Once
	opened      chan struct{}
	openOnce    sync.Once
}

func newWriteGate(eventID string) *writeGate {
	return &writeGate{eventID: eventID, entered: make(chan struct{}), opened: make(chan struct{})}
}

func (g *writeGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(httpstore.HeaderIdempotencyKey) == g.eventID {
			g.enteredOnce.Do(func() { close(g.entered) })
			select {
			case <-g.opened:
			case <-r.Context().Done():
				http.Error(w, "the test ended", http.StatusServiceUnavailable)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// open lets the held write and the later ones through; it may be called
// more than once.
func (g *writeGate) open() { g.openOnce.Do(func() { close(g.opened) }) }

func (g *writeGate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(waitLong):
		t.Fatalf("the write of %s never reached the order API", g.eventID)
	}
}

// response is what the intake answered.
type response struct {
	status    int
	requestID string
	body      []byte
}

// seq returns the position of a 202's body.
func (r response) seq(t *testing.T) int64 {
	t.Helper()
	var res struct {
		Seq int64 `json:"seq"`
	}
	require.NoError(t, json.Unmarshal(r.body, &res), "%s", r.body)
	require.Positive(t, res.Seq, "%s", r.body)
	return res.Seq
}

// send sends a request to the intake at base with the API key, the
// traceparent tp and, when not empty, the Idempotency-Key key and a JSON
// body.
func send(t *testing.T, base, method, path, tp, key, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+intakeKey)
	req.Header.Set("Traceparent", tp)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c := http.Client{Timeout: waitLong}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, requestID: resp.Header.Get("X-Request-Id"), body: b}
}

// process is a binary a test runs, its output collected as JSON log lines.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *jsonLog
	done chan struct{} // closed once the process exited and its output is read
	err  error         // cmd.Wait's, set before done is closed
}

// startProcess starts bin with args, in the test's environment without its
// OTEL_* variables plus env. The process is killed, and waited for, at
// cleanup; its output is logged when the test failed.
func startProcess(t *testing.T, name, bin string, args []string, env ...string) *process {
	t.Helper()
	p := &process{name: name, cmd: exec.Command(bin, args...), log: newJSONLog(), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start(), "start %s", name)
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.log)
		}
	})
	return p
}

// listening waits for the intake's "listening" line and returns its base
// URL.
func (p *process) listening(t *testing.T) string {
	t.Helper()
	line := p.log.waitFor(t, p.name+" listening", func(l logLine) bool { return l["msg"] == "listening" })
	addr, _ := line["addr"].(string)
	require.NotEmpty(t, addr, "%v", line)
	return "http://" + addr
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		require.NoError(t, p.err, "%s's exit", p.name)
	case <-time.After(waitLong):
		t.Fatalf("%s did not exit within %v of SIGTERM", p.name, waitLong)
	}
}

// logLine is a JSON log line.
type logLine = logtest.Line

// jsonLog is a process's output: everything as text, and each line that is
// a JSON object. It is safe for concurrent use.
type jsonLog struct{ *logtest.Sink }

func newJSONLog() *jsonLog { return &jsonLog{logtest.New()} }

// snapshot returns the JSON lines so far.
func (l *jsonLog) snapshot() []logLine { return l.Lines() }

// waitFor returns the first line for which match holds, waiting for it up
// to waitLong; what names it in the failure.
func (l *jsonLog) waitFor(t *testing.T, what string, match func(logLine) bool) logLine {
	t.Helper()
	line, _ := l.Wait(t, waitLong, what, 0, match)
	return line
}
