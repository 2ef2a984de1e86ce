// Package orderapitest is the reference server of the upstream order API
// (docs/upstream-order-api.md) over an order store: the upstream that the
// HTTP order store (internal/orders/httpstore) is tested against, with a
// Redis store behind it as the oracle, and a starting point for an order
// team. It speaks the API from the document, not from the client's code:
// it shares no constant or type with httpstore, so the two are held
// together by the tests that run one against the other.
//
// The handler keeps a log of every write it received, accepted or refused
// ([Handler.Log]), for a checker of what the store accepted
// (tools/stress/history).
//
// It is test support: only _test.go files and the lab (tools/stress, which
// serves it in process) import it (the lint's depguard rules enforce
// that), and no binary of the product ships it.
package orderapitest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// The headers of docs/upstream-order-api.md that the server reads and
// writes.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerFencingToken   = "Fencing-Token"
	headerSequence       = "Order-Sequence"
	headerSequenceCheck  = "Order-Sequence-Check"
	headerWorkerID       = "X-Worker-Id"
	headerStartedAt      = "X-Work-Started-At"
	headerReplayed       = "Idempotent-Replayed"
)

// The error codes of docs/upstream-order-api.md, in the error body
// {"error": {"code": ..., "message": ...}}.
const (
	codeInvalid     = "invalid"
	codeNoFence     = "no_fence"
	codeNotFound    = "not_found"
	codeStaleFence  = "stale_fence"
	codePassed      = "passed"
	codeOrderClosed = "order_closed"
	codeConflict    = "conflict"
	codeInternal    = "internal"
)

// The bodies of docs/upstream-order-api.md.
type (
	historyBody struct {
		Entries []orders.Entry `json:"entries"`
	}
	// modifyBody converts to orders.Changes and exchangeBody to
	// orders.Exchange, so a field added there fails to compile until it is
	// added here.
	modifyBody struct {
		Address *string       `json:"address,omitempty"`
		Remark  *string       `json:"remark,omitempty"`
		Items   []orders.Item `json:"items,omitempty"`
	}
	exchangeBody struct {
		Items      []orders.Item `json:"items"`
		NewOrderNo string        `json:"new_order_no"`
		Reason     string        `json:"reason,omitempty"`
	}
	errorBody struct {
		Error *errorDetail `json:"error"`
	}
	errorDetail struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		// Status and ExchangedTo are set with codeOrderClosed.
		Status      orders.Status `json:"status,omitempty"`
		ExchangedTo string        `json:"exchanged_to,omitempty"`
		// Fence is the order's newest fence, with codeStaleFence; Seq
		// its newest applied Order-Sequence, with codePassed.
		Fence int64 `json:"fence,omitempty"`
		Seq   int64 `json:"seq,omitempty"`
	}
)

// MaxRequest is the largest request body [NewHandler] reads: 1 MiB.
const MaxRequest = 1 << 20

