// Package otlptest is an OpenTelemetry collector as the tests meet it: an
// OTLP/HTTP trace receiver (POST /v1/traces, binary protobuf, optionally
// gzipped) on a loopback port, which keeps every span it receives in a
// flat, comparable form ([Span]) and lets a test wait, without polling,
// until the spans it expects have arrived ([Receiver.Wait],
// [Receiver.WaitFor]).
//
// Point a process at it with OTEL_EXPORTER_OTLP_ENDPOINT=[Receiver.URL] (the
// exporter appends /v1/traces) or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=
// [Receiver.TracesURL]. It answers every well-formed export 200 with an
// empty ExportTraceServiceResponse (all spans accepted), and refuses what an
// OTLP/HTTP exporter never sends (another path, method or content type, an
// undecodable body) with a 4xx, counted in [Receiver.Rejected].
//
// It is test support: only _test.go files import it (the lint's depguard
// rules enforce that).
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TracesPath is the path of the OTLP/HTTP trace export.
const TracesPath = "/v1/traces"

// MaxBody is the largest export body the receiver reads, compressed or
// not: 16 MiB. A larger one is refused with 413.
const MaxBody = 16 << 20

// Span is one span as received, with its IDs in lowercase hex and every
// attribute value as a string (see [Attributes]).
type Span struct {
	// TraceID is the trace's ID, 32 hex digits.
	TraceID string
	// SpanID is the span's ID, 16 hex digits.
	SpanID string
	// ParentSpanID is the parent's span ID, "" for a root span.
	ParentSpanID string
	// Name is the span's name.
	Name string
	// Kind is "internal", "server", "client", "producer", "consumer" or
	// "unspecified".
	Kind string
	// Service is the resource's service.name.
	Service string
	// Scope is the instrumentation scope's name.
	Scope string
	// Start and End are the span's start and end times.
	Start, End time.Time
	// Attributes are the span's attributes.
	Attributes Attributes
	// Events are the span's events, in order.
	Events []Event
	// Links are the span's links, in order.
	Links []Link
	// Status is the span's status.
	Status Status
}

// Event is a span event.
type Event struct {
	Name       string
	Time       time.Time
	Attributes Attributes
}

// Link is a span link to another span.
type Link struct {
	// TraceID and SpanID are the linked span's, in hex.
	TraceID, SpanID string
	Attributes      Attributes
}

// Status is a span's status: Code is "unset", "ok" or "error".
type Status struct {
	Code, Message string
}

// Attributes maps an attribute's key to its value as a string: a string as
// it is, a bool, an int or a double as strconv formats it, bytes in hex,
// and an array or a key-value list as the JSON array or object of its
// values' strings.
type Attributes map[string]string

// String returns a one-line summary of s, for failure messages.
func (s Span) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q (%s, %s) trace=%s span=%s parent=%s", s.Service, s.Name, s.Kind, s.Status.Code, s.TraceID, s.SpanID, s.ParentSpanID)
	for _, k := range slices.Sorted(maps.Keys(s.Attributes)) {
		fmt.Fprintf(&b, " %s=%q", k, s.Attributes[k])
	}
	for _, e := range s.Events {
		fmt.Fprintf(&b, " event{%s", e.Name)
		for _, k := range slices.Sorted(maps.Keys(e.Attributes)) {
			fmt.Fprintf(&b, " %s=%q", k, e.Attributes[k])
		}
		b.WriteString("}")
	}
	for _, l := range s.Links {
		fmt.Fprintf(&b, " link{%s/%s}", l.TraceID, l.SpanID)
	}
	return b.String()
}

// HasEvent reports whether s has an event name whose attributes include
// every key and value of attrs.
func (s Span) HasEvent(name string, attrs Attributes) bool {
	return slices.ContainsFunc(s.Events, func(e Event) bool {
		if e.Name != name {
			return false
		}
		for k, v := range attrs {
			if got, ok := e.Attributes[k]; !ok || got != v {
				return false
			}
		}
		return true
	})
}

