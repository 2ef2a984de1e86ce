package token

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/notice"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// maxLifetime caps the lifetime taken from a Source: an absurd expires_in
// (years) must not pin a token in Redis; refreshing earlier costs nothing.
const maxLifetime = 24 * time.Hour

// The defaults of Config.RefreshBefore and Config.WaitTimeout, which
// binaries offer as settings.
const (
	DefaultRefreshBefore = 10 * time.Second
	DefaultWaitTimeout   = 15 * time.Second
)

// Config tunes a Cache. The zero value is valid and means all defaults.
//
// The durations must fit the upstream's token lifetime: a token must live
// longer than Skew + RefreshBefore, or the Cache rejects it with ErrBadToken.
type Config struct {
	// Key is the Redis key of the token. The refresh lock is Key+":lock" and
	// the notice channel Key+":refreshed". It must contain a non-empty
	// {hash tag} so that both keys share one Redis Cluster slot. Caches that
	// share a token must share Key. Defaults to the domain's default,
	// orderkeys.TokenKey(orderkeys.DefaultPrefix): "ow:token:{upstream}".
	Key string
	// RefreshBefore is how much remaining lifetime makes a token due for
	// refresh. A due token is still served while one replica refreshes it
	// in the background. Defaults to 10s.
	RefreshBefore time.Duration
	// Skew is taken off the Source's expires_in when the token is stored,
	// to cover clock drift and the time a request takes to reach the
	// upstream: a token is never served in the last Skew of its life. (An
	// expires_in above 24h is taken as 24h.) Defaults to 5s.
	Skew time.Duration
	// LockTTL is the lease of the refresh lock, and the time a Source.Fetch
	// may take: a refresher that died (or hangs) holds the others up for at
	// most this long before one of them takes over. A fetch that ends just
	// as its lease does may be repeated by the replica taking over; its
	// token is still stored if Redis has none (or only a due one).
	// Defaults to 10s.
	LockTTL time.Duration
	// WaitTimeout bounds a refresh that callers wait for, when there is no
	// valid token. Callers that join a refresh already under way share its
	// deadline. Past it Get returns ErrUnavailable. Defaults to 15s.
	WaitTimeout time.Duration
	// FallbackMin is the shortest jittered interval at which a waiting
	// replica re-reads the token and retries the lock, in case it missed
	// the notice or the refresher died. Defaults to 50ms.
	FallbackMin time.Duration
	// FallbackMax is the longest such interval: a replica that missed the
	// notice has the token at most this late. The interval is also capped
	// by the lock's remaining lease, so a dead refresher is replaced as soon
	// as its lease ends. Defaults to 250ms.
	FallbackMax time.Duration
	// FailureBackoff is how long the refresh lock stays held after the
	// Source failed, so that no replica asks the upstream again before then.
	// Defaults to 1s.
	FailureBackoff time.Duration
	// LocalMaxAge is how long a process-local copy may be served without
	// asking Redis, so that a refresh or an Invalidate by another replica is
	// seen within it. A local copy is never served this way once it has
	// RefreshBefore or less left, whatever its age; a due but valid copy is
	// still served while this Cache refreshes, or while Redis cannot be
	// read. A negative value disables the local copy: every Get asks Redis.
	// Defaults to 1s.
	LocalMaxAge time.Duration
	// OnRefresh, if set, is called after each fetch this Cache makes from
	// its Source, with the time the fetch and store took and the error (nil
	// when the token was fetched and stored). It is called from the Cache's
	// refresh goroutine, so it must be quick; it must be safe for concurrent
	// use if several Caches share it. Defaults to nil.
	OnRefresh func(d time.Duration, err error)
	// OnWait, if set, is called after each Get that had to wait for a
	// refresh (no valid token), with the time it waited, whether it then
	// got a token or an error. It is called from the caller's goroutine
	// and must be safe for concurrent use. Defaults to nil.
	OnWait func(d time.Duration)
	// Now is the clock used for the local copy's age and expiry. Tests set
	// it; timers and Redis TTLs use real time. Defaults to time.Now.
	Now func() time.Time
	// Jitter returns a random duration in [lo, hi] for the fallback
	// interval. Defaults to a uniform pick from math/rand/v2.
	Jitter func(lo, hi time.Duration) time.Duration
}

