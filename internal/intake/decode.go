package intake

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/orderworker/orderworker/tasks"
)

// readBody reads the body of an enqueue: a JSON media type (or none) and at
// most MaxBody bytes. A body that does not arrive within the server's read
// timeout is a 408; one that cannot be read otherwise, a 400.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || !(mt == mediaTypeJSON || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
			return nil, &apiError{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMedia, field: "Content-Type",
				message: "the body must be JSON, with Content-Type: application/json"}
		}
	}
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge,
		message: fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBody)}
	if r.ContentLength > s.cfg.MaxBody {
		return nil, tooLarge
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	var mbe *http.MaxBytesError
	var ne net.Error
	// A read error names the connection's addresses: it goes to the log
	// (the cause), never to the client.
	switch {
	case err == nil:
		return b, nil
	case errors.As(err, &mbe):
		return nil, tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return nil, &apiError{status: http.StatusRequestTimeout, code: codeRequestTimeout, cause: err,
			message: "the body did not arrive within the server's read timeout; retry with the same Idempotency-Key"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, &apiError{status: http.StatusBadRequest, code: codeMalformedBody, cause: err,
			message: "could not read the body: it ended before its announced length"}
	default:
		return nil, &apiError{status: http.StatusBadRequest, code: codeMalformedBody, cause: err,
			message: "could not read the body: its transfer encoding is malformed or the connection failed"}
	}
}

// decodePayload makes the payload of a task of kind k from the order
// number in the path, the values of the Idempotency-Key header and the
// body: it decodes body strictly, fills in the order number from the path
// and the event ID from the header, and validates the result. The error is
// always a 400; a malformed order number is reported as the path's
// (invalid_parameter). On success the payload is valid, its order_no is
// orderNo and its event_id is the header's key or, without one, the body's.
func decodePayload(k *tasks.Kind, orderNo string, keys []string, body []byte) (tasks.Payload, *apiError) {
	key, hasKey, aerr := idempotencyKey(keys)
	if aerr != nil {
		return nil, aerr
	}
	p, err := k.Decode(body)
	if err != nil {
		return nil, payloadError(err)
	}
	h := p.Header()
	switch {
	case h.OrderNo != "" && h.OrderNo != orderNo:
		return nil, &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: "order_no",
			message: "order_no: the body's order_no, when given, must equal the order number in the path"}
	case h.Seq != 0:
		return nil, &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: "seq",
			message: "seq: the position is handed out when the change is accepted; leave it out"}
	case h.Trace != nil:
		return nil, &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: "trace",
			message: "trace: the trace context comes from the traceparent and tracestate headers; leave it out"}
	case hasKey && h.EventID != "" && h.EventID != key:
		return nil, &apiError{status: http.StatusBadRequest, code: codeKeyMismatch, field: "event_id",
			message: "event_id: the body's event_id, when given, must equal the Idempotency-Key header"}
	case hasKey:
		h.EventID = key
	case h.EventID == "":
		return nil, &apiError{status: http.StatusBadRequest, code: codeKeyRequired, field: HeaderIdempotencyKey,
			message: "an event ID is required, in the Idempotency-Key header or the body's event_id"}
	}
	h.OrderNo = orderNo
	p = p.WithHeader(h)
	// One validation of the whole payload, the path's order number
	// included: the body's order_no, when given, equals it.
	var fe *tasks.FieldError
	if err := p.Validate(); errors.As(err, &fe) && fe.Field == "order_no" {
		return nil, badOrderNo()
	} else if err != nil {
		return nil, payloadError(err)
	}
	return p, nil
}

// idempotencyKey reads the Idempotency-Key header from its values: absent,
// or exactly one valid event ID, bare or as a structured-field string
// (RFC 8941) in double quotes.
func idempotencyKey(values []string) (key string, ok bool, _ *apiError) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, badParameter(HeaderIdempotencyKey, "the Idempotency-Key header must be given once")
	}
	key = strings.TrimSpace(values[0])
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		unquoted, ok := unquoteSFString(key)
		if !ok {
			return "", false, badParameter(HeaderIdempotencyKey,
				`the Idempotency-Key header is quoted but is not a valid structured-field string`)
		}
		key = unquoted
	}
	if !tasks.ValidEventID(key) {
		return "", false, badParameter(HeaderIdempotencyKey, "the Idempotency-Key header must be "+tasks.EventIDRule)
	}
	return key, true, nil
}

// unquoteSFString decodes a structured-field string (RFC 8941 section
// 3.3.3): printable ASCII in double quotes, in which only `"` and `\` are
// escaped, with a backslash.
func unquoteSFString(s string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
