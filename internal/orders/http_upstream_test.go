package orders

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"golang.org/x/oauth2"

	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/orderworker/orderworker/internal/token"
)

const (
	upClientID = "orderworker-test"
	upSecret   = "s3cret-client-secret-for-orders"
)

// refUpstream is the reference upstream of the HTTP store: an OAuth2 client
// credentials token endpoint at /oauth/token, and the order API at /api/
// served by NewHTTPHandler over a RedisStore, the oracle. The API refuses
// unknown, expired and revoked tokens with 401 and records every request.
type refUpstream struct {
	srv    *httptest.Server
	db     *redistest.DB
	oracle *RedisStore

	expiresIn  atomic.Int64 // seconds, as sent in expires_in
	issued     atomic.Int64 // tokens issued
	failTokens atomic.Bool  // answer token requests with 503
	rejectAll  atomic.Bool  // answer every API request with 401

	mu       sync.Mutex
	tokens   map[string]time.Time // token → expiry as the API sees it
	order    []string             // tokens in the order issued
	requests []apiRequest
}

// apiRequest is what the upstream saw of one API request.
type apiRequest struct {
	Method, Path   string
	Token          string
	IdempotencyKey string
	Fence          string
	Worker         string
	StartedAt      string
	Status         int
	Replayed       bool
}

func newRefUpstream(t testing.TB) *refUpstream {
	t.Helper()
	db := redistest.New(t)
	oracle, err := NewRedis(db.Client, RedisConfig{Prefix: db.Prefix})
	require.NoError(t, err)
	u := &refUpstream{db: db, oracle: oracle, tokens: make(map[string]time.Time)}
	u.expiresIn.Store(3600)
	api := http.StripPrefix("/api", NewHTTPHandler(oracle))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", u.token)
	mux.Handle("/api/", u.auth(api))
	u.srv = httptest.NewServer(mux)
	t.Cleanup(u.srv.Close)
	return u
}

// URL is the base URL of the order API.
func (u *refUpstream) URL() string { return u.srv.URL + "/api" }

func (u *refUpstream) token(w http.ResponseWriter, r *http.Request) {
	id, secret, ok := r.BasicAuth()
	switch {
	case !ok || id != upClientID || secret != upSecret:
		writeAPIJSON(w, http.StatusUnauthorized, map[string]any{"error": "invalid_client"})
		return
	case r.FormValue("grant_type") != "client_credentials":
		writeAPIJSON(w, http.StatusBadRequest, map[string]any{"error": "unsupported_grant_type"})
		return
	case u.failTokens.Load():
		writeAPIJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "temporarily_unavailable"})
		return
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	tok := "at-" + hex.EncodeToString(b[:])
	exp := u.expiresIn.Load()
	u.mu.Lock()
	u.tokens[tok] = time.Now().Add(time.Duration(exp) * time.Second)
	u.order = append(u.order, tok)
	u.mu.Unlock()
	u.issued.Add(1)
	writeAPIJSON(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": exp})
}

// auth refuses requests without a valid token and records the others.
func (u *refUpstream) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		rec := apiRequest{
			Method: r.Method, Path: r.URL.Path, Token: tok,
			IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
			Fence:          r.Header.Get(HeaderFencingToken),
			Worker:         r.Header.Get(HeaderWorkerID),
			StartedAt:      r.Header.Get(HeaderStartedAt),
		}
		sw := &statusWriter{ResponseWriter: w}
		if u.rejectAll.Load() || !u.valid(tok) {
			writeAPIJSON(sw, http.StatusUnauthorized, apiError(CodeUnauthorized, "unknown or expired token"))
		} else {
			next.ServeHTTP(sw, r)
		}
		rec.Status, rec.Replayed = sw.status, w.Header().Get(HeaderReplayed) == "true"
		u.mu.Lock()
		u.requests = append(u.requests, rec)
		u.mu.Unlock()
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (u *refUpstream) valid(tok string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	exp, ok := u.tokens[tok]
	return ok && time.Now().Before(exp)
}

// expire makes the API refuse every token issued so far, as if the
// upstream's clock ran ahead of the advertised expiry.
func (u *refUpstream) expire() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for tok := range u.tokens {
		u.tokens[tok] = time.Now().Add(-time.Second)
	}
}

// issuedTokens returns the tokens issued so far, in order.
func (u *refUpstream) issuedTokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.order...)
}

// seen returns the API requests so far, in order.
func (u *refUpstream) seen() []apiRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]apiRequest(nil), u.requests...)
}

// seenFor returns the API requests with Idempotency-Key eventID.
func (u *refUpstream) seenFor(eventID string) []apiRequest {
	var out []apiRequest
	for _, r := range u.seen() {
		if r.IdempotencyKey == eventID {
			out = append(out, r)
		}
	}
	return out
}

// tokens returns a token cache of the upstream, as a worker process has
// one, closed at cleanup.
func (u *refUpstream) tokenCache(t testing.TB) *token.Cache {
	t.Helper()
	src, err := token.ClientCredentials(token.ClientCredentialsConfig{
		TokenURL:     u.srv.URL + "/oauth/token",
		ClientID:     upClientID,
		ClientSecret: upSecret,
		Scopes:       []string{"orders"},
		AuthStyle:    oauth2.AuthStyleInHeader,
		HTTPClient:   u.srv.Client(),
	})
	require.NoError(t, err)
	c, err := token.New(u.db.NewClient(t), src, token.Config{
		Key:            u.db.Prefix + "token:{upstream}",
		LockTTL:        5 * time.Second,
		WaitTimeout:    5 * time.Second,
		FallbackMin:    10 * time.Millisecond,
		FallbackMax:    50 * time.Millisecond,
		FailureBackoff: 100 * time.Millisecond,
	}, zaptest.NewLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// store returns an HTTP store on the upstream with a token cache of its
// own.
func (u *refUpstream) store(t testing.TB, cfg HTTPConfig) *HTTPStore {
	t.Helper()
	s, err := NewHTTP(u.URL(), u.tokenCache(t), cfg)
	require.NoError(t, err)
	t.Cleanup(s.CloseIdleConnections)
	return s
}

// staticTokens is a TokenSource that always hands out the same token and
// counts its calls.
type staticTokens struct {
	tok         string
	gets        atomic.Int64
	invalidated atomic.Int64
}

func (s *staticTokens) Get(ctx context.Context) (string, error) {
	s.gets.Add(1)
	return s.tok, ctx.Err()
}

func (s *staticTokens) Invalidate(context.Context, string) error {
	s.invalidated.Add(1)
	return nil
}

// canned is an order API that answers every request with the same
// response, and counts the requests.
type canned struct {
	srv      *httptest.Server
	requests atomic.Int64
}

func newCanned(t testing.TB, status int, header http.Header, body string) *canned {
	t.Helper()
	c := &canned{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// orderJSON is the JSON of an active order no, as the API answers.
func orderJSON(no string) string {
	b, _ := json.Marshal(Order{No: no, Status: StatusActive, Items: []Item{{SKU: "a", Qty: 1}}, Version: 2, UpdatedAt: time.Now()})
	return string(b)
}
