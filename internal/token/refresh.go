package token

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/logging"
)

const (
	// releaseTimeout bounds writes that must happen even when the refresh
	// was cancelled: storing a fetched token and giving the lock back.
	releaseTimeout = 2 * time.Second
)

// errLockHeld is the last cause of an ErrUnavailable when the wait ended
// while another replica held the refresh lock.
var errLockHeld = errors.New("refresh lock held by another replica")

// flight is one refresh of a Cache, shared by every caller that needs it.
// e and err are set before done is closed.
type flight struct {
	prev       string // the token to replace; "" when there was none
	background bool   // started by stale-while-refresh, not by a waiting caller
	cancel     context.CancelCauseFunc
	done       chan struct{}
	e          entry
	err        error
}

// refreshing reports whether a refresh is under way.
func (c *Cache) refreshing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flight != nil
}

// start returns the refresh under way, or starts one that replaces prev. It
// returns ErrClosed after Close.
func (c *Cache) start(prev string, background bool) (*flight, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if c.flight != nil {
		return c.flight, nil
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	fl := &flight{prev: prev, background: background, cancel: cancel, done: make(chan struct{})}
	c.flight = fl
	c.wg.Add(1)
	go c.run(ctx, fl)
	return fl, nil
}

// run performs a refresh in the Cache's refresh goroutine.
func (c *Cache) run(ctx context.Context, fl *flight) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeoutCause(ctx, c.cfg.WaitTimeout,
		fmt.Errorf("no token within WaitTimeout (%v)", c.cfg.WaitTimeout))
	e, err := c.refresh(ctx, fl.prev)
	cancel()
	fl.cancel(nil)
	if err == nil {
		c.setLocal(e)
	}
	c.mu.Lock()
	c.flight = nil
	c.mu.Unlock()
	fl.e, fl.err = e, err
	close(fl.done)
	if err != nil && fl.background && !errors.Is(err, ErrClosed) {
		// Nobody waited for this refresh, so nobody else reports its error.
		c.log.Warn("background token refresh failed", zap.Error(err))
	}
}

// refresh returns a token that replaces prev, taking the lock and fetching
// it if no other replica does. It returns ErrUnavailable wrapping the cause
// when ctx ends first or the Source fails.
func (c *Cache) refresh(ctx context.Context, prev string) (entry, error) {
	owner := newOwner()
	// Wait for notices before the first look at the token, so that a
	// notice sent after that look is not missed: one that comes during a
	// look wakes the wait after it at once. If Redis does not confirm the
	// subscription in time, go on: the fallback timer covers a missed
	// notice (and the loop below the end of ctx).
	notices := c.notices.Wait("", nil)
	defer notices.Stop()
	_ = notices.Ready(ctx, c.cfg.FallbackMax)
	var last error
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r, err := c.acquire(ctx, prev, owner)
		wait := c.cfg.Jitter(c.cfg.FallbackMin, c.cfg.FallbackMax)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			// The deadline cut this attempt short; the cause before it says
			// more than "deadline exceeded" does.
		case err != nil:
			last = err
		case r.e.value != "":
			return r.e, nil
		case r.locked:
			return c.fetch(ctx, owner)
		default:
			last = errLockHeld
			if r.lockTTL > 0 && r.lockTTL < wait {
				wait = r.lockTTL + time.Millisecond // the lease ends before our delay would
			}
		}
		if ctx.Err() != nil {
			return entry{}, unavailable(ctx, last)
		}
		timer.Reset(wait)
		c.waiting.Add(1)
		select {
		case <-notices.C:
		case <-timer.C:
		case <-ctx.Done():
		}
		c.waiting.Add(-1)
		timer.Stop() // Go ≥1.23 timers: no stale tick survives Stop or Reset
		if ctx.Err() != nil {
			return entry{}, unavailable(ctx, last)
		}
	}
}

// unavailable is the error of a refresh whose context ended, wrapping the
// context's cause and the last thing that went wrong before.
func unavailable(ctx context.Context, last error) error {
	cause := context.Cause(ctx)
	if last == nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	return fmt.Errorf("%w: %w (last: %w)", ErrUnavailable, cause, last)
}

// acquired is the outcome of one acquire attempt: a usable token, the lock,
// or the lock holder's remaining lease.
type acquired struct {
	e       entry
	locked  bool
	lockTTL time.Duration
}