// NewHandler returns the reference server of the upstream order API
// (docs/upstream-order-api.md) over store: it serves the API's routes at
// the root (mount it elsewhere with http.StripPrefix), turns the
// Fencing-Token, Order-Sequence, X-Worker-Id and X-Work-Started-At headers
// into an [orders.Write] and the Idempotency-Key into the event ID, and
// the store's errors into the API's statuses and error bodies. Over the
// Redis store (redisstore) it is the upstream that httpstore.Store is
// tested against.
//
// It serves the write endpoint of each write store implements (such as
// orders.Modifier for POST /orders/{no}/modify), found by type assertion
// as worker.KindsFor finds a store's kinds; the endpoint of a write store
// lacks is an unknown path, a bare 404 (which the HTTP store reads as a
// wrong URL, not as a missing order). So a test store implements only the
// writes it is asked for.
//
// Every other kind of kinds (worker.Kinds() when none are given) whose
// write store implements, or that store forwards (orders.Forwarder: then
// modify and exchange too, when store lacks their writes), gets the API's
// endpoint of a forwarded change,
// POST /orders/{no}/{name}: its body (the payload's own members) is
// decoded and validated as the kind's payload, and the kind's handler
// runs on store (worker.Kind.Apply) under the headers' fence. Its answer
// is the order as the write left it, with Idempotent-Replayed when the
// write left the order's version as it was (only a replay does: every
// applied write bumps it).
//
// It applies one write (a PUT or a POST of a write endpoint) at a time,
// after reading its body, and logs each ([Handler.Log]), so that the
// log's order is the order in which the store accepted them. A write
// waiting for its turn whose request ends is answered 500 internal and
// logged as refused. Reads are not serialized, nor logged.
//
// It does not authenticate (wrap it in a handler that checks the Bearer
// token), reads request bodies of up to 1 MiB, and rejects unknown JSON
// fields. Error messages carry the store's error text. It is safe for
// concurrent use if store is.
func NewHandler(store orders.Store, kinds ...worker.Kind) *Handler {
	h := &Handler{api: &apiHandler{store: store}, turn: make(chan struct{}, 1), now: time.Now}
	mux := http.NewServeMux()
	h.mux = mux
	mux.HandleFunc("GET /orders/{no}", h.api.get)
	mux.HandleFunc("GET /orders/{no}/history", h.api.history)
	h.handleWrite("PUT /orders/{no}", KindPut, h.api.put)
	own := map[string]bool{} // the kinds whose route of the API is served
	own[KindModify] = handleWrite(h, store, "POST /orders/{no}/modify", KindModify,
		func(s orders.Modifier, ctx context.Context, eventID, no string, b modifyBody) (orders.Result, error) {
			return s.Modify(ctx, eventID, no, orders.Changes(b))
		})
	own[KindExchange] = handleWrite(h, store, "POST /orders/{no}/exchange", KindExchange,
		func(s orders.Exchanger, ctx context.Context, eventID, no string, b exchangeBody) (orders.Result, error) {
			return s.Exchange(ctx, eventID, no, orders.Exchange(b))
		})
	if len(kinds) == 0 {
		kinds = worker.Kinds()
	}
	for _, k := range kinds {
		if k.Kind == nil || own[k.Kind.Name] || k.Check(store) != nil {
			continue
		}
		h.handleWrite("POST /orders/{no}/"+k.Kind.Name, k.Kind.Name, func(w http.ResponseWriter, r *http.Request) {
			h.api.forwarded(w, r, k)
		})
	}
	return h
}

// The kinds of write a [Record] names besides a forwarded kind's name.
const (
	// KindPut is PUT /orders/{no}.
	KindPut = "put"
	// KindModify is POST /orders/{no}/modify.
	KindModify = "modify"
	// KindExchange is POST /orders/{no}/exchange.
	KindExchange = "exchange"
)

// MaxLog is the most records a [Handler] keeps: 1,048,576. Past it, a
// write is still served but not logged, and [Log.Dropped] counts it.
const MaxLog = 1 << 20

// Handler is the reference server that [NewHandler] returns: an
// http.Handler of the order API with a log of the writes it received.
// Its methods are safe for concurrent use.
type Handler struct {
	mux *http.ServeMux
	api *apiHandler
	// turn is the one write that is applied at a time (a token taken
	// by sending, given back by receiving): the log's order is the
	// store's order of acceptance.
	turn chan struct{}
	now  func() time.Time

	mu      sync.Mutex
	log     []Record
	dropped int
}

var _ http.Handler = (*Handler)(nil)

// Record is one write the handler received, as it received it and as it
// answered. The header fields are the raw headers' values read as far as
// they parse (0 or empty when a header is missing or malformed: a refusal
// says which).
type Record struct {
	// At is when the request reached the handler.
	At time.Time
	// OrderNo is the path's order number.
	OrderNo string
	// Kind is KindPut, KindModify, KindExchange or the name of a
	// forwarded kind (POST /orders/{no}/{name}).
	Kind string
	// EventID is the Idempotency-Key; empty for a put.
	EventID string
	// Fence is the Fencing-Token; 0 for a put.
	Fence int64
	// Worker is X-Worker-Id: with Fence, it names the lock's hold the
	// write was made in.
	Worker string
	// StartedAt is X-Work-Started-At.
	StartedAt time.Time
	// Seq is the position of Order-Sequence, or of Order-Sequence-Check
	// when SeqCheck is set: checked, not recorded.
	Seq      int64
	SeqCheck bool
	// Body is the request's body, its first MaxRequest bytes.
	Body json.RawMessage
	// Status is the answer's status: 200 (204 for a put) when the write
	// was accepted.
	Status int
	// Code is the error code of a refusal; empty when accepted.
	Code string
	// Replayed says an accepted write was answered as a repeat
	// (Idempotent-Replayed): nothing was applied.
	Replayed bool
	// Order is the order an accepted write answered with (for an
	// exchange, the replacement); zero for a put and a refusal.
	Order orders.Order
}

