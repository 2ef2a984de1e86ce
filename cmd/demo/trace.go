package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// spanLog is the demo's in-process span collector: a span processor that
// keeps every span that ends, in memory, so that the demo can print a trace
// after the scenario without a collector to send it to. It is safe for
// concurrent use.
type spanLog struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

var _ sdktrace.SpanProcessor = (*spanLog)(nil)

// OnStart does nothing: a span is kept once it has ended.
func (l *spanLog) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd keeps s.
func (l *spanLog) OnEnd(s sdktrace.ReadOnlySpan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spans = append(l.spans, s)
}

// Shutdown does nothing: there is nothing to flush.
func (l *spanLog) Shutdown(context.Context) error { return nil }

// ForceFlush does nothing: there is nothing to flush.
func (l *spanLog) ForceFlush(context.Context) error { return nil }

// trace returns the spans kept of the trace whose enqueue (its producer
// span) carried event ID ev, ordered by start time, or nil.
func (l *spanLog) trace(ev string) []sdktrace.ReadOnlySpan {
	l.mu.Lock()
	defer l.mu.Unlock()
	var id trace.TraceID
	for _, s := range l.spans {
		if s.SpanKind() == trace.SpanKindProducer && attr(s.Attributes(), tracing.AttrEventID) == ev {
			id = s.SpanContext().TraceID()
			break
		}
	}
	if !id.IsValid() {
		return nil
	}
	var out []sdktrace.ReadOnlySpan
	for _, s := range l.spans {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	return out
}

// drained returns the event ID of the first change enqueued (by its
// producer span's start) that is a modify, ran in the hold of the change
// before it (its "order lock" span has the event taken in the hold, naming
// another change's own position), and was applied: the change whose trace
// tells the demo's story best. It returns "" when there is none.
func (l *spanLog) drained() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	type found struct {
		sent          time.Time
		ev            string
		held, applied bool
	}
	byTrace := map[trace.TraceID]*found{}
	get := func(id trace.TraceID) *found {
		f := byTrace[id]
		if f == nil {
			f = &found{}
			byTrace[id] = f
		}
		return f
	}
	for _, s := range l.spans {
		f := get(s.SpanContext().TraceID())
		attrs := s.Attributes()
		switch {
		case s.SpanKind() == trace.SpanKindProducer:
			if attr(attrs, tracing.AttrTaskType) == tasks.Modify.Type {
				f.sent, f.ev = s.StartTime(), attr(attrs, tracing.AttrEventID)
			}
		case s.SpanKind() == trace.SpanKindConsumer:
			if attr(attrs, tracing.AttrOutcome) == worker.OutcomeOK {
				f.applied = true
			}
		case s.Name() == tracing.SpanLock:
			for _, e := range s.Events() {
				if e.Name != tracing.EventInHold {
					continue
				}
				if _, _, from, ok := tasks.Kinds().ParseLabel(attr(e.Attributes, tracing.AttrHead)); ok && from == "" {
					f.held = true
				}
			}
		}
	}
	var best *found
	for _, f := range byTrace {
		if f.ev != "" && f.held && f.applied && (best == nil || f.sent.Before(best.sent)) {
			best = f
		}
	}
	if best == nil {
		return ""
	}
	return best.ev
}

// attr returns the value of key among attrs as a string (a list's items
// joined by ", "), or "".
func attr(attrs []attribute.KeyValue, key attribute.Key) string {
	for _, a := range attrs {
		if a.Key == key {
			if a.Value.Type() == attribute.STRINGSLICE {
				return strings.Join(a.Value.AsStringSlice(), ", ")
			}
			return a.Value.String()
		}
	}
	return ""
}

