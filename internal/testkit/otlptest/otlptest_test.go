package otlptest_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/orderworker/orderworker/internal/testkit/otlptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// export sends spans to rec with the SDK's OTLP/HTTP exporter (gzipped
// when gz), as the binaries do, and returns the two spans' contexts: a
// producer span and a consumer child linked to it.
func export(t *testing.T, rec *otlptest.Receiver, gz bool) (parent, child trace.SpanContext) {
	t.Helper()
	ctx := t.Context()
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(rec.TracesURL())}
	if gz {
		opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	require.NoError(t, err)
	res := resource.NewSchemaless(attribute.String("service.name", "svc-test"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	defer func() { require.NoError(t, tp.Shutdown(context.WithoutCancel(ctx))) }()
	tr := tp.Tracer("scope-test")

	pctx, p := tr.Start(ctx, "send q", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("s", "v"), attribute.Int64("i", 42), attribute.Bool("b", true),
			attribute.Float64("f", 1.5), attribute.StringSlice("list", []string{"a", "b"})))
	p.End()
	_, c := tr.Start(pctx, "process q", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(trace.Link{SpanContext: p.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("why", "enqueue")}}))
	c.AddEvent("waiting for its turn", trace.WithAttributes(attribute.String("head", "order:modify ev-1"), attribute.Int64("seq", 7)))
	c.SetStatus(codes.Error, "it broke")
	c.End()
	return p.SpanContext(), c.SpanContext()
}

func TestReceivesTheExportersSpans(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[gz], func(t *testing.T) {
			rec := otlptest.New(t)
			p, c := export(t, rec, gz)
			spans := rec.WaitFor(t, 10*time.Second, "both spans", func(ss otlptest.Spans) bool { return len(ss) == 2 })
			assert.Empty(t, rec.Rejected())
			assert.Positive(t, rec.Exports())

			send, ok := spans.ByID(p.TraceID().String(), p.SpanID().String())
			require.True(t, ok, "the producer span by its IDs in:\n%s", spans)
			assert.Equal(t, "send q", send.Name)
			assert.Equal(t, "producer", send.Kind)
			assert.Equal(t, "svc-test", send.Service)
			assert.Equal(t, "scope-test", send.Scope)
			assert.Empty(t, send.ParentSpanID)
			assert.Equal(t, otlptest.Attributes{"s": "v", "i": "42", "b": "true", "f": "1.5", "list": `["a","b"]`}, send.Attributes)
			assert.Equal(t, "unset", send.Status.Code)
			assert.False(t, send.Start.IsZero())
			assert.False(t, send.End.Before(send.Start))

			proc := spans.Named("process q")
			require.Len(t, proc, 1)
			got := proc[0]
			assert.Equal(t, c.TraceID().String(), got.TraceID)
			assert.Equal(t, c.SpanID().String(), got.SpanID)
			assert.Equal(t, send.SpanID, got.ParentSpanID)
			assert.Equal(t, "consumer", got.Kind)
			assert.Equal(t, otlptest.Status{Code: "error", Message: "it broke"}, got.Status)
			assert.True(t, got.LinksTo(send))
			assert.Equal(t, otlptest.Attributes{"why": "enqueue"}, got.Links[0].Attributes)
			assert.True(t, got.HasEvent("waiting for its turn", otlptest.Attributes{"head": "order:modify ev-1"}))
			assert.True(t, got.HasEvent("waiting for its turn", otlptest.Attributes{"head": "order:modify ev-1", "seq": "7"}))
			assert.False(t, got.HasEvent("waiting for its turn", otlptest.Attributes{"head": "order:modify ev-2"}))
			assert.False(t, got.HasEvent("parked", nil))
			assert.Equal(t, otlptest.Spans{got}, spans.Children(send))
			assert.Equal(t, spans, spans.Trace(c.TraceID().String()))
			assert.Empty(t, spans.Trace(strings.Repeat("0", 31)+"1"))
			assert.Contains(t, spans.String(), `"process q" (consumer, error)`)
		})
	}
}

// post sends body to the receiver as an exporter would, with the given
// path, content type and encoding, and returns the status.
func post(t *testing.T, url, contentType, encoding string, body []byte) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode == http.StatusOK {
		assert.Equal(t, "application/x-protobuf", resp.Header.Get("Content-Type"))
		var res coltracepb.ExportTraceServiceResponse
		require.NoError(t, proto.Unmarshal(b, &res))
		assert.Nil(t, res.GetPartialSuccess(), "every span accepted")
	}
	return resp.StatusCode
}

func TestRefusesWhatAnExporterNeverSends(t *testing.T) {
	rec := otlptest.New(t)
	empty, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{})
	require.NoError(t, err)
	const pb = "application/x-protobuf"
	var notGzip bytes.Buffer
	notGzip.WriteString("not gzip")
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte{0xff, 0xff, 0xff})
	require.NoError(t, zw.Close())

	assert.Equal(t, http.StatusOK, post(t, rec.TracesURL(), pb, "", empty), "an empty export")
	assert.Equal(t, http.StatusOK, post(t, rec.TracesURL(), pb+"; charset=binary", "", empty), "parameters of the type")
	assert.Equal(t, http.StatusNotFound, post(t, rec.URL()+"/v1/metrics", pb, "", empty))
	assert.Equal(t, http.StatusUnsupportedMediaType, post(t, rec.TracesURL(), "application/json", "", []byte("{}")))
	assert.Equal(t, http.StatusUnsupportedMediaType, post(t, rec.TracesURL(), pb, "br", empty))
	assert.Equal(t, http.StatusBadRequest, post(t, rec.TracesURL(), pb, "gzip", notGzip.Bytes()))
	assert.Equal(t, http.StatusBadRequest, post(t, rec.TracesURL(), pb, "gzip", zipped.Bytes()), "not protobuf inside")
	assert.Equal(t, http.StatusBadRequest, post(t, rec.TracesURL(), pb, "", []byte{0xff, 0xff, 0xff}))

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, rec.TracesURL(), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	assert.Equal(t, 2, rec.Exports())
	assert.Len(t, rec.Rejected(), 7)
	assert.Empty(t, rec.Spans())
}

func TestWaitEndsWithItsContext(t *testing.T) {
	rec := otlptest.New(t)
	ctx, cancel := context.WithCancelCause(t.Context())
	cause := errors.New("the test gave up")
	calls := 0
	done := make(chan error, 1)
	go func() {
		_, err := rec.Wait(ctx, func(otlptest.Spans) bool { calls++; return false })
		done <- err
	}()
	cancel(cause)
	select {
	case err := <-done:
		require.ErrorIs(t, err, cause)
		assert.ErrorContains(t, err, "0 spans received")
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after its context ended")
	}
	assert.Positive(t, calls, "done is asked at once")
}

// TestWaitWakesOnEachExport: Wait asks again after every export, whether
// or not it carried spans.
func TestWaitWakesOnEachExport(t *testing.T) {
	rec := otlptest.New(t)
	empty, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{})
	require.NoError(t, err)
	asked := make(chan int, 10)
	done := make(chan error, 1)
	go func() {
		_, err := rec.Wait(t.Context(), func(otlptest.Spans) bool {
			n := rec.Exports()
			asked <- n
			return n == 2
		})
		done <- err
	}()
	want := 0
	for want < 2 {
		select {
		case n := <-asked:
			if n == want {
				want++
				post(t, rec.TracesURL(), "application/x-protobuf", "", empty)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Wait was not woken by an export")
		}
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once done held")
	}
}