// Accepted says the write was accepted (a 2xx answer).
func (r Record) Accepted() bool { return r.Status >= 200 && r.Status <= 299 }

// Log is a copy of a [Handler]'s log.
type Log struct {
	// Records are the writes in the order the handler answered them,
	// which is the order the store accepted them in.
	Records []Record
	// Dropped counts the writes served past MaxLog and not logged.
	Dropped int
}

// Log returns a copy of every write logged so far. The Body and Items of
// each record are shared with the handler's log and must not be
// modified.
func (h *Handler) Log() Log {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Log{Records: append([]Record(nil), h.log...), Dropped: h.dropped}
}

// ServeHTTP serves the order API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// handleWrite serves pattern with serve, one write at a time, logging
// each as a write of kind.
func (h *Handler) handleWrite(pattern, kind string, serve http.HandlerFunc) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		rec := recordOf(r, kind, h.now())
		// The body is read before the write's turn, so that a slow
		// client holds back no other write.
		body, _ := io.ReadAll(io.LimitReader(r.Body, MaxRequest+1))
		rec.Body = json.RawMessage(body[:min(len(body), MaxRequest)])
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &recorder{ResponseWriter: w}
		select {
		case h.turn <- struct{}{}:
		case <-r.Context().Done():
			writeAPIError(rw, fmt.Errorf("waiting for the write's turn: %w", context.Cause(r.Context())))
			h.append(rec, rw)
			return
		}
		defer func() { <-h.turn }()
		serve(rw, r)
		h.append(rec, rw)
	})
}

// append logs rec as rw answered it.
func (h *Handler) append(rec Record, rw *recorder) {
	rec.Status, rec.Code, rec.Replayed = cmp.Or(rw.status, http.StatusOK), rw.code, rw.replayed
	if rec.Accepted() && rec.Kind != KindPut {
		rec.Order = rw.order
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.log) >= MaxLog {
		h.dropped++
		return
	}
	h.log = append(h.log, rec)
}

// recordOf reads the write headers of r into a Record, as far as they
// parse.
func recordOf(r *http.Request, kind string, at time.Time) Record {
	rec := Record{At: at, OrderNo: r.PathValue("no"), Kind: kind,
		EventID: r.Header.Get(headerIdempotencyKey), Worker: r.Header.Get(headerWorkerID)}
	rec.Fence, _ = strconv.ParseInt(r.Header.Get(headerFencingToken), 10, 64)
	rec.StartedAt, _ = time.Parse(time.RFC3339Nano, r.Header.Get(headerStartedAt))
	seq := r.Header.Get(headerSequence)
	if check := r.Header.Get(headerSequenceCheck); check != "" && seq == "" {
		seq, rec.SeqCheck = check, true
	}
	rec.Seq, _ = strconv.ParseInt(seq, 10, 64)
	return rec
}

// recorder is the ResponseWriter of a logged write: it keeps the status,
// the error code, Idempotent-Replayed and the order answered.
type recorder struct {
	http.ResponseWriter
	status   int
	code     string
	replayed bool
	order    orders.Order
}

func (rw *recorder) WriteHeader(status int) {
	if rw.status == 0 {
		rw.status = status
	}
	rw.ResponseWriter.WriteHeader(status)
}