// LinksTo reports whether s has a link to the span other.
func (s Span) LinksTo(other Span) bool {
	return slices.ContainsFunc(s.Links, func(l Link) bool { return l.TraceID == other.TraceID && l.SpanID == other.SpanID })
}

// Spans is a list of spans, in the order received.
type Spans []Span

// Trace returns the spans of the trace with ID traceID (hex).
func (ss Spans) Trace(traceID string) Spans {
	return ss.Filter(func(s Span) bool { return s.TraceID == traceID })
}

// Named returns the spans named name.
func (ss Spans) Named(name string) Spans {
	return ss.Filter(func(s Span) bool { return s.Name == name })
}

// Filter returns the spans for which keep is true.
func (ss Spans) Filter(keep func(Span) bool) Spans {
	var out Spans
	for _, s := range ss {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// ByID returns the span with ID spanID in the trace traceID.
func (ss Spans) ByID(traceID, spanID string) (Span, bool) {
	i := slices.IndexFunc(ss, func(s Span) bool { return s.TraceID == traceID && s.SpanID == spanID })
	if i < 0 {
		return Span{}, false
	}
	return ss[i], true
}

// Children returns the spans whose parent is parent.
func (ss Spans) Children(parent Span) Spans {
	return ss.Filter(func(s Span) bool { return s.TraceID == parent.TraceID && s.ParentSpanID == parent.SpanID })
}

// String lists the spans, one a line, for failure messages.
func (ss Spans) String() string {
	var b strings.Builder
	for _, s := range ss {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Receiver is the OTLP/HTTP trace receiver. Its methods are safe for
// concurrent use, also while it serves exports.
type Receiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	spans    Spans
	exports  int      // well-formed export requests
	rejected []string // why each refused request was refused
	// changed is closed, and replaced, whenever an export request is
	// handled (accepted or not).
	changed chan struct{}
}

// New starts a receiver on a loopback port. It stops at tb's cleanup,
// after the exports in flight are answered; an exporter that sends later
// finds the port closed.
func New(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{changed: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	tb.Cleanup(r.srv.Close)
	return r
}

// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) URL() string { return r.srv.URL }

// TracesURL is the trace export's URL, for
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
func (r *Receiver) TracesURL() string { return r.srv.URL + TracesPath }

// Spans returns the spans received so far, in the order received.
func (r *Receiver) Spans() Spans {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Exports returns how many well-formed export requests arrived, spans or
// not.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// Rejected returns why each refused request was refused, in order.
func (r *Receiver) Rejected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rejected)
}

// Wait waits until done holds for the spans received so far, and returns
// those spans. done is called at once and again after each export
// request, on the caller's goroutine, with a copy it may keep. Wait
// returns ctx's cause, wrapped with the spans' count, when ctx ends first.
func (r *Receiver) Wait(ctx context.Context, done func(Spans) bool) (Spans, error) {
	for {
		r.mu.Lock()
		spans, changed := slices.Clone(r.spans), r.changed
		r.mu.Unlock()
		if done(spans) {
			return spans, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return spans, fmt.Errorf("otlptest: %d spans received, not yet the ones awaited: %w", len(spans), context.Cause(ctx))
		}
	}
}

// WaitFor is Wait with a timeout: it fails tb, naming what (such as "the
// worker's spans of ev-1") and listing the spans received, when done does
// not hold within timeout. It must be called from the test's goroutine.
func (r *Receiver) WaitFor(tb testing.TB, timeout time.Duration, what string, done func(Spans) bool) Spans {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	spans, err := r.Wait(ctx, done)
	if err != nil {
		tb.Fatalf("%s: not received within %v: %v; the spans:\n%s", what, timeout, err, spans)
	}
	return spans
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	spans, status, err := decode(w, req)
	r.mu.Lock()
	if err != nil {
		r.rejected = append(r.rejected, fmt.Sprintf("%s %s: %v", req.Method, req.URL.Path, err))
	} else {
		r.exports++
		r.spans = append(r.spans, spans...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	body, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	if err != nil { // unreachable: an empty message
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(body)
}

// decode reads an export request; on error it also returns the status to
// answer.
func decode(w http.ResponseWriter, req *http.Request) (Spans, int, error) {
	switch {
	case req.URL.Path != TracesPath:
		return nil, http.StatusNotFound, fmt.Errorf("not the trace export's path %s", TracesPath)
	case req.Method != http.MethodPost:
		return nil, http.StatusMethodNotAllowed, errors.New("the trace export is a POST")
	}
	if ct, _, _ := strings.Cut(req.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) != "application/x-protobuf" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: only application/x-protobuf is received", ct)
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, MaxBody)
	switch enc := req.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("gzip body: %w", err)
		}
		defer zr.Close()
		body = io.LimitReader(zr, MaxBody+1)
	default:
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content encoding %q: only gzip is received", enc)
	}
	b, err := io.ReadAll(body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge) || len(b) > MaxBody:
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", MaxBody)
	case err != nil:
		return nil, http.StatusBadRequest, fmt.Errorf("read body: %w", err)
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("decode ExportTraceServiceRequest: %w", err)
	}
	return flatten(&msg), 0, nil
}

// flatten turns an export's resource and scope spans into Spans.
func flatten(msg *coltracepb.ExportTraceServiceRequest) Spans {
	var out Spans
	for _, rs := range msg.GetResourceSpans() {
		service := attributes(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			scope := ss.GetScope().GetName()
			for _, s := range ss.GetSpans() {
				out = append(out, span(s, service, scope))
			}
		}
	}
	return out
}

func span(s *tracepb.Span, service, scope string) Span {
	sp := Span{
		TraceID:      hexID(s.GetTraceId()),
		SpanID:       hexID(s.GetSpanId()),
		ParentSpanID: hexID(s.GetParentSpanId()),
		Name:         s.GetName(),
		Kind:         kind(s.GetKind()),
		Service:      service,
		Scope:        scope,
		Start:        unixNano(s.GetStartTimeUnixNano()),
		End:          unixNano(s.GetEndTimeUnixNano()),
		Attributes:   attributes(s.GetAttributes()),
		Status:       Status{Code: statusCode(s.GetStatus().GetCode()), Message: s.GetStatus().GetMessage()},
	}
	for _, e := range s.GetEvents() {
		sp.Events = append(sp.Events, Event{Name: e.GetName(), Time: unixNano(e.GetTimeUnixNano()), Attributes: attributes(e.GetAttributes())})
	}
	for _, l := range s.GetLinks() {
		sp.Links = append(sp.Links, Link{TraceID: hexID(l.GetTraceId()), SpanID: hexID(l.GetSpanId()), Attributes: attributes(l.GetAttributes())})
	}
	return sp
}

// hexID is an ID in lowercase hex; "" for an empty (or all-zero) one.
func hexID(b []byte) string {
	if !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		return ""
	}
	return hex.EncodeToString(b)
}

func unixNano(ns uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(ns)) // nanoseconds since 1970 fit an int64 until 2262
}

func kind(k tracepb.Span_SpanKind) string {
	switch k {
	case tracepb.Span_SPAN_KIND_INTERNAL:
		return "internal"
	case tracepb.Span_SPAN_KIND_SERVER:
		return "server"
	case tracepb.Span_SPAN_KIND_CLIENT:
		return "client"
	case tracepb.Span_SPAN_KIND_PRODUCER:
		return "producer"
	case tracepb.Span_SPAN_KIND_CONSUMER:
		return "consumer"
	}
	return "unspecified"
}

func statusCode(c tracepb.Status_StatusCode) string {
	switch c {
	case tracepb.Status_STATUS_CODE_OK:
		return "ok"
	case tracepb.Status_STATUS_CODE_ERROR:
		return "error"
	}
	return "unset"
}

func attributes(kvs []*commonpb.KeyValue) Attributes {
	out := make(Attributes, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

// value is an attribute value as a string (see Attributes).
func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		vs := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			vs = append(vs, value(e))
		}
		b, _ := json.Marshal(vs)
		return string(b)
	case *commonpb.AnyValue_KvlistValue:
		b, _ := json.Marshal(attributes(x.KvlistValue.GetValues()))
		return string(b)
	}
	return ""
}
