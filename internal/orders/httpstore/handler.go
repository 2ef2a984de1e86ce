package httpstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/orderworker/orderworker/worker/orders"
)

// maxRequest is the largest request body [NewHandler] reads.
const maxRequest = 1 << 20

// NewHandler returns the reference server of the upstream order API
// (docs/upstream-order-api.md) over store: it serves the API's routes at
// the root (mount it elsewhere with http.StripPrefix), turns the
// Fencing-Token, Order-Sequence, X-Worker-Id and X-Work-Started-At headers
// into an [orders.Write]
// and the Idempotency-Key into the event ID, and the store's errors into
// the API's statuses and error bodies. Over the Redis store (redisstore) it is the
// upstream that [Store] is tested against, and a starting point for an
// order team.
//
// It does not authenticate (wrap it in a handler that checks the Bearer
// token), reads request bodies of up to 1 MiB, and rejects unknown JSON
// fields. Error messages carry the store's error text. It is safe for
// concurrent use if store is.
func NewHandler(store Backend) http.Handler {
	h := &apiHandler{store: store}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders/{no}", h.get)
	mux.HandleFunc("GET /orders/{no}/history", h.history)
	mux.HandleFunc("PUT /orders/{no}", h.put)
	mux.HandleFunc("POST /orders/{no}/modify", h.modify)
	mux.HandleFunc("POST /orders/{no}/exchange", h.exchange)
	return mux
}

// Backend is the store that [NewHandler] serves: one that reads, puts,
// modifies and exchanges.
type Backend interface {
	orders.Store
	orders.Modifier
	orders.Exchanger
}

type apiHandler struct {
	store Backend
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

func (h *apiHandler) modify(w http.ResponseWriter, r *http.Request) {
	serveWrite(w, r, func(ctx context.Context, eventID, no string, b modifyBody) (orders.Result, error) {
		return h.store.Modify(ctx, eventID, no, orders.Changes(b))
	})
}

func (h *apiHandler) exchange(w http.ResponseWriter, r *http.Request) {
	serveWrite(w, r, func(ctx context.Context, eventID, no string, b exchangeBody) (orders.Result, error) {
		return h.store.Exchange(ctx, eventID, no, orders.Exchange(b))
	})
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
	eventID = r.Header.Get(HeaderIdempotencyKey)
	if eventID == "" {
		return nil, "", fmt.Errorf("no %s header: %w", HeaderIdempotencyKey, orders.ErrInvalid)
	}
	wr, err := writerOf(r)
	if err != nil {
		return nil, "", err
	}
	v := r.Header.Get(HeaderFencingToken)
	if wr.Fence, err = strconv.ParseInt(v, 10, 64); err != nil || wr.Fence <= 0 {
		return nil, "", fmt.Errorf("%s %q is not a positive decimal int64: %w", HeaderFencingToken, v, orders.ErrNoFence)
	}
	seq, check := r.Header.Get(HeaderSequence), r.Header.Get(HeaderSequenceCheck)
	name := HeaderSequence
	switch {
	case seq != "" && check != "":
		return nil, "", fmt.Errorf("both %s and %s: %w", HeaderSequence, HeaderSequenceCheck, orders.ErrInvalid)
	case check != "":
		seq, name, wr.SeqOutOfTurn = check, HeaderSequenceCheck, true
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
	wr := orders.Write{Worker: r.Header.Get(HeaderWorkerID)}
	if v := r.Header.Get(HeaderStartedAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return orders.Write{}, fmt.Errorf("%s %q is not an RFC 3339 time: %w", HeaderStartedAt, v, orders.ErrInvalid)
		}
		wr.StartedAt = t
	}
	return wr, nil
}

// readAPIBody decodes the request's JSON body into v, or answers 400.
func readAPIBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequest))
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
		writeAPIJSON(w, status, apiError(CodeInvalid, "request body: "+err.Error()))
		return false
	}
	return true
}

func writeAPIResult(w http.ResponseWriter, res orders.Result) {
	if res.Replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeAPIJSON(w, http.StatusOK, res.Order)
}

// writeHeaderError answers 400 for bad or missing headers.
func writeHeaderError(w http.ResponseWriter, err error) {
	code := CodeInvalid
	if errors.Is(err, orders.ErrNoFence) {
		code = CodeNoFence
	}
	writeAPIJSON(w, http.StatusBadRequest, apiError(code, err.Error()))
}

// writeAPIError answers with the status and error body of err.
func writeAPIError(w http.ResponseWriter, err error) {
	var ce *orders.ClosedError
	switch {
	case errors.As(err, &ce):
		b := apiError(CodeOrderClosed, err.Error())
		b.Error.Status, b.Error.ExchangedTo = ce.Status, ce.ExchangedTo
		writeAPIJSON(w, http.StatusConflict, b)
	case errors.Is(err, orders.ErrStaleFence):
		writeAPIJSON(w, http.StatusConflict, apiError(CodeStaleFence, err.Error()))
	case errors.Is(err, orders.ErrPassed):
		writeAPIJSON(w, http.StatusConflict, apiError(CodePassed, err.Error()))
	case errors.Is(err, orders.ErrConflict):
		writeAPIJSON(w, http.StatusConflict, apiError(CodeConflict, err.Error()))
	case errors.Is(err, orders.ErrNotFound):
		writeAPIJSON(w, http.StatusNotFound, apiError(CodeNotFound, err.Error()))
	case errors.Is(err, orders.ErrNoFence):
		writeAPIJSON(w, http.StatusBadRequest, apiError(CodeNoFence, err.Error()))
	case errors.Is(err, orders.ErrInvalid):
		writeAPIJSON(w, http.StatusUnprocessableEntity, apiError(CodeInvalid, err.Error()))
	default:
		writeAPIJSON(w, http.StatusInternalServerError, apiError(CodeInternal, err.Error()))
	}
}

func apiError(code, msg string) errorBody {
	return errorBody{Error: &errorDetail{Code: code, Message: msg}}
}

func writeAPIJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
