package httpstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/orderworker/orderworker/internal/token"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// The headers of the upstream order API (docs/upstream-order-api.md).
const (
	// HeaderIdempotencyKey carries the event ID of a write. The upstream
	// applies each key at most once per order and answers a repeat with the
	// recorded outcome.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFencingToken carries the fence of a write ([orders.Write.Fence]) as a
	// decimal int64. The upstream refuses a fence older than the newest it
	// has seen for the order.
	HeaderFencingToken = "Fencing-Token"
	// HeaderSequence carries the change's position in its order's sequence
	// ([orders.Write.Seq]) as a decimal int64, when it has one. The
	// upstream refuses a position not after the newest it has applied to
	// the order (409 passed), and keeps it in the history.
	HeaderSequence = "Order-Sequence"
	// HeaderSequenceCheck carries, instead of HeaderSequence, the position
	// of a change that ran out of its turn ([orders.Write.SeqOutOfTurn]):
	// the upstream refuses it as it does HeaderSequence, but never stores
	// it as the order's newest, nor in the history. An upstream that does
	// not know this header applies such a change without order, which is
	// safe: only positions applied in their turn move an order on.
	HeaderSequenceCheck = "Order-Sequence-Check"
	// HeaderWorkerID carries [orders.Write.Worker], for the order's history.
	HeaderWorkerID = "X-Worker-Id"
	// HeaderStartedAt carries [orders.Write.StartedAt] in RFC 3339 with
	// microseconds, for the order's history.
	HeaderStartedAt = "X-Work-Started-At"
	// HeaderReplayed is set to "true" on the answer to a write whose
	// Idempotency-Key had already been applied: the body is the recorded
	// outcome and nothing was written (Stripe's convention).
	HeaderReplayed = "Idempotent-Replayed"
)

// The error codes of the upstream order API, in the error body
// {"error": {"code": ..., "message": ...}}.
const (
	// CodeInvalid (400 or 422): the request can never succeed as given.
	CodeInvalid = "invalid"
	// CodeNoFence (400): a write without a positive Fencing-Token.
	CodeNoFence = "no_fence"
	// CodeUnauthorized (401): the access token is missing, unknown or
	// expired.
	CodeUnauthorized = "unauthorized"
	// CodeNotFound (404): no such order.
	CodeNotFound = "not_found"
	// CodeStaleFence (409): the fence is older than the newest the
	// upstream has seen for the order.
	CodeStaleFence = "stale_fence"
	// CodePassed (409): the Order-Sequence is not after the newest
	// position the upstream has applied to the order.
	CodePassed = "passed"
	// CodeOrderClosed (409): the order is exchanged or cancelled; the body
	// also carries "status" and "exchanged_to".
	CodeOrderClosed = "order_closed"
	// CodeConflict (409): the replacement's number is taken, or the
	// Idempotency-Key was used for a different request.
	CodeConflict = "conflict"
	// CodeInternal (5xx): the upstream failed; retry later.
	CodeInternal = "internal"
)

// ErrUpstream is returned (wrapped, usually in an [*UpstreamError]) by
// [Store] when the order API failed in a way that a later retry may fix:
// a 5xx, 408, 425 or 429 answer, a 401 to a freshly fetched token, no answer
// within Config.Timeout, a connection error, or an answer that does not
// follow the API (a redirect, an undecodable body, a 404 without code
// not_found). It is not [orders.Permanent].
var ErrUpstream = errors.New("httpstore: order API failed")

// UpstreamError is an error answer of the upstream order API. It matches the
// package error that the answer means (see [Store]) with errors.Is, and
// a *[orders.ClosedError] with errors.As when the order is closed.
type UpstreamError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Code is error.code of the error body, or "" without one.
	Code string
	// Message is error.message of the error body (cut to 512 bytes, control
	// characters removed), or "" without one.
	Message string
	// Err is what the answer means: orders.ErrNotFound, orders.ErrStaleFence, a
	// *orders.ClosedError, orders.ErrConflict, orders.ErrNoFence, orders.ErrInvalid, or ErrUpstream for
	// an answer a retry may fix. Never nil.
	Err error
}