// Cache hands out the shared upstream token. It is safe for concurrent use.
//
// A Cache owns at most one refresh goroutine at a time and, from its first
// refresh on, one pub/sub subscription with its goroutine; Close stops both
// and waits for them. The Redis client stays the caller's to close.
type Cache struct {
	rdb     redis.UniversalClient
	src     Source
	cfg     Config
	log     *zap.Logger
	keys    []string // token key, lock key
	channel string
	notices *notice.Channel // the refresh notices, fanned out to the waiting refreshes

	local  atomic.Pointer[entry] // process-local copy; nil when none
	closed atomic.Bool

	mu      sync.Mutex
	flight  *flight        // the refresh under way, if any
	revoked string         // the last token invalidated here; never cached again
	wg      sync.WaitGroup // the refresh goroutine

	// waiting counts refreshes of this Cache that are waiting for another
	// replica's token (tests and benchmarks read it).
	waiting atomic.Int32
}

// entry is a token as this process last saw it. expires and read are on the
// Config.Now clock.
type entry struct {
	value   string
	expires time.Time // when Redis drops it (already Skew before the upstream does)
	read    time.Time // when it was read from, or written to, Redis
}

// fresh reports whether e may be served without asking Redis.
func (e *entry) fresh(now time.Time, cfg *Config) bool {
	return e != nil && cfg.LocalMaxAge >= 0 && now.Sub(e.read) < cfg.LocalMaxAge &&
		e.expires.Sub(now) > cfg.RefreshBefore
}

// valid reports whether e has not expired yet.
func (e *entry) valid(now time.Time) bool { return e != nil && now.Before(e.expires) }

// New returns a Cache for the token at cfg.Key, refreshed from src. log may
// be nil (no logging). It returns an error when rdb or src is nil or cfg is
// invalid. New does no I/O.
func New(rdb redis.UniversalClient, src Source, cfg Config, log *zap.Logger) (*Cache, error) {
	if rdb == nil {
		return nil, errors.New("token: nil redis client")
	}
	if src == nil {
		return nil, errors.New("token: nil source")
	}
	cfg.Key = cmp.Or(cfg.Key, orderkeys.TokenKey(orderkeys.DefaultPrefix))
	cfg.RefreshBefore = cmp.Or(cfg.RefreshBefore, DefaultRefreshBefore)
	cfg.Skew = cmp.Or(cfg.Skew, 5*time.Second)
	cfg.LockTTL = cmp.Or(cfg.LockTTL, 10*time.Second)
	cfg.WaitTimeout = cmp.Or(cfg.WaitTimeout, DefaultWaitTimeout)
	cfg.FallbackMin = cmp.Or(cfg.FallbackMin, 50*time.Millisecond)
	cfg.FallbackMax = cmp.Or(cfg.FallbackMax, 250*time.Millisecond)
	cfg.FailureBackoff = cmp.Or(cfg.FailureBackoff, time.Second)
	cfg.LocalMaxAge = cmp.Or(cfg.LocalMaxAge, time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Jitter == nil {
		cfg.Jitter = uniform
	}
	switch {
	case !hasHashTag(cfg.Key):
		return nil, fmt.Errorf("token: key %q has no {hash tag}", cfg.Key)
	case cfg.RefreshBefore < 0 || cfg.Skew < 0 || cfg.WaitTimeout < 0 ||
		cfg.FallbackMin < 0 || cfg.FallbackMax < 0 || cfg.FailureBackoff < 0:
		return nil, errors.New("token: negative duration in config")
	case cfg.LockTTL < time.Millisecond || cfg.FailureBackoff < time.Millisecond:
		return nil, errors.New("token: LockTTL and FailureBackoff must be at least 1ms")
	case cfg.FallbackMin > cfg.FallbackMax:
		return nil, fmt.Errorf("token: FallbackMin %v above FallbackMax %v", cfg.FallbackMin, cfg.FallbackMax)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Cache{
		rdb:     rdb,
		src:     src,
		cfg:     cfg,
		log:     log.Named("token").With(zap.String("key", cfg.Key)),
		keys:    []string{cfg.Key, lockKey(cfg.Key)},
		channel: channelName(cfg.Key),
		notices: notice.New(rdb, channelName(cfg.Key), notice.Config{SubscribeTimeout: cfg.LockTTL}),
	}, nil
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a non-empty
// part between the first "{" and the next "}".
func hasHashTag(key string) bool {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return false
	}
	tag, _, ok := strings.Cut(rest, "}")
	return ok && tag != ""
}

func uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo+1)
}

