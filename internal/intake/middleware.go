package intake

import (
	"cmp"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/tracing"
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

// trace makes the request a server span ("<METHOD> <route>", otelhttp)
// that continues the caller's trace, when a TracerProvider is set, and
// hands the span's context to the access log line. It wraps a route's own
// handler, inside the authentication and the rate limit: a refused request
// starts no span and continues no caller's trace.
func (s *Server) trace(next http.Handler) http.Handler {
	if s.cfg.TracerProvider == nil {
		return next
	}
	return otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpserve.InfoFrom(r.Context()).Trace = trace.SpanContextFromContext(r.Context())
		next.ServeHTTP(w, r)
	}), "intake",
		otelhttp.WithTracerProvider(tracing.LimitStartAttributes(s.cfg.TracerProvider, 0)),
		otelhttp.WithPropagators(tracing.Propagator),
		// "POST /v1/orders/{order_no}/modify": the mux matched the route.
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return cmp.Or(r.Pattern, r.Method) }))
}