// forwarded serves the endpoint of a kind that the API has no route of
// its own for, as the HTTP store forwards it (orders.Forwarder): the body
// is the payload's own members, the headers give the event ID and the
// order number comes from the path. It runs the kind's handler on the
// store under the write headers' fence, and answers with the order as the
// write left it, with Idempotent-Replayed when the write left its version
// as it was (every applied write bumps it; only a replay does not).
func (h *apiHandler) forwarded(w http.ResponseWriter, r *http.Request, k worker.Kind) {
	var body json.RawMessage
	if !readAPIBody(w, r, &body) {
		return
	}
	p, err := k.Kind.Decode(body)
	if err == nil && p.Header() != (tasks.Header{}) {
		err = errors.New("the body carries members of the task's header (event_id, order_no, seq, trace)")
	}
	if err != nil {
		writeAPIJSON(w, http.StatusBadRequest, apiError(codeInvalid, "request body: "+err.Error()))
		return
	}
	ctx, eventID, err := writeContext(r)
	if err != nil {
		writeHeaderError(w, err)
		return
	}
	no := r.PathValue("no")
	p = p.WithHeader(tasks.Header{EventID: eventID, OrderNo: no})
	if err := p.Validate(); err != nil {
		writeAPIError(w, fmt.Errorf("%w: %w", err, orders.ErrInvalid))
		return
	}
	before, err := h.store.Get(ctx, no)
	if err != nil && !errors.Is(err, orders.ErrNotFound) {
		writeAPIError(w, err)
		return
	}
	if err := k.Apply(ctx, h.store, p); err != nil {
		writeAPIError(w, err)
		return
	}
	after, err := h.store.Get(ctx, no)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeAPIResult(w, orders.Result{Order: after, Replayed: after.Version == before.Version})
}

// handleWrite serves the write endpoint pattern (of kind) with write when
// store implements S, the write's interface (such as orders.Modifier),
// and leaves pattern unknown otherwise. It reports whether it serves
// pattern.
func handleWrite[S, B any](h *Handler, store orders.Store, pattern, kind string,
	write func(s S, ctx context.Context, eventID, no string, b B) (orders.Result, error)) bool {
	s, ok := store.(S)
	if !ok {
		return false
	}
	h.handleWrite(pattern, kind, func(w http.ResponseWriter, r *http.Request) {
		serveWrite(w, r, func(ctx context.Context, eventID, no string, b B) (orders.Result, error) {
			return write(s, ctx, eventID, no, b)
		})
	})
	return true
}

type apiHandler struct {
	store orders.Store
}

func (h *apiHandler) get(w http.ResponseWriter, r *http.Request) {
	o, err := h.store.Get(r.Context(), r.PathValue("no"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeAPIJSON(w, http.StatusOK, o)
}

func (h *apiHandler) history(w http.ResponseWriter, r *http.Request) {
	entries, err := orders.AllHistory(r.Context(), h.store, r.PathValue("no"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeAPIJSON(w, http.StatusOK, historyBody{Entries: entries})
}

func (h *apiHandler) put(w http.ResponseWriter, r *http.Request) {
	var o orders.Order
	if !readAPIBody(w, r, &o) {
		return
	}
	no := r.PathValue("no")
	if o.No != "" && o.No != no {
		writeAPIError(w, fmt.Errorf("body names order %q, path %q: %w", o.No, no, orders.ErrInvalid))
		return
	}
	o.No = no
	ctx := r.Context()
	if wr, err := writerOf(r); err != nil {
		writeHeaderError(w, err)
		return
	} else if wr.Worker != "" || !wr.StartedAt.IsZero() {
		ctx = orders.WithWrite(ctx, wr)
	}
	if err := h.store.Put(ctx, o); err != nil {
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serveWrite serves a write endpoint: it reads the body B, then the write
// headers, calls write with them and the path's order number, and answers
// with its result or its error.
func serveWrite[B any](w http.ResponseWriter, r *http.Request, write func(ctx context.Context, eventID, no string, b B) (orders.Result, error)) {
	var b B
	if !readAPIBody(w, r, &b) {
		return
	}
	ctx, eventID, err := writeContext(r)
	if err != nil {
		writeHeaderError(w, err)
		return
	}
	res, err := write(ctx, eventID, r.PathValue("no"), b)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeAPIResult(w, res)
}

func writeContext(r *http.Request) (ctx context.Context, eventID string, err error) {
	eventID = r.Header.Get(headerIdempotencyKey)
	if eventID == "" {
		return nil, "", fmt.Errorf("no %s header: %w", headerIdempotencyKey, orders.ErrInvalid)
	}
	wr, err := writerOf(r)
	if err != nil {
		return nil, "", err
	}
	v := r.Header.Get(headerFencingToken)
	if wr.Fence, err = strconv.ParseInt(v, 10, 64); err != nil || wr.Fence <= 0 {
		return nil, "", fmt.Errorf("%s %q is not a positive decimal int64: %w", headerFencingToken, v, orders.ErrNoFence)
	}
	seq, check := r.Header.Get(headerSequence), r.Header.Get(headerSequenceCheck)
	name := headerSequence
	switch {
	case seq != "" && check != "":
		return nil, "", fmt.Errorf("both %s and %s: %w", headerSequence, headerSequenceCheck, orders.ErrInvalid)
	case check != "":
		seq, name, wr.SeqOutOfTurn = check, headerSequenceCheck, true
	}
	if seq != "" {
		if wr.Seq, err = strconv.ParseInt(seq, 10, 64); err != nil || wr.Seq <= 0 {
			return nil, "", fmt.Errorf("%s %q is not a positive decimal int64: %w", name, seq, orders.ErrInvalid)
		}
	}
	return orders.WithWrite(r.Context(), wr), eventID, nil
}

// writerOf returns the worker and start time headers as an orders.Write without a
// fence.
func writerOf(r *http.Request) (orders.Write, error) {
	wr := orders.Write{Worker: r.Header.Get(headerWorkerID)}
	if v := r.Header.Get(headerStartedAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return orders.Write{}, fmt.Errorf("%s %q is not an RFC 3339 time: %w", headerStartedAt, v, orders.ErrInvalid)
		}
		wr.StartedAt = t
	}
	return wr, nil
}

// readAPIBody decodes the request's JSON body into v, or answers 400.
func readAPIBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequest))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON value")
	}
	if err != nil {
		status := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			status = http.StatusRequestEntityTooLarge
		}
		writeAPIJSON(w, status, apiError(codeInvalid, "request body: "+err.Error()))
		return false
	}
	return true
}

