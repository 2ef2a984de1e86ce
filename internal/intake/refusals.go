package intake

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/httpserve"
)

// The limit of refused requests: requests answered without a valid key
// (401, 403 on an action, 404 or 405 for a route that does not exist, to
// a caller that did not authenticate). Each client may be refused
// refusalBurst times at once, then refusalRate times a second; all clients
// together refusalGlobalBurst times, then refusalGlobalRate a second. Past
// either, a request without a valid key is answered 429 too_many_refusals,
// read no further and logged at debug only, so that a flood of refused
// requests neither costs the intake more than its answer nor fills its
// log. A request with a valid key is never held back by this limit.
//
// A client is its IP address, for IPv6 its /64 network (one host usually
// has a whole /64). At most refusalClients clients are remembered in each
// of two generations: when the newer fills up, the older is forgotten,
// and its clients start again with a full bucket.
const (
	refusalRate        rate.Limit = 1
	refusalBurst                  = 20
	refusalGlobalRate  rate.Limit = 20
	refusalGlobalBurst            = 200
	refusalClients                = 10_000
)

// codeTooManyRefusals is the code of a request refused past the limit of
// refused requests.
const codeTooManyRefusals = "too_many_refusals"

// refusals counts the refused requests of each client and of all. It is
// safe for concurrent use.
type refusals struct {
	now    func() time.Time
	client Limit // each client's bucket
	mu     sync.Mutex
	global *rate.Limiter
	cur    map[netip.Prefix]*rate.Limiter
	prev   map[netip.Prefix]*rate.Limiter
}

// newRefusals returns the limit of cfg (refusal and refusalGlobal, their
// zero fields the package's defaults), clocked by cfg.now.
func newRefusals(cfg Config) *refusals {
	c := Limit{Rate: cmp.Or(cfg.refusal.Rate, refusalRate), Burst: cmp.Or(cfg.refusal.Burst, refusalBurst)}
	g := Limit{Rate: cmp.Or(cfg.refusalGlobal.Rate, refusalGlobalRate), Burst: cmp.Or(cfg.refusalGlobal.Burst, refusalGlobalBurst)}
	return &refusals{now: cfg.now, client: c, global: rate.NewLimiter(g.Rate, g.Burst),
		cur: make(map[netip.Prefix]*rate.Limiter)}
}

// client returns the client of a request's remote address: its IP, or its
// /64 for IPv6; the zero Prefix when the address does not parse (then
// only the global bucket counts).
func client(remote string) netip.Prefix {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits) // cannot fail: bits fits ip
	return p
}

// bucket returns c's bucket, or nil for the zero client; r.mu is held.
func (r *refusals) bucket(c netip.Prefix, create bool) *rate.Limiter {
	if !c.IsValid() {
		return nil
	}
	if b := r.cur[c]; b != nil {
		return b
	}
	b := r.prev[c]
	if b == nil && !create {
		return nil
	}
	if b == nil {
		b = rate.NewLimiter(r.client.Rate, r.client.Burst)
	}
	if len(r.cur) >= refusalClients {
		r.prev, r.cur = r.cur, make(map[netip.Prefix]*rate.Limiter)
	}
	r.cur[c] = b
	return b
}

// full returns 0 when a refusal of c would be allowed now, or the whole
// seconds (at least 1) until it would be.
func (r *refusals) full(c netip.Prefix) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	need := 1 - r.global.TokensAt(now)
	limit := r.global.Limit()
	if b := r.bucket(c, false); b != nil {
		if n := 1 - b.TokensAt(now); n > 0 && n/float64(b.Limit()) > need/float64(limit) {
			need, limit = n, b.Limit()
		}
	}
	if need <= 0 {
		return 0
	}
	return int64(max(1, math.Ceil(need/float64(limit))))
}

// take counts a refusal of c.
func (r *refusals) take(c netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	r.global.AllowN(now, 1)
	if b := r.bucket(c, true); b != nil {
		b.AllowN(now, 1)
	}
}

// limitRefusals answers 429 (too_many_refusals) with Retry-After, logged at
// debug, to a request without a valid key from a client, or at a time,
// that has had too many refused requests, and counts each request that
// ends refused without a valid key. The probes are never limited. Without
// authentication (InsecureNoAuth) it does nothing.
func (s *Server) limitRefusals(next http.Handler) http.Handler {
	if s.auth == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if public[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		c := client(r.RemoteAddr)
		info := httpserve.InfoFrom(r.Context())
		if secs := s.refusals.full(c); secs > 0 && !s.validKey(r) {
			info.Quiet = true
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			s.writeError(w, r, &apiError{status: http.StatusTooManyRequests, code: codeTooManyRefusals,
				message: fmt.Sprintf("too many requests without a valid API key from this address; retry in %d s with a valid key", secs)})
			return
		}
		next.ServeHTTP(w, r)
		switch info.Code {
		case codeUnauthorized, codeForbidden, codeNotFound, codeMethodNotAllowed:
			// A principal is set once a key is accepted: an order not
			// found is no refusal. A route not found is one only
			// without a valid key.
			if info.Principal == "" && !s.validKey(r) {
				s.refusals.take(c)
			}
		}
	})
}

// validKey reports whether r carries a key of APIKeys or AdminKeys.
func (s *Server) validKey(r *http.Request) bool {
	if _, ok := s.auth.Authenticate(r); ok {
		return true
	}
	if s.admin != nil {
		_, ok := s.admin.Authenticate(r)
		return ok
	}
	return false
}

// public are the paths of the routes served without credentials (none of
// them a kind's).
var public = func() map[string]bool {
	m := make(map[string]bool)
	for _, rt := range routeTable(nil) {
		if rt.Public {
			m[rt.Path] = true
		}
	}
	return m
}()
