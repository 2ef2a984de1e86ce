// Package upstreamtest is the company's upstream as the tests meet it: an
// OAuth2 token endpoint (client credentials grant) and, behind the tokens it
// issues, the order API of docs/upstream-order-api.md, over real HTTP. The
// test gives the order API's handler, usually orderapitest.NewHandler over
// a Redis store that serves as the oracle. The fake can refuse tokens, fail,
// stall and take orders down, and it records what it saw.
//
// It is test support: only _test.go files import it (the lint's depguard
// rules enforce that). It is not the reference implementation of the order
// API, which is orderapitest.NewHandler.
package upstreamtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The credentials of the one OAuth2 client the token endpoint knows, sent
// with HTTP Basic authentication.
const (
	ClientID     = "orderworker-test"
	ClientSecret = "s3cret-client-secret-do-not-log"
)

// The paths the server serves.
const (
	// TokenPath is the token endpoint: POST, form-encoded, client
	// credentials grant.
	TokenPath = "/oauth/token"
	// APIPath is where the order API is mounted (the handler sees the paths
	// below it, e.g. /orders/SO1).
	APIPath = "/api"
)

// Server is the fake upstream. Its exported fields are safe to set and read
// while it serves; its methods are safe for concurrent use.
type Server struct {
	// ExpiresIn is the expires_in, in seconds, of the tokens issued from
	// now on. New sets it to 3600.
	ExpiresIn atomic.Int64
	// Issued counts the tokens issued.
	Issued atomic.Int64
	// TokenRequests counts the requests that reached the token endpoint.
	TokenRequests atomic.Int64
	// FailTokens makes the token endpoint answer 503
	// temporarily_unavailable.
	FailTokens atomic.Bool
	// RejectAll makes the order API refuse every request with 401, whatever
	// its token.
	RejectAll atomic.Bool
	// TokenStarted receives a value for each request that reaches the token
	// endpoint, while its buffer (1000) has room; it never blocks the server.
	TokenStarted chan struct{}

	srv *httptest.Server
	api http.Handler

	mu       sync.Mutex
	tokens   map[string]time.Time // token → expiry as the API sees it
	order    []string             // tokens in the order issued
	scopes   []string             // the scope asked for, per token issued
	revoked  map[string]bool
	down     map[string]bool
	gate     chan struct{} // when not nil, token requests wait for it to close
	onIssue  func()        // runs before each token is issued
	requests []Request
}

// Request is what the order API saw of one request, and how it answered.
type Request struct {
	Method string
	// Path is the request's path, with APIPath.
	Path string
	// Token is the Bearer token it carried ("" without one).
	Token string
	// Header is the request's header.
	Header http.Header
	// Body is the request's body, its first 1 MiB.
	Body []byte
	// Status is the answer's status; Response its header.
	Status   int
	Response http.Header
}

// maxBody is the most of a request's body a Request records.
const maxBody = 1 << 20

// New starts the upstream, stopped at the test's cleanup. api serves the
// order API under APIPath (with the prefix stripped) to requests with a
// valid token; when api is nil, every such request is answered 200 "ok", as
// any protected endpoint would.
func New(t testing.TB, api http.Handler) *Server {
	t.Helper()
	s := &Server{
		TokenStarted: make(chan struct{}, 1000),
		api:          api,
		tokens:       make(map[string]time.Time),
		revoked:      make(map[string]bool),
		down:         make(map[string]bool),
	}
	if s.api == nil {
		s.api = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	}
	s.ExpiresIn.Store(3600)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+TokenPath, s.token)
	mux.Handle(APIPath+"/", s.auth(http.StripPrefix(APIPath, s.api)))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.Unblock) // runs before srv.Close, which waits for the blocked requests
	return s
}

// URL is the server's root URL.
func (s *Server) URL() string { return s.srv.URL }

// APIURL is the order API's base URL, for ORDER_API_URL.
func (s *Server) APIURL() string { return s.srv.URL + APIPath }

// TokenURL is the token endpoint's URL, for TOKEN_URL.
func (s *Server) TokenURL() string { return s.srv.URL + TokenPath }

// Client returns an HTTP client for the server.
func (s *Server) Client() *http.Client { return s.srv.Client() }