// Error names the status, the code, the upstream's message and Err (unless
// the message already has Err's text).
func (e *UpstreamError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "order API answered %d", e.StatusCode)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	// The upstream's message often says it already (the reference
	// server's does).
	if err := e.Err.Error(); !strings.Contains(e.Message, err) {
		b.WriteString(": " + err)
	}
	return b.String()
}

// Unwrap returns Err.
func (e *UpstreamError) Unwrap() error { return e.Err }

// TokenSource hands out the access token for the order API. *token.Cache
// satisfies it. Implementations must be safe for concurrent use.
type TokenSource interface {
	// Get returns the current access token. [Store] returns its error
	// wrapped, so an error a retry may fix must not match one of this
	// package's permanent errors (token.ErrUnavailable does not).
	Get(ctx context.Context) (string, error)
	// Invalidate reports that the upstream refused token (a 401), so that
	// the next Get returns another one.
	Invalidate(ctx context.Context, token string) error
}

// DefaultTimeout is the default of Config.Timeout.
const DefaultTimeout = 10 * time.Second

// Config tunes a [Store]. The zero value is ready to use.
type Config struct {
	// Timeout bounds each request to the order API, from sending it to
	// reading the whole answer; a request that runs out of it fails with
	// ErrUpstream (retryable). It does not bound the wait for a token,
	// which the TokenSource bounds (token.Config.WaitTimeout), and a call
	// may make two requests (see [Store]). The caller's context bounds
	// everything. Defaults to 10s.
	Timeout time.Duration
	// Client sends the requests. The store uses a shallow copy that never
	// follows redirects (a redirected POST may become a GET); its own
	// Timeout, if any, applies too. Defaults to a client over a clone of
	// http.DefaultTransport that keeps up to 64 idle connections to the
	// upstream, enough for a worker's concurrency.
	Client *http.Client
	// TracerProvider, when set, makes each request a client span (under
	// the caller's span: the worker's "order write") and sends the W3C
	// traceparent and tracestate headers, so that the order API's own
	// spans join the change's trace (otelhttp). Defaults to nil: no spans
	// and no trace headers.
	TracerProvider trace.TracerProvider
	// AllowInsecureHTTP lets the base URL be an http:// URL of a host that
	// is not loopback, which sends the access token (and the orders) in
	// clear text. Defaults to false: the base URL must be https://, or
	// http:// to localhost, 127.0.0.0/8 or ::1 (a sidecar, a test).
	AllowInsecureHTTP bool
}

// ErrInsecureURL is matched by the error of [New] for a base URL of
// http:// to a host that is not loopback, without
// Config.AllowInsecureHTTP.
var ErrInsecureURL = errors.New("httpstore: order API URL is http:// to a host that is not loopback: the access token would cross the network in clear text")

// maxResponse is the largest answer the store reads; a longer one fails
// with ErrUpstream. A history of a few thousand entries fits.
const maxResponse = 8 << 20

// maxMessage is the longest upstream error message kept in an error.
const maxMessage = 512

