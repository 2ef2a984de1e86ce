package httpserve

import (
	"context"
	"sync"
	"time"
)

// DefaultReadyFor is how long a [Ready] keeps a readiness result unless told
// otherwise.
const DefaultReadyFor = time.Second

// Ready caches a readiness check (a Redis PING behind /readyz), so that
// unauthenticated probes, however many, cost at most one check per period:
// a flood of /readyz makes about one PING a second, not one per request. It
// is safe for concurrent use: while a check runs, other callers wait for
// its result (or for their context) instead of starting their own.
type Ready struct {
	check   func(context.Context) error
	timeout time.Duration
	every   time.Duration
	now     func() time.Time

	mu      sync.Mutex
	at      time.Time     // when the cached result was taken; zero: none
	err     error         // the cached result
	running chan struct{} // closed when the running check ends; nil when none runs
}

// NewReady returns a Ready that runs check with a context bounded by
// timeout, and keeps its result for every (DefaultReadyFor when 0). now is
// the clock; nil means time.Now.
func NewReady(check func(context.Context) error, timeout, every time.Duration, now func() time.Time) *Ready {
	if every <= 0 {
		every = DefaultReadyFor
	}
	if now == nil {
		now = time.Now
	}
	return &Ready{check: check, timeout: timeout, every: every, now: now}
}

// Check returns the result of the last check when it is younger than the
// period; otherwise it runs the check once for all its concurrent callers
// and returns its result (the check's error, or ctx's when ctx ends
// first). The check runs to its timeout even when the caller that started
// it goes away, so that the others get its result.
func (r *Ready) Check(ctx context.Context) error {
	r.mu.Lock()
	if !r.at.IsZero() && r.now().Sub(r.at) < r.every {
		err := r.err
		r.mu.Unlock()
		return err
	}
	if done := r.running; done != nil {
		r.mu.Unlock()
		select {
		case <-done:
			r.mu.Lock()
			err := r.err
			r.mu.Unlock()
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	r.running = done
	r.mu.Unlock()

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	err := r.check(cctx)
	cancel()

	r.mu.Lock()
	r.at, r.err, r.running = r.now(), err, nil
	r.mu.Unlock()
	close(done)
	return err
}