// Get returns the current access token. It is safe for concurrent use.
//
// A fresh local copy costs nothing, otherwise Get costs one Redis round trip,
// unless there is no valid token: then it waits for a refresh (by this
// replica or another), at most until Config.WaitTimeout or ctx ends. A token
// near expiry is returned at once while a refresh runs in the background.
//
// Errors: [ErrClosed] after Close; otherwise [ErrUnavailable], wrapping the
// cause (the Source's error, a Redis error, or the context's or
// WaitTimeout's end). Treat ErrUnavailable as retryable.
func (c *Cache) Get(ctx context.Context) (string, error) {
	if c.closed.Load() {
		return "", ErrClosed
	}
	now := c.cfg.Now()
	loc := c.local.Load()
	if loc.fresh(now, &c.cfg) {
		return loc.value, nil
	}
	if loc.valid(now) && c.refreshing() {
		// Due, but a refresh is already under way: no need to ask Redis.
		return loc.value, nil
	}
	e, err := c.read(ctx)
	switch {
	case err != nil:
		if loc.valid(now) {
			// Redis is unreachable, but what we have is still good.
			return loc.value, nil
		}
		return "", fmt.Errorf("%w: %w", ErrUnavailable, err)
	case e.value != "":
		c.setLocal(e)
		if e.expires.Sub(now) <= c.cfg.RefreshBefore {
			// Stale-while-refresh: serve it, refresh in the background. A
			// closed Cache (the only error) still serves what it read.
			_, _ = c.start(e.value, true)
		}
		return e.value, nil
	}
	return c.wait(ctx)
}

// wait joins (or starts) the refresh and waits for its outcome.
func (c *Cache) wait(ctx context.Context) (string, error) {
	start := time.Now()
	fl, err := c.start("", false)
	if err != nil {
		return "", err
	}
	if c.cfg.OnWait != nil {
		defer func() { c.cfg.OnWait(time.Since(start)) }()
	}
	select {
	case <-fl.done:
		if fl.err != nil {
			return "", fl.err
		}
		return fl.e.value, nil
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
}

// read reads the token and its TTL from Redis in one round trip. A missing
// token is a zero entry and no error.
func (c *Cache) read(ctx context.Context) (entry, error) {
	sent := c.cfg.Now()
	res, err := readScript.Run(ctx, c.rdb, c.keys[:1]).Slice()
	if errors.Is(err, redis.Nil) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("read token: %w", err)
	}
	v, ttl, err := tokenReply(res)
	if err != nil {
		return entry{}, fmt.Errorf("read token: %w", err)
	}
	return entry{value: v, expires: sent.Add(ttl), read: sent}, nil
}

// tokenReply parses {token, PTTL in ms}.
func tokenReply(res []any) (string, time.Duration, error) {
	if len(res) != 2 {
		return "", 0, fmt.Errorf("unexpected reply of %d elements", len(res))
	}
	v, ok1 := res[0].(string)
	ms, ok2 := res[1].(int64)
	if !ok1 || !ok2 || v == "" {
		return "", 0, fmt.Errorf("unexpected reply types %T, %T", res[0], res[1])
	}
	return v, time.Duration(ms) * time.Millisecond, nil
}

// setLocal replaces the local copy with e, unless e is older than it or is
// a token invalidated here.
func (c *Cache) setLocal(e entry) {
	if c.cfg.LocalMaxAge < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.value == c.revoked {
		return
	}
	if cur := c.local.Load(); cur != nil && cur.read.After(e.read) {
		return
	}
	c.local.Store(&e)
}

// Invalidate reports that tok was refused by the upstream (a 401). It
// deletes the token from Redis only if Redis still holds exactly tok, and
// drops the local copy if it is tok, so that the next Get refreshes. Pass
// the exact token that was refused, not one just read again with Get: then
// many callers invalidating the same token cause one refresh, and a late 401
// never discards its replacement. It is safe for concurrent use and costs
// one Redis round trip.
//
// It returns ErrClosed after Close, and Redis errors wrapped (the local copy
// is dropped even then).
func (c *Cache) Invalidate(ctx context.Context, tok string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if tok == "" {
		return nil
	}
	c.mu.Lock()
	c.revoked = tok
	if cur := c.local.Load(); cur != nil && cur.value == tok {
		c.local.Store(nil)
	}
	c.mu.Unlock()
	n, err := invalidateScript.Run(ctx, c.rdb, c.keys[:1], tok).Int()
	if err != nil {
		return fmt.Errorf("invalidate token: %w", err)
	}
	logging.WithTrace(ctx, c.log).Debug("token invalidated", zap.String("token_fp", fingerprint(tok)), zap.Bool("deleted", n == 1))
	return nil
}

// Close stops the Cache: a refresh under way is cancelled (its lock is
// released so another replica can take over at once), the subscription is
// closed, and Close waits for both goroutines. Callers waiting in Get get an
// error matching ErrClosed, and later calls get ErrClosed. Close does not
// close the Redis client. It is safe to call more than once; it returns nil.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	c.closed.Store(true)
	if c.flight != nil {
		c.flight.cancel(ErrClosed)
	}
	c.local.Store(nil)
	c.mu.Unlock()
	_ = c.notices.Close() // ends the fan-out goroutine; errors only say it was closed
	c.wg.Wait()
	return nil
}