// Store is the [orders.Store] backed by the upstream order API, specified in
// docs/upstream-order-api.md: a Bearer token from a [TokenSource] on every
// request, and on every write the event ID as Idempotency-Key and the fence
// as Fencing-Token. The upstream applies the fence and idempotency rules, so
// the store behaves as the Redis store (redisstore) does, as seen by the worker.
//
// Before sending, the store checks what the Redis store checks (a fenced [orders.Write]
// in the context, order numbers, items) with the same errors, and also that
// an event ID is 1 to 128 printable ASCII characters (tasks.ValidEventID),
// so that it fits a header; an exchange without NewOrderNo is sent with
// [tasks.ReplacementOrderNo], so the upstream never derives it.
//
// The answers map to errors, each wrapped in an *[UpstreamError]:
//
//	2xx                 success; Idempotent-Replayed: true sets orders.Result.Replayed
//	400 no_fence        orders.ErrNoFence
//	400, 422, other 4xx orders.ErrInvalid (permanent), with the upstream's message
//	401                 the token is invalidated and the request sent once
//	                    more with a new one; a second 401 is ErrUpstream
//	404 not_found       orders.ErrNotFound; any other 404 is ErrUpstream (likely a
//	                    wrong base URL, not a missing order)
//	409 stale_fence     orders.ErrStaleFence
//	409 passed          orders.ErrPassed
//	409 order_closed    *orders.ClosedError naming the replacement (orders.ErrClosed)
//	409 other           orders.ErrConflict
//	408, 425, 429, 5xx  ErrUpstream
//
// Timeouts, connection errors and unreadable answers are ErrUpstream too,
// and a TokenSource error is returned wrapped as it is (token.ErrUnavailable
// stays retryable). When ctx ends, the error wraps context.Cause(ctx), so a
// lost lock's cause reaches the caller. Only orders.ErrNotFound,
// orders.ErrClosed, orders.ErrConflict, orders.ErrPassed, orders.ErrNoFence
// and orders.ErrInvalid are [orders.Permanent].
//
// An Store is safe for concurrent use. It owns no goroutines;
// [Store.CloseIdleConnections] releases its idle connections.
type Store struct {
	base    string // without a trailing slash
	tokens  TokenSource
	hc      *http.Client
	timeout time.Duration
	// idle closes the idle connections: hc's own CloseIdleConnections,
	// unless otelhttp's transport wraps hc's, which does not pass the call
	// on.
	idle func()
}

var (
	_ orders.Modifier  = (*Store)(nil)
	_ orders.Exchanger = (*Store)(nil)
	_ orders.Forwarder = (*Store)(nil)
)

// New returns a store that calls the order API at baseURL (an absolute
// http or https URL, possibly with a path such as https://host/v1; the
// store appends /orders/...) with tokens from tokens. It returns an error
// when baseURL is not such a URL, has credentials, a query or a fragment,
// is http:// to a host that is not loopback without
// cfg.AllowInsecureHTTP ([ErrInsecureURL]), when tokens is nil, or when
// cfg.Timeout is negative.
func New(baseURL string, tokens TokenSource, cfg Config) (*Store, error) {
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return nil, errors.New("httpstore: order API URL does not parse")
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return nil, fmt.Errorf("httpstore: order API URL %q: want an absolute http or https URL", u.Redacted())
	case u.User != nil:
		return nil, fmt.Errorf("httpstore: order API URL %q has credentials; the store authenticates with its token", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("httpstore: order API URL %q has a query or fragment", u.Redacted())
	case u.Scheme == "http" && !cfg.AllowInsecureHTTP && !token.IsLoopback(u.Hostname()):
		return nil, ErrInsecureURL
	case tokens == nil:
		return nil, errors.New("httpstore: nil token source")
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("httpstore: negative order API timeout %v", cfg.Timeout)
	}
	var hc http.Client
	if cfg.Client != nil {
		hc = *cfg.Client
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		hc.Transport = tr
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	base := hc // its transport is the one that holds the connections
	if cfg.TracerProvider != nil {
		hc.Transport = otelhttp.NewTransport(hc.Transport,
			otelhttp.WithTracerProvider(cfg.TracerProvider),
			otelhttp.WithPropagators(tracing.Propagator),
			// The order number is in the URL, an attribute; the span's
			// name stays of few values.
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "order API " + r.Method }))
	}
	return &Store{
		base:    strings.TrimRight(u.String(), "/"),
		tokens:  tokens,
		hc:      &hc,
		idle:    base.CloseIdleConnections,
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout),
	}, nil
}

// CloseIdleConnections closes the connections to the upstream that are not
// in use. The store stays usable. Call it when the store is done with.
func (s *Store) CloseIdleConnections() { s.idle() }

// orderPath is the path of order no, with suffix ("", "/history",
// "/modify", "/exchange" or a forwarded kind's "/<name>").
func (s *Store) orderPath(no, suffix string) string {
	return s.base + "/orders/" + url.PathEscape(no) + suffix
}

// Get returns the order (GET /orders/{no}). It returns orders.ErrInvalid for a
// malformed order number, orders.ErrNotFound, and the other errors listed on
// [Store].
func (s *Store) Get(ctx context.Context, orderNo string) (orders.Order, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.Order{}, fmt.Errorf("get: %w", err)
	}
	var o orders.Order
	if _, err := s.call(ctx, http.MethodGet, orderNo, "", nil, nil, &o, checkOrder(&o, orderNo)); err != nil {
		return orders.Order{}, fmt.Errorf("get %s: %w", orderNo, err)
	}
	return o, nil
}

