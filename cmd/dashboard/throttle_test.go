package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/testkit/fakeclock"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// clientFrom returns an HTTP client whose connections come from the
// loopback address ip (Linux answers on all of 127.0.0.0/8), so that tests
// can be several clients of the throttle.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// send sends a GET of url with a, over c.
func send(t *testing.T, c *http.Client, url string, a auth) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	a(req)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}
}

// answer is what send read of a response: its status and headers (the body
// is read and closed).
type answer struct {
	StatusCode int
	Header     http.Header
}

// TestLoginThrottle checks the throttle over a real socket with a clock the
// test moves: a client may fail 3 times, then gets 429 with Retry-After for
// bad credentials and none; the right password still gets in, up to the
// grace checks (graceBurst, then one per graceEvery), past which every
// request gets 429 unchecked; it may fail once more each period; other
// clients and requests without credentials are not slowed down; and a
// success counts for nothing.
func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	core, logs := observer.New(zap.WarnLevel)
	throttle := newLoginThrottle(3, 10*time.Second, 100, clock.Now, zap.New(core))
	scheme, err := httpauth.Basic(realm, testUser, testPassword)
	require.NoError(t, err)
	checked := &countingScheme{Scheme: scheme}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := httptest.NewServer(throttle.guard(checked, httpauth.Require(throttle.scheme(scheme))(ok)))
	t.Cleanup(srv.Close)

	a, b := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")
	good, bad := basicAuth(testUser, testPassword), basicAuth(testUser, "wrong-password-1")

	for range 5 {
		assert.Equal(t, http.StatusOK, send(t, a, srv.URL, good).StatusCode, "successes are never counted")
	}
	for i := range 3 {
		assert.Equal(t, http.StatusUnauthorized, send(t, a, srv.URL, bad).StatusCode, "failure %d", i+1)
	}
	for _, cred := range []auth{bad, noAuth} {
		resp := send(t, a, srv.URL, cred)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "10", resp.Header.Get("Retry-After"))
		assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	}
	assert.Equal(t, 1, logs.FilterMessageSnippet("failed logins throttled").Len(), "logged once, when it starts")
	assert.Equal(t, "127.0.0.1", logs.All()[0].ContextMap()["client"])

	// The right password gets in while the client has grace checks (the
	// bad one above took one of them); past them, 429 unchecked.
	for i := range graceBurst - 1 {
		assert.Equal(t, http.StatusOK, send(t, a, srv.URL, good).StatusCode, "grace check %d", i+2)
	}
	before := checked.n.Load()
	for _, cred := range []auth{good, bad} {
		resp := send(t, a, srv.URL, cred)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "10", resp.Header.Get("Retry-After"))
	}
	assert.Equal(t, before, checked.n.Load(), "no credential is checked past the grace checks")
	clock.Add(graceEvery)
	assert.Equal(t, http.StatusOK, send(t, a, srv.URL, good).StatusCode, "one grace check more each graceEvery")
	assert.Equal(t, http.StatusTooManyRequests, send(t, a, srv.URL, good).StatusCode)

	// Another client is not slowed down, nor requests without credentials.
	assert.Equal(t, http.StatusOK, send(t, b, srv.URL, good).StatusCode)
	for range 10 {
		assert.Equal(t, http.StatusUnauthorized, send(t, b, srv.URL, noAuth).StatusCode)
	}
	assert.Equal(t, http.StatusUnauthorized, send(t, b, srv.URL, bad).StatusCode)

	// Time passes: the Retry-After shrinks, then one more failure is
	// allowed, and the next waits a whole period.
	clock.Add(2 * time.Second)
	assert.Equal(t, "6", send(t, a, srv.URL, noAuth).Header.Get("Retry-After"))
	clock.Add(6 * time.Second)
	assert.Equal(t, http.StatusUnauthorized, send(t, a, srv.URL, bad).StatusCode)
	resp := send(t, a, srv.URL, noAuth)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "10", resp.Header.Get("Retry-After"))
	clock.Add(10 * time.Second)
	assert.Equal(t, http.StatusOK, send(t, a, srv.URL, good).StatusCode, "the right password works once it may try again")
}

// countingScheme counts the credentials the guard checks itself.
type countingScheme struct {
	httpauth.Scheme
	n atomic.Int64
}

func (s *countingScheme) Authenticate(r *http.Request) (string, bool) {
	s.n.Add(1)
	return s.Scheme.Authenticate(r)
}

