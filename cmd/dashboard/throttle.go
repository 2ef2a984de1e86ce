package main

import (
	"container/list"
	"context"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
)

// Failed logins are throttled per client: each client may fail
// loginFailBurst times in a row, then once per loginFailEvery (10 a minute
// after the first 10). Every request that carries an Authorization header
// takes one of its client's tries before its credentials are checked, and
// gets it back if they are good. So concurrent requests cannot guess more
// than the client has tries, and successful requests are never slowed down
// while the client has a try left. A request without an Authorization
// header (a browser's first, which the 401 makes ask) takes no try.
//
// Only failures are throttled: a client with no try left (429 Too Many
// Requests with Retry-After) still gets its credentials checked, up to
// graceBurst requests and then one per graceEvery ("grace checks"); good
// ones are served, bad ones get 429 too. So a user or a scraper behind the
// same address as someone who fails (a shared proxy, a NAT) still gets in,
// while the right answer to a guess comes at most once per graceEvery per
// client: a throttled client's guesses are checked at most at that rate
// (and with no more than its tries while it has some), against passwords of
// at least 12 characters and generated tokens. A client that sends more
// than that while throttled gets 429 unchecked, without its credentials
// being looked at; someone behind the same address who floods can still
// crowd the others' grace checks out, and the log says which address
// (and /metrics has a throttle of its own, see newHandler).
//
// A client is its IP address, and for IPv6 its /64 network (one host usually
// has a whole /64). Behind a reverse proxy every client is the proxy. At
// most maxThrottledClients clients are remembered, the one seen longest ago
// forgotten first.
const (
	loginFailBurst      = 10
	loginFailEvery      = 6 * time.Second
	graceBurst          = 5
	graceEvery          = 2 * time.Second
	maxThrottledClients = 10_000
)

// errorCodeThrottled is the access log's error code of a 429.
const errorCodeThrottled = "too_many_failed_logins"

// loginThrottle counts the failed logins of each client. It is safe for
// concurrent use.
//
// Its buckets are its own, not golang.org/x/time/rate's: a good login must
// give its try back, and a rate.Reservation can only be cancelled while it
// is not yet due.
type loginThrottle struct {
	every   time.Duration
	burst   float64
	max     int
	grace   bucket // of grace checks, per client
	now     func() time.Time
	log     *zap.Logger
	mu      sync.Mutex
	clients map[string]*list.Element // of *tries
	lru     list.List                // most recently seen first
}

// tries is one client's bucket of tries: tokens at last, one more every
// t.every, up to t.burst; and of grace checks, graceTokens at graceLast.
type tries struct {
	client      string
	tokens      float64
	last        time.Time
	graceTokens float64
	graceLast   time.Time
}

// bucket is the shape of a token bucket: burst tokens, one more every.
type bucket struct {
	burst float64
	every time.Duration
}

// level returns the tokens of a bucket of shape b that had tokens at last,
// at now.
func (b bucket) level(tokens float64, last, now time.Time) float64 {
	return min(tokens+float64(max(now.Sub(last), 0))/float64(b.every), b.burst)
}

// newLoginThrottle allows each client burst failures, then one per every,
// and remembers at most max clients; now is the clock. A client with no
// try left gets graceBurst grace checks, then one per graceEvery.
func newLoginThrottle(burst int, every time.Duration, max int, now func() time.Time, log *zap.Logger) *loginThrottle {
	return &loginThrottle{every: every, burst: float64(burst), max: max, grace: bucket{burst: graceBurst, every: graceEvery},
		now: now, log: log, clients: map[string]*list.Element{}}
}

// level returns the tries c has at now; t.mu is held.
func (t *loginThrottle) level(c *tries, now time.Time) float64 {
	return min(c.tokens+float64(max(now.Sub(c.last), 0))/float64(t.every), t.burst)
}

