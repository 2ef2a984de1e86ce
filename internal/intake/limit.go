package intake

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
)

// Limit is the token bucket of one API key: Rate tokens a second, Burst at
// most, one token per enqueue (see [Config.Rate]).
type Limit struct {
	// Rate is how many enqueues a second the key may make, sustained.
	// [Unlimited] turns the key's limit off; it may not be negative.
	// Defaults to [Config.Rate].
	Rate rate.Limit
	// Burst is the size of the key's bucket: how many enqueues it may make
	// at once after a quiet spell. It may not be negative. Defaults to
	// [Config.Burst].
	Burst int
}

// Unlimited is the Rate of a [Limit] or [Config] that is off: every enqueue
// passes.
const Unlimited = rate.Inf

// The defaults of the rate limit: generous enough for an upstream that
// replays thousands of changes a second after an outage of its own, low
// enough that one runaway client cannot fill Redis alone.
const (
	// DefaultRate is the default of [Config.Rate]: enqueues a second, per
	// key.
	DefaultRate rate.Limit = 2000
	// DefaultBurst is the default of [Config.Burst].
	DefaultBurst = 10000
)

// checkLimit says what is wrong with l, or nil.
func checkLimit(l Limit) error {
	switch {
	case !(l.Rate >= 0): // NaN too
		return fmt.Errorf("negative rate %v (use Unlimited to turn the limit off)", float64(l.Rate))
	case l.Burst < 0:
		return fmt.Errorf("negative burst %d", l.Burst)
	}
	return nil
}

// limiters are the token buckets of the enqueue routes, one per caller: by
// principal ("key#N", the key's position, never the key) with API keys, and
// one shared by every caller ("") without. The map is built by [New] and
// only read afterwards; a nil bucket is a caller without a limit.
type limiters struct {
	buckets map[string]*rate.Limiter
	now     func() time.Time
}

// newLimiters builds the buckets of cfg, whose defaults are filled.
func newLimiters(cfg Config) limiters {
	l := limiters{buckets: make(map[string]*rate.Limiter), now: cfg.now}
	bucket := func(o Limit) *rate.Limiter {
		r, b := cmp.Or(o.Rate, cfg.Rate), cmp.Or(o.Burst, cfg.Burst)
		if r == Unlimited {
			return nil
		}
		return rate.NewLimiter(r, b)
	}
	if cfg.InsecureNoAuth {
		l.buckets[""] = bucket(Limit{})
		return l
	}
	for i := range cfg.APIKeys {
		l.buckets[httpauth.KeyPrincipal(i+1)] = bucket(cfg.KeyLimits[i+1])
	}
	return l
}

// wait takes a token of the caller's bucket and returns 0, or, when the
// bucket is empty, takes none and returns how many seconds until it holds
// one, rounded up: at least 1, at most a day.
func (l limiters) wait(who string) int64 {
	b := l.buckets[who]
	if b == nil {
		return 0
	}
	now := l.now()
	if b.AllowN(now, 1) {
		return 0
	}
	secs := math.Ceil((1 - b.TokensAt(now)) / float64(b.Limit()))
	// A rate far below one a second would overflow: a day is as good a hint.
	return int64(max(1, min(secs, 24*60*60)))
}

// rateLimit answers 429 (rate_limited) with Retry-After, reading no body and
// enqueueing nothing, when the caller's bucket is empty, and otherwise
// passes the request on. It runs after authentication, so a request
// without a valid key spends no token.
func (s *Server) rateLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secs := s.limits.wait(httpserve.InfoFrom(r.Context()).Principal)
		if secs == 0 {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		s.writeError(w, r, &apiError{status: http.StatusTooManyRequests, code: codeRateLimited,
			message: fmt.Sprintf("this API key's enqueue rate limit is reached; retry in %d s with the same Idempotency-Key", secs)})
	})
}
