// Package httpserve is what orderworker's HTTP servers (the intake, the
// dashboard, the worker's ops port) share: an http.Server with timeouts that
// shuts down gracefully when its context ends, and one access log line per
// request, with a request ID.
//
// It is for cmd/* and the HTTP packages they serve; it knows no routes, no
// authentication and no settings names.
package httpserve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orderworker/orderworker/internal/logging"
)

// The defaults of [Config].
const (
	DefaultReadTimeout     = 10 * time.Second
	DefaultWriteTimeout    = 30 * time.Second
	DefaultIdleTimeout     = 2 * time.Minute
	DefaultShutdownTimeout = 25 * time.Second
)

// Config holds a server's timeouts. A zero field means its default.
type Config struct {
	// ReadTimeout bounds reading a request, headers and body. Defaults to 10s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time from the end of the request headers to
	// the end of the answer. Defaults to 30s.
	WriteTimeout time.Duration
	// IdleTimeout is how long an idle keep-alive connection stays open.
	// Defaults to 2m.
	IdleTimeout time.Duration
	// ShutdownTimeout is how long Serve lets requests in flight finish once
	// its context ends. Defaults to 25s.
	ShutdownTimeout time.Duration
	// MaxHeaderBytes bounds the request headers. Defaults to 64 KiB.
	MaxHeaderBytes int
}

// Serve serves h on ln until ctx ends, then stops accepting connections and
// waits up to cfg.ShutdownTimeout for the requests in flight before it closes
// what is left. It returns nil after a clean shutdown, the server's error if
// it stops serving by itself, and a shutdown error if requests were cut off.
// It closes ln. When ln is on every interface ([EveryInterface]: an
// address without a host, such as ":8080", or 0.0.0.0 or ::), it logs a
// warning first, with the address, so that a port open beyond the host is
// a decision that shows in the log.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, cfg Config, log *zap.Logger) error {
	if EveryInterface(ln.Addr()) {
		log.Warn("listening on every interface: anyone who reaches this host on the port reaches the server (a host in the address, such as 127.0.0.1:PORT, narrows it)",
			zap.String("addr", ln.Addr().String()))
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(cfg.ReadTimeout, DefaultReadTimeout),
		ReadTimeout:       cmp.Or(cfg.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      cmp.Or(cfg.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    cmp.Or(cfg.MaxHeaderBytes, 64<<10),
		ErrorLog:          zap.NewStdLog(log.Named("server")),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	timeout := cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	log.Info("shutting down", zap.Duration("timeout", timeout))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown %s: %w", ln.Addr(), err)
	}
	log.Info("stopped")
	return nil
}

// EveryInterface reports whether a listener's address a is on every
// interface of the host (0.0.0.0, ::), rather than on one address such as
// the loopback: what a server started on ":8080" does. The servers'
// defaults are loopback; a process logs this at start, and [Serve] warns
// of it, so that an open port is a decision that shows.
func EveryInterface(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && (tcp.IP == nil || tcp.IP.IsUnspecified())
}

// HeaderRequestID carries a request's ID, in requests and in answers.
const HeaderRequestID = "X-Request-Id"

// maxRequestIDLen is the longest X-Request-Id taken from a request.
const maxRequestIDLen = 128

// RequestID returns the request's X-Request-Id when it is 1 to 128 visible
// ASCII characters, so that it is safe in logs and headers, and a new UUID
// otherwise.
func RequestID(r *http.Request) string {
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

// Info is what the handlers of a request tell its access log line. AccessLog
// puts one in the request's context; handlers fill it in through InfoFrom.
// It is not safe for concurrent use: one request's handlers run in turn.
type Info struct {
	ID        string // the request ID, set by AccessLog
	Principal string // who is authenticated (a user name or "key#N"), never a secret
	EventID   string // the event the request is about, if any
	Code      string // the API's error code, if any
	Cause     error  // the cause of a 5xx, logged at warn
	// Quiet logs the line at debug: a request refused without a look, of
	// a flood that would otherwise fill the log.
	Quiet bool
	// Trace is the request's span, when a handler started one below
	// AccessLog: the log line carries its trace_id and span_id.
	Trace trace.SpanContext
}

type infoKey struct{}

// InfoFrom returns the request's Info, or a throwaway one outside AccessLog.
func InfoFrom(ctx context.Context) *Info {
	if info, ok := ctx.Value(infoKey{}).(*Info); ok {
		return info
	}
	return &Info{}
}

// quiet are paths whose successful answers are logged at debug: probes and
// scrapes, which would drown the rest.
var quiet = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// MaxLoggedLen is the longest method and path an access log line holds,
// in bytes: a longer one is cut at a UTF-8 boundary and ends with
// "...(N bytes)", N its whole length. A request's line may be 64 KiB long
// (its headers' limit); its log line stays about a kilobyte.
const MaxLoggedLen = 256

// clip returns s, or its first MaxLoggedLen bytes at most, cut at a UTF-8
// boundary, with its length, when it is longer.
func clip(s string) string {
	if len(s) <= MaxLoggedLen {
		return s
	}
	i := MaxLoggedLen
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// AccessLog gives each request its ID, echoed in X-Request-Id, and logs one
// line on log when it is answered: request_id, method and path (never the
// query; each cut at [MaxLoggedLen] bytes), route, status, bytes, duration,
// remote, and what the handlers put in the Info. A successful probe or
// scrape and a request the Info marks Quiet are logged at debug, a 5xx at
// warn, the rest at info. It logs no header (so no user agent) and no
// body, so no credential.
func AccessLog(log *zap.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &Info{ID: RequestID(r)}
		w.Header().Set(HeaderRequestID, info.ID)
		sw := &statusWriter{ResponseWriter: w}
		orig := r
		r = r.WithContext(context.WithValue(r.Context(), infoKey{}, info))
		next.ServeHTTP(sw, r) // a mux below sets r.Pattern
		// A middleware around this one (otelhttp, naming its span) reads
		// the route from its own request.
		orig.Pattern = r.Pattern

		status := cmp.Or(sw.status, http.StatusOK)
		level := zapcore.InfoLevel
		switch {
		case status >= 500:
			level = zapcore.WarnLevel
		case info.Quiet, status < 300 && quiet[r.URL.Path]:
			level = zapcore.DebugLevel
		}
		ce := log.Check(level, "request")
		if ce == nil {
			return
		}
		fields := []zap.Field{
			zap.String("request_id", info.ID),
			zap.String("method", clip(r.Method)),
			zap.String("path", clip(r.URL.Path)),
			zap.String("route", r.Pattern),
			zap.Int("status", status),
			zap.Int64("bytes", sw.bytes),
			zap.Duration("duration", time.Since(start)),
			zap.String("remote", r.RemoteAddr),
		}
		if info.Principal != "" {
			fields = append(fields, zap.String("principal", info.Principal))
		}
		if info.EventID != "" {
			fields = append(fields, zap.String("event_id", info.EventID))
		}
		if info.Code != "" {
			fields = append(fields, zap.String("error_code", info.Code))
		}
		if info.Cause != nil {
			fields = append(fields, zap.Error(info.Cause))
		}
		ctx := r.Context()
		if info.Trace.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, info.Trace)
		}
		fields = append(fields, logging.TraceFields(ctx)...)
		ce.Write(fields...)
	})
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