// historyBody is the answer of GET /orders/{no}/history.
type historyBody struct {
	Entries []orders.Entry `json:"entries"`
}

// History returns a page of the order's history, oldest first. The
// upstream API has no pages (GET /orders/{no}/history answers the whole
// history the upstream keeps): each call reads it whole and cuts the page
// out, by version, so a caller that follows the pages reads it once per
// page. It returns orders.ErrInvalid for a malformed order number,
// orders.ErrNotFound, and the other errors listed on [Store].
func (s *Store) History(ctx context.Context, orderNo string, q orders.HistoryQuery) (orders.HistoryPage, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.HistoryPage{}, fmt.Errorf("history: %w", err)
	}
	q = q.WithDefaults()
	var h historyBody
	if _, err := s.call(ctx, http.MethodGet, orderNo, "/history", nil, nil, &h, nil); err != nil {
		return orders.HistoryPage{}, fmt.Errorf("history %s: %w", orderNo, err)
	}
	var page orders.HistoryPage
	for _, e := range h.Entries {
		if e.Version <= q.After {
			continue
		}
		if len(page.Entries) == q.Limit {
			page.Next = page.Entries[len(page.Entries)-1].Version
			break
		}
		e.StartedAt, e.EndedAt = e.StartedAt.UTC(), e.EndedAt.UTC()
		page.Entries = append(page.Entries, e)
	}
	return page, nil
}

// Put creates or replaces an order (PUT /orders/{no} with the order as
// body; the upstream ignores version and updated_at). It is neither fenced
// nor idempotent, as [orders.Store] says of Put; a [orders.Write] in ctx, when present,
// names the worker. It returns orders.ErrInvalid for a malformed order, and the
// other errors listed on [Store].
func (s *Store) Put(ctx context.Context, o orders.Order) error {
	o.Status = cmp.Or(o.Status, orders.StatusActive)
	if err := orders.CheckPut(o); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	body, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("put %s: %w", o.No, err)
	}
	hdr := http.Header{}
	if w, ok := orders.WriteFrom(ctx); ok {
		setWriter(hdr, w)
	}
	if _, err := s.call(ctx, http.MethodPut, o.No, "", hdr, body, nil, nil); err != nil {
		return fmt.Errorf("put %s: %w", o.No, err)
	}
	return nil
}

// modifyBody is the body of POST /orders/{no}/modify. An absent field is
// left as it is; items, when present, is never empty. It converts to and
// from orders.Changes, so a field added there fails to compile until it is added
// here (and to docs/upstream-order-api.md).
type modifyBody struct {
	Address *string       `json:"address,omitempty"`
	Remark  *string       `json:"remark,omitempty"`
	Items   []orders.Item `json:"items,omitempty"`
}

// exchangeBody is the body of POST /orders/{no}/exchange. NewOrderNo is
// always set by the client. The handler converts it to orders.Exchange, so a
// field added there fails to compile until it is added here.
type exchangeBody struct {
	Items      []orders.Item `json:"items"`
	NewOrderNo string        `json:"new_order_no"`
	Reason     string        `json:"reason,omitempty"`
}

// Modify applies c to the active order orderNo, once per eventID, under the
// fence of the [orders.Write] in ctx (POST /orders/{no}/modify). Result.Order is
// the order as the upstream's answer has it; orders.Result.Replayed is set when
// the upstream says the event had been applied before.
//
// It returns the errors of [orders.Store.Modify] as the Redis store does
// (orders.ErrNoFence and orders.ErrInvalid before sending anything, and also orders.ErrInvalid
// for an event ID that does not fit a header), and the upstream errors
// listed on [Store].
func (s *Store) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	if err := orders.CheckModify(eventID, orderNo, c); err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	if err := checkHeaderEventID(eventID); err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	body, err := json.Marshal(modifyBody(c))
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	var o orders.Order
	replayed, err := s.call(ctx, http.MethodPost, orderNo, "/modify", writeHeader(eventID, w), body, &o, checkOrder(&o, orderNo))
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	return orders.Result{Order: o, Replayed: replayed}, nil
}