func (c *Cache) acquire(ctx context.Context, prev, owner string) (acquired, error) {
	sent := c.cfg.Now()
	res, err := acquireScript.Run(ctx, c.rdb, c.keys,
		owner, c.cfg.LockTTL.Milliseconds(), prev, c.cfg.RefreshBefore.Milliseconds(),
		max(c.cfg.LockTTL, c.cfg.FailureBackoff).Milliseconds(),
	).Slice()
	if err != nil {
		return acquired{}, fmt.Errorf("acquire refresh lock: %w", err)
	}
	if len(res) == 0 {
		return acquired{}, errors.New("acquire refresh lock: empty reply")
	}
	switch res[0] {
	case int64(1):
		v, ttl, err := tokenReply(res[1:])
		if err != nil {
			return acquired{}, fmt.Errorf("acquire refresh lock: %w", err)
		}
		return acquired{e: entry{value: v, expires: sent.Add(ttl), read: sent}}, nil
	case int64(2):
		return acquired{locked: true}, nil
	case int64(4):
		var ms int64
		if len(res) == 2 {
			ms, _ = res[1].(int64)
		}
		logging.WithTrace(ctx, c.log).Warn("token refresh lock taken over: its lease was longer than any refresh sets, or it had none",
			zap.Duration("lease_left", time.Duration(ms)*time.Millisecond), zap.Duration("longest_lease", max(c.cfg.LockTTL, c.cfg.FailureBackoff)))
		return acquired{locked: true}, nil
	case int64(3):
		var a acquired
		if len(res) == 2 {
			if ms, ok := res[1].(int64); ok && ms > 0 {
				a.lockTTL = time.Duration(ms) * time.Millisecond
			}
		}
		return a, nil
	}
	return acquired{}, fmt.Errorf("acquire refresh lock: unexpected reply %T", res[0])
}

// fetch runs while holding the lock: it fetches a token from the Source,
// stores it, releases the lock and publishes the notice. A fetched token is
// returned even if storing it failed: it is good for this process.
func (c *Cache) fetch(ctx context.Context, owner string) (entry, error) {
	start := time.Now()
	got := c.cfg.Now()
	fctx, cancel := context.WithTimeout(ctx, c.cfg.LockTTL)
	tok, err := c.src.Fetch(fctx)
	cancel()
	var lifetime time.Duration
	if err == nil {
		lifetime, err = c.lifetime(tok)
	}
	if err != nil {
		// Keep the lock for the backoff so no replica asks again at once;
		// when we are being stopped, let another replica take over now.
		c.hook(time.Since(start), err)
		if ctx.Err() != nil {
			c.release(ctx, owner, 0)
			return entry{}, unavailable(ctx, fmt.Errorf("fetch: %w", err))
		}
		c.release(ctx, owner, c.cfg.FailureBackoff)
		return entry{}, fmt.Errorf("%w: fetch: %w", ErrUnavailable, err)
	}

	e := entry{value: tok.Value, expires: got.Add(lifetime), read: c.cfg.Now()}
	ttl := lifetime - time.Since(start) // Redis counts from the store, not the fetch
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	fp := fingerprint(tok.Value)
	stored, err := storeScript.Run(sctx, c.rdb, c.keys,
		owner, tok.Value, max(ttl.Milliseconds(), 1), c.channel, fp, c.cfg.RefreshBefore.Milliseconds()).Int()
	d := time.Since(start)
	switch {
	case err != nil:
		c.release(ctx, owner, 0)
		err = fmt.Errorf("store token: %w", err)
		logging.WithTrace(ctx, c.log).Warn("token fetched but not stored", zap.String("token_fp", fp), zap.Error(err))
	case stored == 0:
		// Our lease ran out during the fetch, another replica took over and
		// stored a token already: keep it, ours still serves this process.
		logging.WithTrace(ctx, c.log).Info("token fetched after lock lease ran out; not stored",
			zap.String("token_fp", fp), zap.Duration("took", d))
	default:
		logging.WithTrace(ctx, c.log).Info("token refreshed",
			zap.String("token_fp", fp), zap.Duration("ttl", lifetime), zap.Duration("took", d))
	}
	c.hook(d, err)
	return e, nil
}

// lifetime checks a token from the Source and returns how long to keep it:
// its expires_in, capped at maxLifetime, less Skew.
func (c *Cache) lifetime(tok Token) (time.Duration, error) {
	return lifetime(tok, c.cfg.Skew, c.cfg.RefreshBefore)
}

// release gives the lock back (after backoff, if not zero) on a context
// that survives ctx's cancellation.
func (c *Cache) release(ctx context.Context, owner string, backoff time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := releaseScript.Run(rctx, c.rdb, c.keys[1:], owner, backoff.Milliseconds()).Err(); err != nil {
		// The lease ends by itself; nothing else to do.
		logging.WithTrace(ctx, c.log).Warn("token refresh lock not released", zap.Error(err))
	}
}

func (c *Cache) hook(d time.Duration, err error) {
	if c.cfg.OnRefresh != nil {
		c.cfg.OnRefresh(d, err)
	}
}

// newOwner returns a random lock owner ID.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
