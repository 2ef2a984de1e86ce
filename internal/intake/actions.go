package intake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderops"
)

// The error codes of the admin routes.
const (
	codeForbidden     = "forbidden"
	codeActionRefused = "action_refused"
)

// maxActionBody bounds the body of an action: {"reason": "..."}.
const maxActionBody = 4 << 10

// adminPrincipal is the principal of the admin key at the 1-based position
// n of AdminKeys: "admin#N", apart from the enqueue keys' "key#N".
func adminPrincipal(enqueuePrincipal string) string {
	return "admin#" + strings.TrimPrefix(enqueuePrincipal, "key#")
}

// authorizeAdmin passes a request to an admin route on only with one of
// AdminKeys (the principal is then "admin#N"); a valid enqueue key gets
// 403, anything else 401. Without keys at all (InsecureNoAuth) every
// caller may act, as "anonymous".
func (s *Server) authorizeAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal := "anonymous"
		if s.auth != nil {
			p, ok := "", false
			if s.admin != nil {
				p, ok = s.admin.Authenticate(r)
			}
			if !ok {
				if _, enqueue := s.auth.Authenticate(r); enqueue {
					s.writeError(w, r, &apiError{status: http.StatusForbidden, code: codeForbidden,
						message: "this API key may enqueue and read, not act on orders: use a key of INTAKE_ADMIN_KEYS"})
					return
				}
				s.writeError(w, r, &apiError{status: http.StatusUnauthorized, code: codeUnauthorized,
					message: "a valid admin API key is required: Authorization: Bearer <key>"})
				return
			}
			principal = adminPrincipal(p)
		}
		httpserve.InfoFrom(r.Context()).Principal = principal
		r2 := r.WithContext(r.Context())
		r2.Header = r.Header.Clone()
		r2.Header.Del("Authorization")
		next.ServeHTTP(w, r2)
	})
}

// actionRequest is the body of an action.
type actionRequest struct {
	// Reason is why; required for skip and hold.
	Reason string `json:"reason"`
}

// postAction performs the operator action of the path on the order's head
// (orderops), as the admin key's principal.
func (s *Server) postAction(w http.ResponseWriter, r *http.Request) {
	no, aerr := orderNo(r)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	a, ok := orderops.ParseAction(r.PathValue("action"))
	if !ok {
		s.writeError(w, r, badParameter("action", "the action must be one of retry, skip, hold and resume"))
		return
	}
	var req actionRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxActionBody))
	if err != nil {
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeMalformedBody, cause: err,
			message: fmt.Sprintf("could not read the body (at most %d bytes)", maxActionBody)})
		return
	}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || dec.More() {
			s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeMalformedBody,
				message: `the body must be one JSON object: {"reason": "..."}`})
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	by := httpserve.InfoFrom(r.Context()).Principal
	res, err := s.ops.Do(ctx, a, orderops.Request{OrderNo: no, By: by, Reason: req.Reason})
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, orderops.ErrInvalid):
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: "reason", message: err.Error()})
	case errors.Is(err, orderops.ErrRefused):
		s.writeError(w, r, &apiError{status: http.StatusConflict, code: codeActionRefused, message: err.Error()})
	default:
		s.writeError(w, r, unavailable(msgUnavailableReadOnly, err))
	}
}
