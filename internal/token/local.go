package token

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// LocalConfig tunes a [Local]. The zero value is valid and means all
// defaults, those of [Config]'s fields of the same names.
type LocalConfig struct {
	// RefreshBefore is how much remaining lifetime makes the token due: a
	// due token is fetched again by the next Get, which serves the due
	// one if the fetch fails. Defaults to 10s.
	RefreshBefore time.Duration
	// Skew is taken off the Source's expires_in (capped at 24h). Defaults
	// to 5s.
	Skew time.Duration
	// WaitTimeout bounds a fetch that a caller waits for. Defaults to 15s.
	WaitTimeout time.Duration
	// Now is the clock of the token's expiry. Defaults to time.Now.
	Now func() time.Time
}

// Local hands out an access token that it keeps in this process only: it
// shares nothing through Redis and needs no Redis right at all. It is for
// the processes that only read through the order API (the intake, the
// dashboard, the command line), so that no Redis user but the workers'
// may read, delete or wedge the workers' shared token ([Cache]); give
// those processes a client of their own at the identity provider, with
// read rights only, where it can issue one.
//
// A Local fetches from its Source when it has no token that is not due
// (one fetch at a time: callers that need one meanwhile wait for it, at
// most WaitTimeout or their context), and drops the token Invalidate
// names. It is safe for concurrent use and starts no goroutine.
type Local struct {
	src Source
	cfg LocalConfig
	sem chan struct{} // the fetch's turn: one at a time

	mu     sync.Mutex
	cur    *entry
	closed bool
}

// NewLocal returns a Local that fetches from src. It returns an error for a
// nil src or a negative duration.
func NewLocal(src Source, cfg LocalConfig) (*Local, error) {
	if src == nil {
		return nil, errors.New("token: nil source")
	}
	cfg.RefreshBefore = cmp.Or(cfg.RefreshBefore, DefaultRefreshBefore)
	cfg.Skew = cmp.Or(cfg.Skew, 5*time.Second)
	cfg.WaitTimeout = cmp.Or(cfg.WaitTimeout, DefaultWaitTimeout)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RefreshBefore < 0 || cfg.Skew < 0 || cfg.WaitTimeout < 0 {
		return nil, errors.New("token: negative duration in config")
	}
	return &Local{src: src, cfg: cfg, sem: make(chan struct{}, 1)}, nil
}

// usable returns the current token when it is not due, or "".
func (l *Local) usable(now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil && l.cur.expires.Sub(now) > l.cfg.RefreshBefore {
		return l.cur.value
	}
	return ""
}

// Get returns the access token, fetching one when there is none that is
// not due. It returns [ErrClosed] after Close, and [ErrUnavailable]
// wrapping the cause (the Source's error, [ErrBadToken], the end of ctx or
// of WaitTimeout) when it has no valid token to give.
func (l *Local) Get(ctx context.Context) (string, error) {
	if tok := l.usable(l.cfg.Now()); tok != "" {
		return tok, nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, l.cfg.WaitTimeout, fmt.Errorf("no token within WaitTimeout (%v)", l.cfg.WaitTimeout))
	defer cancel()
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
	defer func() { <-l.sem }()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return "", ErrClosed
	}
	now := l.cfg.Now()
	if tok := l.usable(now); tok != "" {
		return tok, nil // fetched by the caller before us
	}
	tok, err := l.src.Fetch(ctx)
	var life time.Duration
	if err == nil {
		life, err = lifetime(tok, l.cfg.Skew, l.cfg.RefreshBefore)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.cur != nil && l.cur.valid(l.cfg.Now()) {
			return l.cur.value, nil // due, but still good
		}
		return "", fmt.Errorf("%w: fetch: %w", ErrUnavailable, err)
	}
	l.cur = &entry{value: tok.Value, expires: now.Add(life), read: now}
	return tok.Value, nil
}

// Invalidate drops tok, when it is the current token, so that the next Get
// fetches another. It returns ErrClosed after Close, and nil otherwise.
func (l *Local) Invalidate(_ context.Context, tok string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.cur != nil && l.cur.value == tok {
		l.cur = nil
	}
	return nil
}

// Close drops the token; later calls return ErrClosed. It returns nil.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed, l.cur = true, nil
	return nil
}

// lifetime checks a token from a Source and returns how long to keep it:
// its expires_in, capped at maxLifetime, less skew; it must be longer than
// refreshBefore.
func lifetime(tok Token, skew, refreshBefore time.Duration) (time.Duration, error) {
	switch {
	case tok.Value == "":
		return 0, fmt.Errorf("%w: empty value", ErrBadToken)
	case tok.ExpiresIn <= 0:
		return 0, fmt.Errorf("%w: no lifetime (expires_in)", ErrBadToken)
	}
	l := min(tok.ExpiresIn, maxLifetime) - skew
	if l <= refreshBefore {
		return 0, fmt.Errorf("%w: lifetime %v is not longer than Skew + RefreshBefore (%v)", ErrBadToken, tok.ExpiresIn, skew+refreshBefore)
	}
	return l, nil
}