// TestLoginThrottleConcurrent sends many failing requests at once: no more
// of them are checked than the client has tries, the rest get 429.
func TestLoginThrottleConcurrent(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	throttle := newLoginThrottle(3, time.Minute, 100, clock.Now, zap.NewNop())
	scheme, err := httpauth.Basic(realm, testUser, testPassword)
	require.NoError(t, err)
	release := make(chan struct{})
	slow := &blockingScheme{Scheme: scheme, release: release}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := httptest.NewServer(throttle.guard(slow, httpauth.Require(throttle.scheme(slow))(ok)))
	t.Cleanup(srv.Close)

	const n = 30
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		c := clientFrom(t, "127.0.0.1")
		wg.Go(func() {
			// No require here: it may not stop the test from another
			// goroutine. An error counts as status -1.
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
			if err != nil {
				statuses <- -1
				return
			}
			req.SetBasicAuth(testUser, "wrong-"+strconv.Itoa(i))
			resp, err := c.Do(req)
			if err != nil {
				statuses <- -1
				return
			}
			_ = resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	// The 27 without a try are answered while the 3 with one, and the
	// graceBurst that got a grace check, are still being checked; the
	// grace checks fail, with 429.
	counts := map[int]int{}
	for range n - 3 - graceBurst {
		counts[<-statuses]++
	}
	close(release)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		counts[s]++
	}
	assert.Equal(t, map[int]int{http.StatusUnauthorized: 3, http.StatusTooManyRequests: n - 3}, counts)
}

// blockingScheme checks credentials once release is closed.
type blockingScheme struct {
	httpauth.Scheme
	release chan struct{}
}

func (s *blockingScheme) Authenticate(r *http.Request) (string, bool) {
	<-s.release
	return s.Scheme.Authenticate(r)
}

// TestLoginThrottleIsBounded checks that the throttle remembers at most its
// maximum of clients, forgetting the one that failed longest ago.
func TestLoginThrottleIsBounded(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	throttle := newLoginThrottle(1, time.Minute, 3, clock.Now, zap.NewNop())
	fail := func(c string) { throttle.take(c) }
	for _, c := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		fail(c)
		assert.Positive(t, throttle.wait(c), c)
	}
	fail("10.0.0.2") // now the most recent
	fail("10.0.0.4")
	assert.Len(t, throttle.clients, 3)
	assert.Equal(t, 3, throttle.lru.Len())
	assert.Zero(t, throttle.wait("10.0.0.1"), "the oldest is forgotten")
	for _, c := range []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"} {
		assert.Positive(t, throttle.wait(c), c)
	}
	for i := range 1000 {
		fail("10.1.0." + strconv.Itoa(i))
	}
	assert.Len(t, throttle.clients, 3)
}

func TestClientOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ remote, want string }{
		{"192.0.2.7:5123", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:5123", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:443", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:443", "fe80::/64"},
		{"not an address", "not an address"},
	} {
		r := &http.Request{RemoteAddr: tt.remote}
		assert.Equal(t, tt.want, clientOf(r), tt.remote)
	}
}

// TestDashboardThrottlesFailedLogins checks the dashboard's own throttle
// over real sockets: after loginFailBurst failures a client gets 429 with
// Retry-After on the UI, the API and /metrics for bad credentials; the
// right ones still get in, up to its grace checks; /metrics, whose count
// is its own, still takes the scraper's token however many grace checks
// the UI used; and another client logs in.
func TestDashboardThrottlesFailedLogins(t *testing.T) {
	db := redistest.New(t)
	d := startDashboard(t, testEnv(db))
	attacker, other := clientFrom(t, "127.0.0.3"), clientFrom(t, "127.0.0.4")
	for i := range loginFailBurst {
		a := basicAuth(testUser, "guess-number-"+strconv.Itoa(i))
		if i%2 == 1 {
			a = bearerAuth("guessed-token-0123456789-" + strconv.Itoa(i))
		}
		assert.Equal(t, http.StatusUnauthorized, send(t, attacker, d.base+"/api/queues", a).StatusCode, "failure %d", i+1)
	}
	paths := []string{"/", "/api/queues", "/orders", "/blocked-orders", "/blocked-orders.json"}
	require.Len(t, paths, graceBurst, "one grace check for each")
	for _, p := range paths {
		assert.Equal(t, http.StatusOK, send(t, attacker, d.base+p, basicAuth(testUser, testPassword)).StatusCode, "%s: the right password gets in", p)
	}
	for _, p := range paths {
		resp := send(t, attacker, d.base+p, basicAuth(testUser, testPassword))
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: past the grace checks", p)
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		require.NoError(t, err, p)
		assert.True(t, secs >= 1 && secs <= int(loginFailEvery/time.Second), "Retry-After %d", secs)
	}
	for range 2 * graceBurst {
		assert.Equal(t, http.StatusOK, send(t, attacker, d.base+"/metrics", bearerAuth(testMetricsToken)).StatusCode,
			"the scraper behind the same address is not throttled by the UI's failures")
	}
	assert.Equal(t, http.StatusOK, send(t, attacker, d.base+"/healthz", noAuth).StatusCode, "probes are never throttled")
	assert.Equal(t, http.StatusOK, send(t, other, d.base+"/api/queues", bearerAuth(testToken)).StatusCode)
	logs := d.logs.String()
	assert.Contains(t, logs, `"msg":"failed logins throttled: this client gets 429 until it may try again","client":"127.0.0.3"`)
	assert.Contains(t, logs, `"status":429`)
	assert.Contains(t, logs, `"error_code":"`+errorCodeThrottled+`"`)
	assert.NotContains(t, logs, "guess-number")
	requireNoSecrets(t, logs)
}
