package token

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

	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

const (
	testClientID = "orderworker-test"
	testSecret   = "s3cret-client-secret-value"
)

// upstream is a real OAuth2 upstream over HTTP: a client credentials token
// endpoint at /token and a protected endpoint at /api that refuses expired,
// revoked and unknown tokens.
type upstream struct {
	srv       *httptest.Server
	expiresIn atomic.Int64 // seconds, as sent in expires_in
	issued    atomic.Int64 // tokens issued
	requests  atomic.Int64 // token requests that reached the handler
	fail      atomic.Bool  // answer token requests with 503
	started   chan struct{}

	mu      sync.Mutex
	tokens  map[string]time.Time // token → expiry
	order   []string             // tokens in the order issued
	revoked map[string]bool
	gate    chan struct{} // when not nil, token requests wait for it to close
	onIssue func()        // runs before each token is issued
}

func newUpstream(t testing.TB, expiresIn int64) *upstream {
	t.Helper()
	u := &upstream{
		started: make(chan struct{}, 1000),
		tokens:  make(map[string]time.Time),
		revoked: make(map[string]bool),
	}
	u.expiresIn.Store(expiresIn)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", u.token)
	mux.HandleFunc("GET /api", u.api)
	u.srv = httptest.NewServer(mux)
	t.Cleanup(u.srv.Close)
	t.Cleanup(func() { u.unblock() }) // runs before srv.Close
	return u
}

func (u *upstream) token(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	select {
	case u.started <- struct{}{}:
	default:
	}
	id, secret, ok := r.BasicAuth()
	if !ok || id != testClientID || secret != testSecret {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "invalid_client"})
		return
	}
	if r.FormValue("grant_type") != "client_credentials" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "unsupported_grant_type"})
		return
	}
	u.mu.Lock()
	gate, onIssue := u.gate, u.onIssue
	u.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if u.fail.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "temporarily_unavailable"})
		return
	}
	if onIssue != nil {
		onIssue()
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
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": exp})
}

func (u *upstream) api(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !u.valid(tok) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// valid reports whether the upstream would accept tok now.
func (u *upstream) valid(tok string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	exp, ok := u.tokens[tok]
	return ok && !u.revoked[tok] && time.Now().Before(exp)
}

// call calls the protected endpoint with tok and returns the status code.
func (u *upstream) call(t testing.TB, tok string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u.srv.URL+"/api", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := u.srv.Client().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	return res.StatusCode
}

func (u *upstream) revoke(tok string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.revoked[tok] = true
}

// block makes token requests wait until unblock.
func (u *upstream) block() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gate == nil {
		u.gate = make(chan struct{})
	}
}

func (u *upstream) unblock() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gate != nil {
		close(u.gate)
		u.gate = nil
	}
}

func (u *upstream) setOnIssue(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.onIssue = f
}

func (u *upstream) issuedTokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.order...)
}

// source returns a new client credentials Source for the upstream, as one
// replica would have.
func (u *upstream) source(t testing.TB) Source {
	t.Helper()
	return u.sourceWith(t, testSecret)
}

func (u *upstream) sourceWith(t testing.TB, secret string) Source {
	t.Helper()
	src, err := ClientCredentials(ClientCredentialsConfig{
		TokenURL:     u.srv.URL + "/token",
		ClientID:     testClientID,
		ClientSecret: secret,
		Scopes:       []string{"orders"},
		AuthStyle:    oauth2.AuthStyleInHeader,
		HTTPClient:   u.srv.Client(),
	})
	require.NoError(t, err)
	return src
}

// waitStarted waits until a token request reaches the upstream.
func (u *upstream) waitStarted(t testing.TB, limit time.Duration) {
	t.Helper()
	select {
	case <-u.started:
	case <-time.After(limit):
		t.Fatalf("no token request within %v", limit)
	}
}

// testKey is the token key of a test, under its prefix.
func testKey(db *redistest.DB) string { return db.Prefix + "token:{upstream}" }

// newReplica returns a Cache on a Redis client of its own (as a separate
// process would have), closed at cleanup. An empty cfg.Key means testKey.
func newReplica(t testing.TB, db *redistest.DB, src Source, cfg Config, log *zap.Logger) *Cache {
	t.Helper()
	if cfg.Key == "" {
		cfg.Key = testKey(db)
	}
	c, err := New(db.NewClient(t), src, cfg, log)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// fast is a config scaled down for tests.
func fast() Config {
	return Config{
		LockTTL:        5 * time.Second,
		WaitTimeout:    10 * time.Second,
		FallbackMin:    10 * time.Millisecond,
		FallbackMax:    50 * time.Millisecond,
		FailureBackoff: 100 * time.Millisecond,
	}
}

// waitFor polls cond until it holds or the limit passes.
func waitFor(t testing.TB, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		<-tick.C
	}
}

// clock is a settable clock for Config.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// countHook counts the round trips a client makes.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// noFetch is a Source for tests where the Cache must not fetch.
func noFetch(t testing.TB) Source {
	return SourceFunc(func(context.Context) (Token, error) {
		t.Errorf("unexpected fetch from the source")
		return Token{}, context.Canceled
	})
}
