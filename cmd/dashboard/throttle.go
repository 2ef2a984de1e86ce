package main

import (
	"container/list"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
)

// Failed logins are throttled per client: each client may fail
// loginFailBurst times in a row, then once per loginFailEvery (10 a minute
// after the first 10). A client past that gets 429 Too Many Requests with
// Retry-After, without its credentials being checked (so the answer tells
// nothing about them), until it may fail again. A request counts as failed
// when it carries an Authorization header that no configured credential
// accepts (a request without one, such as a browser's first, only gets the
// 401 that makes it ask). Successful requests are never slowed down.
//
// A client is its IP address, and for IPv6 its /64 network (one host usually
// has a whole /64). Behind a reverse proxy every client is the proxy: the
// throttle then slows down everyone behind it while someone there fails,
// which still bounds the guessing. At most maxThrottledClients clients are
// remembered, the one that failed longest ago forgotten first.
const (
	loginFailBurst      = 10
	loginFailEvery      = 6 * time.Second
	maxThrottledClients = 10_000
)

// errorCodeThrottled is the access log's error code of a 429.
const errorCodeThrottled = "too_many_failed_logins"

// loginThrottle counts the failed logins of each client. It is safe for
// concurrent use.
type loginThrottle struct {
	every   rate.Limit
	burst   int
	max     int
	now     func() time.Time
	log     *zap.Logger
	mu      sync.Mutex
	clients map[string]*list.Element // of *failures
	lru     list.List                // most recent failure first
}

// failures is one client's budget of failed logins.
type failures struct {
	client string
	lim    *rate.Limiter
}

// newLoginThrottle allows each client burst failures, then one per every,
// and remembers at most max clients; now is the clock.
func newLoginThrottle(burst int, every time.Duration, max int, now func() time.Time, log *zap.Logger) *loginThrottle {
	return &loginThrottle{every: rate.Every(every), burst: burst, max: max, now: now, log: log, clients: map[string]*list.Element{}}
}

// wait returns how long client must wait before it may fail again: 0 when
// it may now.
func (t *loginThrottle) wait(client string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.clients[client]
	if !ok {
		return 0
	}
	tokens := e.Value.(*failures).lim.TokensAt(t.now())
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / float64(t.every) * float64(time.Second))
}

// fail counts a failed login of client.
func (t *loginThrottle) fail(client string) {
	now := t.now()
	t.mu.Lock()
	e, ok := t.clients[client]
	if ok {
		t.lru.MoveToFront(e)
	} else {
		e = t.lru.PushFront(&failures{client: client, lim: rate.NewLimiter(t.every, t.burst)})
		t.clients[client] = e
		for t.lru.Len() > t.max {
			oldest := t.lru.Back()
			t.lru.Remove(oldest)
			delete(t.clients, oldest.Value.(*failures).client)
		}
	}
	lim := e.Value.(*failures).lim
	lim.AllowN(now, 1)
	exhausted := lim.TokensAt(now) < 1
	t.mu.Unlock()
	if exhausted {
		t.log.Warn("failed logins throttled: this client gets 429 until it may try again",
			zap.String("client", client), zap.Int("burst", t.burst), zap.Duration("every", time.Duration(float64(time.Second)/float64(t.every))))
	}
}

// scheme wraps s so that each request it refuses that carries an
// Authorization header counts as a failed login.
func (t *loginThrottle) scheme(s httpauth.Scheme) httpauth.Scheme { return &throttledScheme{s, t} }

type throttledScheme struct {
	httpauth.Scheme
	t *loginThrottle
}

func (s *throttledScheme) Authenticate(r *http.Request) (string, bool) {
	p, ok := s.Scheme.Authenticate(r)
	if !ok && len(r.Header.Values("Authorization")) > 0 {
		s.t.fail(clientOf(r))
	}
	return p, ok
}

// guard answers 429, with Retry-After in seconds, to a client that must wait,
// and passes the rest to next.
func (t *loginThrottle) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wait := t.wait(clientOf(r))
		if wait <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		secs := max(int(math.Ceil(wait.Seconds())), 1)
		httpserve.InfoFrom(r.Context()).Code = errorCodeThrottled
		h := w.Header()
		h.Set("Retry-After", strconv.Itoa(secs))
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte("too many failed logins from this address: try again in " + strconv.Itoa(secs) + " s\n"))
	})
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
