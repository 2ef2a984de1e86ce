package intake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderops"
)

// The error codes of the admin routes.
const (
	codeForbidden     = "forbidden"
	codeActionRefused = "action_refused"
)

// adminPrincipal is the principal of the admin key at the 1-based position
// N of AdminKeys: "admin#N", apart from the enqueue keys' "key#N". It names
// the key in the audit trail (the notes, the sequence log, the access log)
// without showing it.
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

// postAction performs the operator action of the path on the order's head
// (orderops), as the admin key's principal. The body is decoded strictly
// (orderops.DecodeBody): an unknown or repeated field is a 400.
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
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, orderops.MaxBodyLen))
	if err != nil {
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeMalformedBody, cause: err,
			message: fmt.Sprintf("could not read the body (at most %d bytes)", orderops.MaxBodyLen)})
		return
	}
	body, err := orderops.DecodeBody(raw)
	if err != nil {
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeMalformedBody, message: strings.TrimPrefix(err.Error(), "orderops: ")})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	by := httpserve.InfoFrom(r.Context()).Principal
	res, err := s.ops.Do(ctx, a, orderops.Request{OrderNo: no, By: by, Reason: body.Reason})
	var rl *orderops.RateLimitError
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.As(err, &rl):
		secs := int64(rl.RetryAfter / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		s.writeError(w, r, &apiError{status: http.StatusTooManyRequests, code: codeRateLimited,
			message: fmt.Sprintf("this admin key's operator actions are rate limited; retry in %d s", secs)})
	case errors.Is(err, orderops.ErrInvalid):
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, code: codeInvalidField, field: "reason", message: err.Error()})
	case errors.Is(err, orderops.ErrRefused):
		s.writeError(w, r, &apiError{status: http.StatusConflict, code: codeActionRefused, message: err.Error()})
	case errors.Is(err, orderops.ErrNotAllowed):
		s.writeError(w, r, unavailable("this intake's Redis user may not act on orders: run it as the intake-admin user", err))
	default:
		s.writeError(w, r, unavailable(msgUnavailableReadOnly, err))
	}
}