// Exchange closes the active order orderNo as exchanged and creates its
// replacement, once per eventID, under the fence of the [orders.Write] in ctx
// (POST /orders/{no}/exchange). The replacement is numbered x.NewOrderNo,
// or [tasks.ReplacementOrderNo] of orderNo and eventID, which the store fills in
// before sending. Result.Order is the replacement as the upstream's answer
// has it.
//
// It returns the errors of [orders.Store.Exchange] as the Redis store does
// (the request checks before sending anything), and the upstream errors
// listed on [Store].
func (s *Store) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	newNo := cmp.Or(x.NewOrderNo, tasks.ReplacementOrderNo(orderNo, eventID))
	if err := orders.CheckExchange(eventID, orderNo, newNo, x); err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	if err := checkHeaderEventID(eventID); err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	body, err := json.Marshal(exchangeBody{Items: x.Items, NewOrderNo: newNo, Reason: x.Reason})
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	var o orders.Order
	replayed, err := s.call(ctx, http.MethodPost, orderNo, "/exchange", writeHeader(eventID, w), body, &o, checkOrder(&o, newNo))
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	return orders.Result{Order: o, Replayed: replayed}, nil
}

// Forward passes a change of a kind that the store has no write of its
// own for (neither Modify nor Exchange) on to the upstream, once per
// c.EventID, under the fence of the [orders.Write] in ctx: POST
// /orders/{no}/{name}, with c.Body (the payload's own members) as the
// body and the write headers. The upstream applies the kind's change.
// Result.Order is the order as the upstream's answer has it.
//
// Before sending, it returns orders.ErrNoFence without a fenced Write, and
// orders.ErrInvalid for a malformed order number, an event ID that does
// not fit a header, a name that is not one path segment (or is
// "history") and a body that is not a JSON object; then the upstream
// errors listed on [Store].
func (s *Store) Forward(ctx context.Context, c orders.Change) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err != nil {
		return orders.Result{}, fmt.Errorf("%s %s: %w", c.Name, c.OrderNo, err)
	}
	if err := checkChange(c); err != nil {
		return orders.Result{}, fmt.Errorf("%s %s: %w", c.Name, c.OrderNo, err)
	}
	var o orders.Order
	replayed, err := s.call(ctx, http.MethodPost, c.OrderNo, "/"+c.Name, writeHeader(c.EventID, w), c.Body, &o, checkOrder(&o, c.OrderNo))
	if err != nil {
		return orders.Result{}, fmt.Errorf("%s %s: %w", c.Name, c.OrderNo, err)
	}
	return orders.Result{Order: o, Replayed: replayed}, nil
}

// checkChange checks what Forward sends: the order number, the event ID,
// the name as a path segment and the body as a JSON object.
func checkChange(c orders.Change) error {
	if err := orders.CheckOrderNo(c.OrderNo); err != nil {
		return err
	}
	if err := checkHeaderEventID(c.EventID); err != nil {
		return err
	}
	if c.Name == "" || c.Name == "." || c.Name == ".." || c.Name == "history" || url.PathEscape(c.Name) != c.Name {
		return fmt.Errorf("kind name %q is not a path segment of its own: %w", c.Name, orders.ErrInvalid)
	}
	if b := bytes.TrimSpace(c.Body); len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return fmt.Errorf("the body of %s is not a JSON object: %w", c.Type, orders.ErrInvalid)
	}
	return nil
}

func checkHeaderEventID(eventID string) error {
	if !tasks.ValidEventID(eventID) {
		return fmt.Errorf("event ID %q is not 1-%d printable ASCII characters: %w", eventID, tasks.MaxEventIDLen, orders.ErrInvalid)
	}
	return nil
}

