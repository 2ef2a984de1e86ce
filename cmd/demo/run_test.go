package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestScenario runs the quick start's demo and checks that its timeline
// shows what the README promises.
func TestScenario(t *testing.T) {
	var out strings.Builder
	err := run(t.Context(), []string{"-hold", "600ms", "-work", "50ms"}, func(string) string { return "" }, &out)
	require.NoError(t, err)
	got := out.String()
	t.Log(got)
	for _, want := range []string{
		// The earlier modify goes first: the exchange, parked behind it,
		// runs in its hold.
		"exchange-1             ran in the hold of the change before it on SO1001 (order:modify modify-1); applied",
		// Back to back, in order: each one in the hold of the one before.
		"modify-5               ran in the hold of the change before it on SO1002 (order:modify modify-4); applied",
		"modify-6               ran in the hold of the change before it on SO1002 (order:modify modify-5); applied",
		"rejected: modify SO1001: orders: order SO1001 is exchanged; its replacement is order SO2001",
		`SO1001  exchanged  v3  address="3 Quay Rd"`,                     // modify-1 applied before the exchange
		`SO2001  active  v2  address="3 Quay Rd" remark="leave at door"`, // copied, then modify-3 applied
		`SO1002  active  v4  address="9 Mill Lane" remark="gift wrap"`,   // the last address wins
	} {
		require.Contains(t, got, want)
	}
	// The replacement's modify, sent before it exists, is applied once the
	// exchange has created it.
	require.Regexp(t, `(?s)done +exchange-1 [^\n]*; applied\n.*done +modify-3 [^\n]*; applied\n`, got)
	require.Regexp(t, `(?m)^ +v1 +order:created +exchange-1 .*\n +v2 +order:modify +modify-3 `, got)
	// And SO1002's changes apply in the order they were accepted.
	require.Regexp(t, `(?s)done +modify-4 [^\n]*; applied\n.*done +modify-5 [^\n]*; applied\n.*done +modify-6 `, got)
	require.NotContains(t, got, "trace_id", "no trace without -trace")
}

// TestTrace runs the demo with -trace and checks the printed trace of the
// change it picks, modify-5, against the order's history: accepted with its
// seq, run by the worker in the same trace, taken in the hold of modify-4
// (the lock modify-4 kept for it: no wait, the fence its write recorded),
// written, and its turn passed on.
func TestTrace(t *testing.T) {
	var out strings.Builder
	err := run(t.Context(), []string{"-trace", "-hold", "600ms", "-work", "50ms"}, func(string) string { return "" }, &out)
	require.NoError(t, err)
	got := out.String()
	t.Log(got)

	// The applied changes' seq and fence, from SO1002's history.
	history := func(ev string) (seq, fence string) {
		t.Helper()
		m := regexp.MustCompile(`(?m)^ +v\d+ +order:modify +` + ev + ` +seq=(\d+) +fence=(\d+) `).FindStringSubmatch(got)
		require.NotNil(t, m, "history of %s", ev)
		return m[1], m[2]
	}
	seq4, fence4 := history("modify-4")
	seq5, fence5 := history("modify-5")
	require.Equal(t, fence4, fence5, "modify-5 is written in modify-4's hold, with its fence")

	head, tree, ok := strings.Cut(got, "\nThe trace of modify-5, an order:modify of SO1002,")
	require.True(t, ok, "the trace of modify-5 is printed")
	require.NotContains(t, head, "trace_id", "the trace comes after the scenario")
	ids := regexp.MustCompile(`(?m)^trace_id ([0-9a-f]{32})$`).FindAllStringSubmatch(tree, -1)
	require.Len(t, ids, 1, "one trace")
	require.NotEqual(t, strings.Repeat("0", 32), ids[0][1])

	// Each span's line: start, took, the tree's lead, the span. The spans
	// printed are those of the one trace; the tree shows that the worker's
	// spans continue the enqueue's.
	const line = `(?m)^ *\+\d+\.\d{3}s +\d+(?:\.\d)?ms  `
	for _, want := range []string{
		line + `send \S+ \[accepted\]  order_no=SO1002  event_id=modify-5  seq=` + seq5 + `$`, // the root
		line + `[├└]─ process \S+ \[a run\]  outcome=ok  retried=\d+$`,                        // its child
		line + `(?:│  |   )├─ order lock \[its turn, then the lock\]  fence=` + fence5 + `  lock\.mode=turn  lock\.waited_ms=0  hold\.changes=[1-9]\d*$`,
		`(?m)^ *\+\d+\.\d{3}s +(?:│  |   )│     · taken in the hold of order:modify modify-4 \(seq ` + seq4 + `\)$`,
		line + `(?:│  |   )├─ order write \[written\]  fence=` + fence5 + `$`,
		line + `(?:│  |   )└─ order hand-off \[turn passed on\]  turn_passed=true$`,
	} {
		require.Regexp(t, want, tree)
	}
}

