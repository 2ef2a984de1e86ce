package httpstore

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"golang.org/x/oauth2"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/internal/token"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// newOracle returns a Redis store on the test's own Redis prefix.
func newOracle(t testing.TB) *redisstore.Store {
	t.Helper()
	db := redistest.New(t)
	s, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	return s
}

// baseFence is a realistic fence: microseconds from a clock.
var baseFence = time.Now().UnixMicro()

// refUpstream is the reference upstream of the HTTP store: the fake
// upstream (upstreamtest) serving orderapitest.NewHandler over a Redis store, the
// oracle.
type refUpstream struct {
	*upstreamtest.Server
	db     *redistest.DB
	oracle *redisstore.Store
}

func newRefUpstream(t testing.TB) *refUpstream {
	t.Helper()
	return newRefUpstreamOf(t, func(oracle *redisstore.Store) http.Handler { return orderapitest.NewHandler(oracle) })
}

// newRefUpstreamOf is newRefUpstream serving the handler api makes of the
// oracle.
func newRefUpstreamOf(t testing.TB, api func(oracle *redisstore.Store) http.Handler) *refUpstream {
	t.Helper()
	db := redistest.New(t)
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	return &refUpstream{Server: upstreamtest.New(t, api(oracle)), db: db, oracle: oracle}
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

func apiRequestOf(r upstreamtest.Request) apiRequest {
	return apiRequest{
		Method: r.Method, Path: r.Path, Token: r.Token,
		IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
		Fence:          r.Header.Get(HeaderFencingToken),
		Worker:         r.Header.Get(HeaderWorkerID),
		StartedAt:      r.Header.Get(HeaderStartedAt),
		Status:         r.Status,
		Replayed:       r.Response.Get(HeaderReplayed) == "true",
	}
}

// seen returns the API requests so far, in order.
func (u *refUpstream) seen() []apiRequest {
	var out []apiRequest
	for _, r := range u.Requests() {
		out = append(out, apiRequestOf(r))
	}
	return out
}

// seenFor returns the API requests with Idempotency-Key eventID.
func (u *refUpstream) seenFor(eventID string) []apiRequest {
	var out []apiRequest
	for _, r := range u.RequestsWith(HeaderIdempotencyKey, eventID) {
		out = append(out, apiRequestOf(r))
	}
	return out
}

// tokenCache returns a token cache of the upstream, as a worker process
// has one, closed at cleanup.
func (u *refUpstream) tokenCache(t testing.TB) *token.Cache {
	t.Helper()
	src, err := token.ClientCredentials(token.ClientCredentialsConfig{
		TokenURL:     u.TokenURL(),
		ClientID:     upstreamtest.ClientID,
		ClientSecret: upstreamtest.ClientSecret,
		Scopes:       []string{"orders"},
		AuthStyle:    oauth2.AuthStyleInHeader,
		HTTPClient:   u.Client(),
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
func (u *refUpstream) store(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(u.APIURL(), u.tokenCache(t), cfg)
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
	b, _ := json.Marshal(orders.Order{No: no, Status: orders.StatusActive, Items: []orders.Item{{SKU: "a", Qty: 1}}, Version: 2, UpdatedAt: time.Now()})
	return string(b)
}

// postWrite sends h a write of event evt-1 under fence 1 to path with
// body, as the HTTP store would, and returns the answer.
func postWrite(t testing.TB, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, strings.NewReader(body))
	req.Header.Set(HeaderIdempotencyKey, "evt-1")
	req.Header.Set(HeaderFencingToken, "1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