// writeHeader returns the headers of a fenced write.
func writeHeader(eventID string, w orders.Write) http.Header {
	hdr := http.Header{}
	hdr.Set(HeaderIdempotencyKey, eventID)
	hdr.Set(HeaderFencingToken, strconv.FormatInt(w.Fence, 10))
	switch {
	case w.Seq > 0 && w.SeqOutOfTurn:
		hdr.Set(HeaderSequenceCheck, strconv.FormatInt(w.Seq, 10))
	case w.Seq > 0:
		hdr.Set(HeaderSequence, strconv.FormatInt(w.Seq, 10))
	}
	setWriter(hdr, w)
	return hdr
}

// setWriter sets the worker and start time headers of w, when given.
func setWriter(hdr http.Header, w orders.Write) {
	if w.Worker != "" {
		hdr.Set(HeaderWorkerID, headerSafe(w.Worker))
	}
	if !w.StartedAt.IsZero() {
		hdr.Set(HeaderStartedAt, w.StartedAt.UTC().Format(startedAtLayout))
	}
}

// startedAtLayout is RFC 3339 with exactly microseconds, the precision of
// the order history.
const startedAtLayout = "2006-01-02T15:04:05.000000Z07:00"

// headerSafe returns s when it is printable ASCII, and s percent-encoded
// otherwise, so that it always fits a header value.
func headerSafe(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return url.PathEscape(s)
		}
	}
	return s
}

// checkOrder returns a check that the answer decoded into o is order no.
// It also normalises what JSON leaves loose: nil items and non-UTC times.
func checkOrder(o *orders.Order, no string) func() error {
	return func() error {
		if o.No != no {
			return fmt.Errorf("order %q instead of %q", o.No, no)
		}
		if o.Items == nil {
			o.Items = []orders.Item{}
		}
		o.UpdatedAt = o.UpdatedAt.UTC()
		return nil
	}
}

// call makes one API request about order orderNo with a token, and once
// more with a new token after a 401. It decodes a 2xx answer into out
// (unless out is nil), runs check (unless nil) on it, and reports whether
// the answer was a replay; any other answer is an error.
func (s *Store) call(ctx context.Context, method, orderNo, suffix string, hdr http.Header, body []byte, out any, check func() error) (bool, error) {
	target := s.orderPath(orderNo, suffix)
	tok, err := s.tokens.Get(ctx)
	if err != nil {
		return false, fmt.Errorf("token: %w", err)
	}
	ans, err := s.send(ctx, method, target, hdr, body, tok)
	if err != nil {
		return false, err
	}
	if ans.status == http.StatusUnauthorized {
		// Invalidate exactly the refused token, so that concurrent 401s
		// cause one refresh; then try once more with a new one.
		if err := s.tokens.Invalidate(ctx, tok); err != nil {
			return false, fmt.Errorf("%w; invalidate token: %w", decodeError(ans.status, ans.body, orderNo), err)
		}
		fresh, err := s.tokens.Get(ctx)
		if err != nil {
			return false, fmt.Errorf("%w; token: %w", decodeError(ans.status, ans.body, orderNo), err)
		}
		if fresh == tok {
			return false, decodeError(ans.status, ans.body, orderNo)
		}
		if ans, err = s.send(ctx, method, target, hdr, body, fresh); err != nil {
			return false, err
		}
	}
	if ans.status < 200 || ans.status > 299 {
		return false, decodeError(ans.status, ans.body, orderNo)
	}
	if out != nil {
		if err := json.Unmarshal(ans.body, out); err != nil {
			return false, badAnswer(ans.status, "undecodable answer: "+err.Error())
		}
	}
	if check != nil {
		if err := check(); err != nil {
			return false, badAnswer(ans.status, err.Error())
		}
	}
	return strings.EqualFold(strings.TrimSpace(ans.replayed), "true"), nil
}

// answer is a response, read whole.
type answer struct {
	status   int
	replayed string // the Idempotent-Replayed header
	body     []byte
}

// errTimeout is the cause of a request's own deadline.
var errTimeout = errors.New("order API timeout")