func writeAPIResult(w http.ResponseWriter, res orders.Result) {
	if res.Replayed {
		w.Header().Set(headerReplayed, "true")
	}
	if rw, ok := w.(*recorder); ok {
		rw.replayed, rw.order = res.Replayed, res.Order
	}
	writeAPIJSON(w, http.StatusOK, res.Order)
}

// writeHeaderError answers 400 for bad or missing headers.
func writeHeaderError(w http.ResponseWriter, err error) {
	code := codeInvalid
	if errors.Is(err, orders.ErrNoFence) {
		code = codeNoFence
	}
	writeAPIJSON(w, http.StatusBadRequest, apiError(code, err.Error()))
}

// writeAPIError answers with the status and error body of err.
func writeAPIError(w http.ResponseWriter, err error) {
	var ce *orders.ClosedError
	switch {
	case errors.As(err, &ce):
		b := apiError(codeOrderClosed, err.Error())
		b.Error.Status, b.Error.ExchangedTo = ce.Status, ce.ExchangedTo
		writeAPIJSON(w, http.StatusConflict, b)
	case errors.Is(err, orders.ErrStaleFence):
		// The order's newest fence and newest position, so that a worker
		// whose Redis failed over and lost them moves above them.
		b := apiError(codeStaleFence, err.Error())
		b.Error.Fence, _ = orders.Newest(err)
		writeAPIJSON(w, http.StatusConflict, b)
	case errors.Is(err, orders.ErrPassed):
		b := apiError(codePassed, err.Error())
		_, b.Error.Seq = orders.Newest(err)
		writeAPIJSON(w, http.StatusConflict, b)
	case errors.Is(err, orders.ErrConflict):
		writeAPIJSON(w, http.StatusConflict, apiError(codeConflict, err.Error()))
	case errors.Is(err, orders.ErrNotFound):
		writeAPIJSON(w, http.StatusNotFound, apiError(codeNotFound, err.Error()))
	case errors.Is(err, orders.ErrNoFence):
		writeAPIJSON(w, http.StatusBadRequest, apiError(codeNoFence, err.Error()))
	case errors.Is(err, orders.ErrInvalid):
		writeAPIJSON(w, http.StatusUnprocessableEntity, apiError(codeInvalid, err.Error()))
	default:
		writeAPIJSON(w, http.StatusInternalServerError, apiError(codeInternal, err.Error()))
	}
}

func apiError(code, msg string) errorBody {
	return errorBody{Error: &errorDetail{Code: code, Message: msg}}
}

func writeAPIJSON(w http.ResponseWriter, status int, v any) {
	if b, ok := v.(errorBody); ok {
		if rw, ok := w.(*recorder); ok {
			rw.code = b.Error.Code
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
