package intake

import (
	"context"
	"net/http"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// maxRequestIDLen is the longest X-Request-Id taken from a request.
const maxRequestIDLen = 128

// requestInfo is what the handlers learn about a request for its access log
// line. The access log puts one in the context; the handlers fill it in.
type requestInfo struct {
	id        string
	principal string
	eventID   string
	code      string
	cause     error
}

type requestInfoKey struct{}

// requestInfoFrom returns the request's info, or a throwaway one outside the
// access log.
func requestInfoFrom(ctx context.Context) *requestInfo {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info
	}
	return &requestInfo{}
}

// requestID returns the caller's X-Request-Id when it is 1 to 128 visible
// ASCII characters, so that it is safe in logs and headers, and a new UUID
// otherwise.
func requestID(r *http.Request) string {
	id := r.Header.Get(HeaderRequestID)
	ok := id != "" && len(id) <= maxRequestIDLen
	for i := 0; ok && i < len(id); i++ {
		ok = id[i] > ' ' && id[i] < 0x7f
	}
	if ok {
		return id
	}
	return uuid.NewString()
}

// statusWriter records the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// accessLog gives each request its ID, echoed in X-Request-Id, and logs one
// line when it is answered: at debug for a successful probe, at warn for a
// 5xx (with the cause), at info otherwise. It logs no header and no body.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{id: requestID(r)}
		w.Header().Set(HeaderRequestID, info.id)
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		next.ServeHTTP(sw, r) // the mux sets r.Pattern

		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		level := zapcore.InfoLevel
		switch {
		case status >= 500:
			level = zapcore.WarnLevel
		case status < 300 && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz"):
			level = zapcore.DebugLevel
		}
		ce := s.log.Check(level, "request")
		if ce == nil {
			return
		}
		fields := []zap.Field{
			zap.String("request_id", info.id),
			zap.String("method", r.Method),
			zap.String("path", r.URL.Path),
			zap.String("route", r.Pattern),
			zap.Int("status", status),
			zap.Int64("bytes", sw.bytes),
			zap.Duration("duration", time.Since(start)),
			zap.String("remote", r.RemoteAddr),
		}
		if info.principal != "" {
			fields = append(fields, zap.String("principal", info.principal))
		}
		if info.eventID != "" {
			fields = append(fields, zap.String("event_id", info.eventID))
		}
		if info.code != "" {
			fields = append(fields, zap.String("error_code", info.code))
		}
		if info.cause != nil {
			fields = append(fields, zap.Error(info.cause))
		}
		ce.Write(fields...)
	})
}

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
		requestInfoFrom(r.Context()).principal = principal
		r2 := r.WithContext(r.Context())
		r2.Header = r.Header.Clone()
		r2.Header.Del("Authorization")
		next.ServeHTTP(w, r2)
	})
}