// printTrace prints the trace of the change with event ID ev as a tree:
// each span with its start (since the trace's start), how long it took,
// its name, what it stands for and its key attributes, and its events and
// child spans under it, by time.
func printTrace(w io.Writer, l *spanLog, ev string) error {
	spans := l.trace(ev)
	if len(spans) == 0 {
		return fmt.Errorf("no trace of change %q was recorded", ev)
	}
	start := spans[0].StartTime()
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID()] = true
	}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans { // by start time: so are each span's children
		if p := s.Parent(); p.IsValid() && ids[p.SpanID()] {
			children[p.SpanID()] = append(children[p.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	root := spans[0]
	fmt.Fprintf(w, "\nThe trace of %s, an %s of %s, as OpenTelemetry recorded it (every span, by start time).\n",
		ev, attr(root.Attributes(), tracing.AttrTaskType), attr(root.Attributes(), tracing.AttrOrderNo))
	fmt.Fprintf(w, "(-trace keeps the spans in memory; -trace-event ID prints another change's trace.)\n\n")
	fmt.Fprintf(w, "trace_id %s\n", root.SpanContext().TraceID())
	fmt.Fprintf(w, "%8s %9s  %s\n", "start", "took", "span [in plain words]  attributes; · events")

	// A span's line, then its events and child spans merged by time.
	var walk func(s sdktrace.ReadOnlySpan, lead, branch string)
	walk = func(s sdktrace.ReadOnlySpan, lead, branch string) {
		fmt.Fprintf(w, "%+7.3fs %9s  %s%s%s\n", s.StartTime().Sub(start).Seconds(), took(s.EndTime().Sub(s.StartTime())),
			lead, branch, describe(s))
		switch branch {
		case "├─ ":
			lead += "│  "
		case "└─ ":
			lead += "   "
		}
		type item struct {
			at   time.Time
			span sdktrace.ReadOnlySpan
			ev   sdktrace.Event
		}
		var items []item
		for _, e := range s.Events() {
			items = append(items, item{at: e.Time, ev: e})
		}
		for _, c := range children[s.SpanContext().SpanID()] {
			items = append(items, item{at: c.StartTime(), span: c})
		}
		slices.SortStableFunc(items, func(a, b item) int { return a.at.Compare(b.at) })
		lastSpan := -1 // the tree's branch goes on down to it
		for i, it := range items {
			if it.span != nil {
				lastSpan = i
			}
		}
		for i, it := range items {
			switch {
			case it.span != nil && i == lastSpan:
				walk(it.span, lead, "└─ ")
			case it.span != nil:
				walk(it.span, lead, "├─ ")
			case i < lastSpan:
				fmt.Fprintf(w, "%+7.3fs %9s  %s│  · %s\n", it.at.Sub(start).Seconds(), "", lead, event(it.ev))
			default:
				fmt.Fprintf(w, "%+7.3fs %9s  %s   · %s\n", it.at.Sub(start).Seconds(), "", lead, event(it.ev))
			}
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
	fmt.Fprint(w, legend)
	return nil
}

// took formats a span's duration for people: milliseconds, with a
// fraction below 10ms.
func took(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}

// describe returns a span's line: its name, what it stands for in a word
// or two (see legend), and its key attributes (without their
// "orderworker." prefix).
func describe(s sdktrace.ReadOnlySpan) string {
	var what string
	var keys []attribute.Key
	switch {
	case s.SpanKind() == trace.SpanKindProducer:
		what = "accepted"
		keys = []attribute.Key{tracing.AttrOrderNo, tracing.AttrEventID, tracing.AttrSeq}
	case s.SpanKind() == trace.SpanKindConsumer:
		what = "a run"
		keys = []attribute.Key{tracing.AttrOutcome, "orderworker.retried"}
	case s.Name() == tracing.SpanLock:
		what = "its turn, then the lock"
		keys = []attribute.Key{tracing.AttrFence, tracing.AttrLockMode, "orderworker.lock.waited_ms", "orderworker.hold.changes"}
	case s.Name() == tracing.SpanWrite:
		what = "written"
		keys = []attribute.Key{tracing.AttrFence}
	case s.Name() == tracing.SpanHandoff:
		what = "turn passed on"
		keys = []attribute.Key{"orderworker.turn_passed"}
	}
	var b strings.Builder
	b.WriteString(s.Name())
	if what != "" {
		b.WriteString(" [" + what + "]")
	}
	for _, k := range keys {
		if v := attr(s.Attributes(), k); v != "" {
			fmt.Fprintf(&b, "  %s=%s", strings.TrimPrefix(string(k), "orderworker."), v)
		}
	}
	if st := s.Status(); st.Code == codes.Error {
		fmt.Fprintf(&b, "  error=%q", st.Description)
	}
	return b.String()
}

// legend says in plain words what the spans of a change's trace stand
// for, under the tree.
const legend = `
  send <queue>    [accepted] the producer gave the change its order's next position (seq) and
                  enqueued it, with this trace's context in the task's payload
  process <queue> [a run] a worker runs the task, in the same trace; a change accepted behind
                  unfinished changes of its order is parked at once, then run by the worker
                  that holds the order's lock for the change before it, in the same hold
                  (its own run), or called back to its queue when that one is done
  order lock      [its turn, then the lock] the change's turn in its order's sequence, and the
                  order's lock with a fence: a number that only grows, checked by every write
                  (· taken in the hold of the change before it: the lock it kept, its fence,
                  no wait; hold.changes counts the changes run in the hold before this one)
  order write     [written] the order store writes the change under that fence and commits
  order hand-off  [turn passed on] the change's position is done: the next one's turn
                  (· called back the next in line: a parked change is brought back at once)
`

// event returns an event's line: its name and, for the events of a wait
// and a hand-off, whom it concerns.
func event(e sdktrace.Event) string {
	a := e.Attributes
	switch e.Name {
	case tracing.EventWaiting:
		return fmt.Sprintf("%s behind %s (seq %s)", e.Name, attr(a, tracing.AttrHead), attr(a, tracing.AttrHeadSeq))
	case tracing.EventInHold:
		return fmt.Sprintf("%s of %s (seq %s)", e.Name, attr(a, tracing.AttrHead), attr(a, tracing.AttrHeadSeq))
	case tracing.EventParked, tracing.EventOnHold:
		return fmt.Sprintf("%s behind %s (seq %s), back in %sms", e.Name, attr(a, tracing.AttrHead), attr(a, tracing.AttrHeadSeq), attr(a, tracing.AttrDelay))
	case tracing.EventBusy:
		return fmt.Sprintf("%s, held by %s", e.Name, attr(a, tracing.AttrHolder))
	case tracing.EventSkipped:
		return fmt.Sprintf("%s: %s (seq %s): %s", e.Name, attr(a, tracing.AttrHead), attr(a, tracing.AttrHeadSeq), attr(a, tracing.AttrReason))
	case tracing.EventWoken:
		return fmt.Sprintf("%s: %s", e.Name, attr(a, tracing.AttrWoken))
	case semconv.ExceptionEventName: // its message is the span's error
		return fmt.Sprintf("%s (%s)", e.Name, attr(a, semconv.ExceptionTypeKey))
	}
	var b strings.Builder
	b.WriteString(e.Name)
	for _, kv := range a {
		fmt.Fprintf(&b, "  %s=%s", kv.Key, kv.Value.String())
	}
	return b.String()
}