// TestPrintTrace prints a made-up trace of a change that parked once, then
// ran in the hold of the change before it and called the next in line
// back, and checks the
// whole tree: events and child spans in time order under their span, and
// nothing of another trace.
func TestPrintTrace(t *testing.T) {
	var spans spanLog
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(&spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.WithoutCancel(t.Context()))) })
	tr := tp.Tracer("test")
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(ms float64) trace.SpanEventOption {
		return trace.WithTimestamp(t0.Add(time.Duration(ms * float64(time.Millisecond))))
	}
	send := func(ev string, seq int64) context.Context {
		ctx, s := tr.Start(t.Context(), "send order_modify", trace.WithSpanKind(trace.SpanKindProducer), at(0),
			trace.WithAttributes(tracing.AttrOrderNo.String("SO1"), tracing.AttrEventID.String(ev), tracing.AttrSeq.Int64(seq),
				attribute.String("orderworker.task_type", tasks.Modify.Type)))
		s.End(at(1.5))
		return ctx
	}
	send("modify-1", 1)
	ctx := send("modify-2", 2)
	head := trace.WithAttributes(tracing.AttrHead.String("order:modify modify-1"), tracing.AttrHeadSeq.Int64(1))

	rctx, run := tr.Start(ctx, "process order_modify", trace.WithSpanKind(trace.SpanKindConsumer), at(5))
	_, lk := tr.Start(rctx, tracing.SpanLock, at(5))
	lk.AddEvent(tracing.EventWaiting, at(6), head)
	lk.AddEvent("parked", at(100), head, trace.WithAttributes(tracing.AttrDelay.Int64(500)))
	lk.End(at(100))
	run.SetAttributes(tracing.AttrOutcome.String(worker.OutcomeWaiting), attribute.Int("orderworker.retried", 0))
	run.End(at(101))

	rctx, run = tr.Start(ctx, "process order_modify", trace.WithSpanKind(trace.SpanKindConsumer), at(300))
	_, lk = tr.Start(rctx, tracing.SpanLock, at(300))
	lk.SetAttributes(tracing.AttrFence.Int64(7), tracing.AttrLockMode.String("turn"), attribute.Int64("orderworker.lock.waited_ms", 0),
		attribute.Int("orderworker.hold.changes", 1))
	lk.AddEvent(tracing.EventInHold, at(300), head)
	lk.End(at(302))
	_, wr := tr.Start(rctx, tracing.SpanWrite, at(302), trace.WithAttributes(tracing.AttrFence.Int64(7)))
	wr.End(at(352))
	_, ho := tr.Start(rctx, tracing.SpanHandoff, at(352), trace.WithAttributes(attribute.Bool("orderworker.turn_passed", true)))
	ho.AddEvent(tracing.EventWoken, at(353), trace.WithAttributes(tracing.AttrWoken.StringSlice([]string{"order:modify modify-3", "order:modify modify-4"})))
	ho.End(at(354))
	run.SetAttributes(tracing.AttrOutcome.String(worker.OutcomeOK), attribute.Int("orderworker.retried", 1))
	run.End(at(354))

	require.Equal(t, "modify-2", spans.drained())
	var out strings.Builder
	require.NoError(t, printTrace(&out, &spans, "modify-2"))
	tree, _, ok := strings.Cut(out.String(), "\n  send <queue>")
	require.True(t, ok, "the legend follows the tree")
	id := trace.SpanContextFromContext(ctx).TraceID()
	require.Equal(t, `
The trace of modify-2, an order:modify of SO1, as OpenTelemetry recorded it (every span, by start time).
(-trace keeps the spans in memory; -trace-event ID prints another change's trace.)

trace_id `+id.String()+`
   start      took  span [in plain words]  attributes; · events
 +0.000s     1.5ms  send order_modify [accepted]  order_no=SO1  event_id=modify-2  seq=2
 +0.005s      96ms  ├─ process order_modify [a run]  outcome=waiting  retried=0
 +0.005s      95ms  │  └─ order lock [its turn, then the lock]
 +0.006s            │        · waiting for its turn behind order:modify modify-1 (seq 1)
 +0.100s            │        · parked behind order:modify modify-1 (seq 1), back in 500ms
 +0.300s      54ms  └─ process order_modify [a run]  outcome=ok  retried=1
 +0.300s     2.0ms     ├─ order lock [its turn, then the lock]  fence=7  lock.mode=turn  lock.waited_ms=0  hold.changes=1
 +0.300s               │     · taken in the hold of order:modify modify-1 (seq 1)
 +0.302s      50ms     ├─ order write [written]  fence=7
 +0.352s     2.0ms     └─ order hand-off [turn passed on]  turn_passed=true
 +0.353s                     · called back the next in line: order:modify modify-3, order:modify modify-4
`, tree)

	var none strings.Builder
	require.ErrorContains(t, printTrace(&none, &spans, "modify-9"), `no trace of change "modify-9"`)
}
