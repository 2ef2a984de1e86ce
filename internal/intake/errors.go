package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/tasks"
)

// The error codes of the API; see the package documentation.
const (
	codeMalformedBody    = "malformed_body"
	codeRequestTimeout   = "request_timeout"
	codeInvalidField     = "invalid_field"
	codeInvalidParameter = "invalid_parameter"
	codeKeyRequired      = "idempotency_key_required"
	codeKeyMismatch      = "idempotency_key_mismatch"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeDuplicate        = "duplicate"
	codeBodyTooLarge     = "body_too_large"
	codeUnsupportedMedia = "unsupported_media_type"
	codeKeyReused        = "idempotency_key_reused"
	codeRateLimited      = "rate_limited"
	codeBacklogFull      = "backlog_full"
	codeUnavailable      = "unavailable"
)

const mediaTypeJSON = "application/json"

// The messages of a 503: an enqueue may be retried only with the same key.
const (
	msgUnavailable         = "the queue store is unavailable; retry later with the same Idempotency-Key"
	msgUnavailableReadOnly = "the store is unavailable; retry later"
)

// apiError is an answer other than 2xx: what the client sees, and the cause
// for the access log.
type apiError struct {
	status  int
	code    string
	message string
	field   string
	// cause is logged, never sent: the Redis error behind a 503, the read
	// error behind a 408 (which names the connection's addresses).
	cause error
	// existing describes the task behind a 409 or 422.
	existing *existingTask
}

// existingTask is the task that holds a refused event's ID.
type existingTask struct {
	TaskID  string `json:"task_id"`
	Queue   string `json:"queue"`
	EventID string `json:"event_id"`
	// State is sent with a 409 only.
	State string `json:"state,omitempty"`
}

// errorBody is the JSON of every answer other than 2xx.
type errorBody struct {
	Error errorDetail `json:"error"`
	*existingTask
}

// errorDetail is the "error" member of an errorBody.
type errorDetail struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Field     string `json:"field,omitempty"`
	RequestID string `json:"request_id"`
}

// badParameter is a 400 for a malformed path or query parameter or header.
func badParameter(field, message string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: codeInvalidParameter, field: field, message: message}
}

// badOrderNo is the 400 of a malformed order number in the path.
func badOrderNo() *apiError {
	return badParameter("order_no", fmt.Sprintf(
		"the order number in the path must be 1 to %d characters of A-Z, a-z, 0-9, '_' and '-'", tasks.MaxOrderNoLen))
}

// unavailable is a 503 caused by err.
func unavailable(message string, err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: message, cause: err}
}

// payloadError turns an error of package tasks into a 400: invalid_field when
// a field is at fault, malformed_body otherwise.
func payloadError(err error) *apiError {
	var fe *tasks.FieldError
	if errors.As(err, &fe) {
		return &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: fe.Field, message: fe.Error()}
	}
	return &apiError{status: http.StatusBadRequest, code: codeMalformedBody, message: err.Error()}
}

// writeError sends e with the headers its status calls for, and notes its
// code and cause for the access log.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	info := httpserve.InfoFrom(r.Context())
	info.Code, info.Cause = e.code, e.cause
	h := w.Header()
	switch e.status {
	case http.StatusUnauthorized:
		for _, c := range s.challenges {
			h.Add("WWW-Authenticate", c)
		}
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(s.cfg.RetryAfter.Seconds()))))
	case http.StatusRequestTimeout:
		// The rest of the body may still come; the connection cannot be
		// reused (RFC 9110, 15.5.9).
		h.Set("Connection", "close")
	}
	writeJSON(w, e.status, errorBody{
		Error:        errorDetail{Code: e.code, Message: e.message, Field: e.field, RequestID: info.ID},
		existingTask: e.existing,
	})
}

// writeJSON sends v as JSON with the given status. Answers are never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // an API, not a page: keep "<key>" readable
	if err := enc.Encode(v); err != nil {
		// Unreachable: every value sent is made of strings, numbers, times
		// and slices of them.
		status = http.StatusInternalServerError
		b.Reset()
		b.WriteString(`{"error":{"code":"internal","message":"could not encode the answer"}}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", mediaTypeJSON)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