// tries returns client's bucket, remembering the client (a new one has every
// try); t.mu is held.
func (t *loginThrottle) tries(client string, now time.Time) *tries {
	if e, ok := t.clients[client]; ok {
		t.lru.MoveToFront(e)
		return e.Value.(*tries)
	}
	c := &tries{client: client, tokens: t.burst, last: now, graceTokens: t.grace.burst, graceLast: now}
	t.clients[client] = t.lru.PushFront(c)
	for t.lru.Len() > t.max {
		oldest := t.lru.Back()
		t.lru.Remove(oldest)
		delete(t.clients, oldest.Value.(*tries).client)
	}
	return c
}

// take takes one of client's tries and reports true, or, when it has none
// left, reports false and how long until it has one.
func (t *loginThrottle) take(client string) (bool, time.Duration) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.tries(client, now)
	lvl := t.level(c, now)
	if lvl < 1 {
		return false, time.Duration((1 - lvl) * float64(t.every))
	}
	c.tokens, c.last = lvl-1, now
	return true, 0
}

// takeGrace takes one of client's grace checks, which it may use while it
// has no try left, and reports whether it had one.
func (t *loginThrottle) takeGrace(client string) bool {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.tries(client, now)
	lvl := t.grace.level(c.graceTokens, c.graceLast, now)
	if lvl < 1 {
		return false
	}
	c.graceTokens, c.graceLast = lvl-1, now
	return true
}

// giveBack returns a try to client, whose credentials were good.
func (t *loginThrottle) giveBack(client string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.clients[client]; ok {
		c := e.Value.(*tries)
		c.tokens, c.last = min(t.level(c, now)+1, t.burst), now
	}
}

// wait returns how long client must wait until it has a try: 0 when it has
// one now.
func (t *loginThrottle) wait(client string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.clients[client]
	if !ok {
		return 0
	}
	if lvl := t.level(e.Value.(*tries), now); lvl < 1 {
		return time.Duration((1 - lvl) * float64(t.every))
	}
	return 0
}

// failed notes that client's credentials were refused, and logs when that
// was its last try.
func (t *loginThrottle) failed(client string) {
	if d := t.wait(client); d > 0 {
		t.log.Warn("failed logins throttled: this client gets 429 until it may try again",
			zap.String("client", client), zap.Int("burst", int(t.burst)), zap.Duration("retry_after", d))
	}
}

// tryKey is the context key of the client whose try a request took.
type tryKey struct{}

// scheme wraps s so that a request whose credentials s accepts gets its try
// back, and one it refuses notes the failure.
func (t *loginThrottle) scheme(s httpauth.Scheme) httpauth.Scheme { return &throttledScheme{s, t} }

type throttledScheme struct {
	httpauth.Scheme
	t *loginThrottle
}

func (s *throttledScheme) Authenticate(r *http.Request) (string, bool) {
	p, ok := s.Scheme.Authenticate(r)
	if client, took := r.Context().Value(tryKey{}).(string); took {
		if ok {
			s.t.giveBack(client)
		} else {
			s.t.failed(client)
		}
	}
	return p, ok
}

// guard takes a try for every request with an Authorization header and
// passes it to next, which must authenticate with t.scheme(s). A client
// with no try left gets 429, with Retry-After in seconds, unless it has a
// grace check and s accepts its credentials: then the request is served
// (next authenticates it again).
func (t *loginThrottle) guard(s httpauth.Scheme, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := clientOf(r)
		if len(r.Header.Values("Authorization")) == 0 {
			if wait := t.wait(client); wait > 0 {
				tooMany(w, r, wait)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		ok, wait := t.take(client)
		if ok {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tryKey{}, client)))
			return
		}
		if t.takeGrace(client) {
			if _, good := s.Authenticate(r); good {
				next.ServeHTTP(w, r)
				return
			}
		}
		tooMany(w, r, wait)
	})
}

// tooMany answers 429 with Retry-After: wait, in whole seconds.
func tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	httpserve.InfoFrom(r.Context()).Code = errorCodeThrottled
	h := w.Header()
	h.Set("Retry-After", strconv.Itoa(secs))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write([]byte("too many failed logins from this address: try again in " + strconv.Itoa(secs) + " s\n"))
}

// clientOf names the client of r for the throttle: its IP address, or its
// /64 network for IPv6.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64) // cannot fail for an IPv6 address
		return p.String()
	}
	return ip.String()
}