// send makes one request with tok, within the store's timeout, and reads
// the whole answer.
func (s *Store) send(ctx context.Context, method, target string, hdr http.Header, body []byte, tok string) (answer, error) {
	rctx, cancel := context.WithTimeoutCause(ctx, s.timeout, errTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(rctx, method, target, rd)
	if err != nil {
		return answer{}, fmt.Errorf("%s request: %w", method, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return answer{}, s.sendError(ctx, rctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return answer{}, s.sendError(ctx, rctx, err)
	}
	if len(b) > maxResponse {
		return answer{}, badAnswer(resp.StatusCode, fmt.Sprintf("answer longer than %d bytes", maxResponse))
	}
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(HeaderReplayed), body: b}, nil
}

// sendError classifies a failed request: the caller's context ended, the
// request's own timeout passed, or the upstream could not be reached.
func (s *Store) sendError(ctx, rctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("order API: %w", context.Cause(ctx))
	case errors.Is(context.Cause(rctx), errTimeout):
		return fmt.Errorf("%w: no answer within %v: %w", ErrUpstream, s.timeout, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: %w", ErrUpstream, err)
}

// badAnswer is the error of an answer that does not follow the API.
func badAnswer(status int, msg string) *UpstreamError {
	return &UpstreamError{StatusCode: status, Message: clean(msg, maxMessage), Err: ErrUpstream}
}

// errorBody is the API's error body.
type errorBody struct {
	Error *errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Status and ExchangedTo are set with CodeOrderClosed.
	Status      orders.Status `json:"status,omitempty"`
	ExchangedTo string        `json:"exchanged_to,omitempty"`
	// Fence is the order's newest fence, with CodeStaleFence; Seq its
	// newest applied Order-Sequence, with CodePassed (see
	// docs/upstream-order-api.md, "After a failover"). Either may come
	// with either code; 0 or absent means not told.
	Fence int64 `json:"fence,omitempty"`
	Seq   int64 `json:"seq,omitempty"`
}

// decodeError maps an answer about order orderNo that is not a success to
// an *UpstreamError. body may be anything: the API's error body, a proxy's
// HTML page, nothing.
func decodeError(status int, body []byte, orderNo string) *UpstreamError {
	e := &UpstreamError{StatusCode: status}
	var eb errorBody
	api := json.Unmarshal(body, &eb) == nil && eb.Error != nil
	if api {
		e.Code = clean(eb.Error.Code, 64)
		e.Message = clean(eb.Error.Message, maxMessage)
	}
	switch {
	case status == http.StatusNotFound && e.Code == CodeNotFound:
		e.Err = orders.ErrNotFound
	case status == http.StatusNotFound:
		e.Err = fmt.Errorf("%w: 404 without code %s: is the order API URL right?", ErrUpstream, CodeNotFound)
	case status == http.StatusConflict && e.Code == CodeStaleFence:
		e.Err = withAhead(orders.ErrStaleFence, eb.Error)
	case status == http.StatusConflict && e.Code == CodePassed:
		e.Err = withAhead(orders.ErrPassed, eb.Error)
	case status == http.StatusConflict && e.Code == CodeOrderClosed:
		ce := &orders.ClosedError{OrderNo: orderNo, Status: orders.Status(clean(string(eb.Error.Status), 32)), ExchangedTo: clean(eb.Error.ExchangedTo, tasks.MaxOrderNoLen)}
		if ce.Status == "" {
			ce.Status = orders.StatusCancelled
			if ce.ExchangedTo != "" {
				ce.Status = orders.StatusExchanged
			}
		}
		e.Err = ce
	case status == http.StatusConflict:
		e.Err = orders.ErrConflict
	case status == http.StatusBadRequest && e.Code == CodeNoFence:
		e.Err = orders.ErrNoFence
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests,
		status == http.StatusUnauthorized:
		e.Err = ErrUpstream
	case status >= 400 && status <= 499:
		e.Err = orders.ErrInvalid
	default: // 5xx, and 1xx or 3xx that the client did not handle
		e.Err = ErrUpstream
	}
	return e
}

// withAhead is err carrying what the upstream told of the order's newest
// fence and position (orders.WithNewest), so that the worker catches the
// order up with it. Values that are no fence or position (not
// positive) are not taken.
func withAhead(err error, d *errorDetail) error {
	return orders.WithNewest(err, max(d.Fence, 0), max(d.Seq, 0))
}

// clean drops control characters from s and cuts it to at most n bytes of
// valid UTF-8, so that an upstream's text is safe in a log line.
func clean(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
