package intake

import (
	"net/http"

	"github.com/orderworker/orderworker/internal/httpserve"
)

// authenticate passes a request on only with a valid API key, and without
// its Authorization header; others get 401. The key check is httpauth's
// Bearer scheme (constant-time, every key compared); the intake answers the
// refusal itself so that its body has the API's error shape.
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.auth == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal, ok := s.auth.Authenticate(r)
		if !ok {
			s.writeError(w, r, &apiError{status: http.StatusUnauthorized, code: codeUnauthorized,
				message: "a valid API key is required: Authorization: Bearer <key>"})
			return
		}
		httpserve.InfoFrom(r.Context()).Principal = principal
		r2 := r.WithContext(r.Context())
		r2.Header = r.Header.Clone()
		r2.Header.Del("Authorization")
		next.ServeHTTP(w, r2)
	})
}