func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	s.TokenRequests.Add(1)
	select {
	case s.TokenStarted <- struct{}{}:
	default:
	}
	id, secret, ok := r.BasicAuth()
	switch {
	case !ok || id != ClientID || secret != ClientSecret:
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "invalid_client"})
		return
	case r.FormValue("grant_type") != "client_credentials":
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "unsupported_grant_type"})
		return
	}
	s.mu.Lock()
	gate, onIssue := s.gate, s.onIssue
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if s.FailTokens.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "temporarily_unavailable"})
		return
	}
	if onIssue != nil {
		onIssue()
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	tok := "at-" + hex.EncodeToString(b[:])
	exp := s.ExpiresIn.Load()
	s.mu.Lock()
	s.tokens[tok] = time.Now().Add(time.Duration(exp) * time.Second)
	s.order = append(s.order, tok)
	s.scopes = append(s.scopes, r.FormValue("scope"))
	s.mu.Unlock()
	s.Issued.Add(1)
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": exp})
}

// auth refuses requests without a valid token, answers 503 for the orders
// that are down, and records every request.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		rec := Request{Method: r.Method, Path: r.URL.Path, Token: tok, Header: r.Header.Clone()}
		// The body is read for the record (up to maxBody bytes) and handed
		// on whole.
		if r.Body != nil {
			rec.Body, _ = io.ReadAll(io.LimitReader(r.Body, maxBody))
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(rec.Body), r.Body), r.Body}
		}
		// The request is recorded as its answer starts, before any of it
		// reaches the client: a caller that has the answer finds the
		// record.
		sw := &statusWriter{ResponseWriter: w, answer: func(status int) {
			rec.Status, rec.Response = status, w.Header().Clone()
			s.mu.Lock()
			s.requests = append(s.requests, rec)
			s.mu.Unlock()
		}}
		// "", "api", "orders", no, ...
		parts := strings.Split(r.URL.Path, "/")
		switch {
		case s.RejectAll.Load() || !s.Valid(tok):
			writeJSON(sw, http.StatusUnauthorized, apiError("unauthorized", "unknown or expired token"))
		case len(parts) > 3 && parts[2] == "orders" && s.isDown(parts[3]):
			writeJSON(sw, http.StatusServiceUnavailable, apiError("internal", "order database down"))
		default:
			next.ServeHTTP(sw, r)
		}
		sw.start(http.StatusOK) // a handler that wrote nothing answers 200
	})
}

// statusWriter calls answer with the status of an answer, once, as the
// answer starts: before the header is written.
type statusWriter struct {
	http.ResponseWriter
	answer  func(status int)
	started bool
}

func (w *statusWriter) start(status int) {
	if !w.started {
		w.started = true
		w.answer(status)
	}
}

func (w *statusWriter) WriteHeader(code int) {
	w.start(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.start(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

func apiError(code, msg string) map[string]any {
	return map[string]any{"error": map[string]string{"code": code, "message": msg}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Valid reports whether the order API accepts tok now: issued, not expired
// and not revoked.
func (s *Server) Valid(tok string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.tokens[tok]
	return ok && !s.revoked[tok] && time.Now().Before(exp)
}

// Revoke makes the order API refuse tok.
func (s *Server) Revoke(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoked[tok] = true
}

// Expire makes the order API refuse every token issued so far, as if the
// upstream's clock ran ahead of the advertised expiry.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok := range s.tokens {
		s.tokens[tok] = time.Now().Add(-time.Second)
	}
}

// Down makes the order API answer 503 to every request about order no.
func (s *Server) Down(no string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[no] = true
}

func (s *Server) isDown(no string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[no]
}

// Block makes token requests wait until Unblock (or the end of the test).
func (s *Server) Block() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// Unblock lets the waiting and later token requests through.
func (s *Server) Unblock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// OnIssue sets a function that runs before each token is issued (nil for
// none).
func (s *Server) OnIssue(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onIssue = f
}

// Tokens returns the tokens issued so far, in order.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// Scopes returns the scope parameter of each token request that was
// issued a token, in order.
func (s *Server) Scopes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.scopes)
}

// Requests returns the order API requests so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// RequestsWith returns the order API requests whose header key had value.
func (s *Server) RequestsWith(key, value string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Header.Get(key) == value {
			out = append(out, r)
		}
	}
	return out
}

// Call sends GET APIPath/ with tok and returns the answer's status: 401
// when the API refuses the token.
func (s *Server) Call(t testing.TB, tok string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.APIURL()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	return res.StatusCode
}
