// Package token shares one upstream access token among all replicas of a
// service through Redis, and refreshes it with exactly one replica at a time.
//
// [Cache.Get] returns the current token, in this order:
//
//  1. A process-local copy, without a Redis round trip, while it has more
//     than Config.RefreshBefore left and was read less than
//     Config.LocalMaxAge ago.
//  2. Otherwise the token and its remaining TTL are read from Redis in one
//     round trip (a script). With more than RefreshBefore left, that is it.
//  3. Near expiry but still valid, the token is returned at once and a
//     refresh starts in the background (stale-while-refresh).
//  4. Missing, the caller waits for a refresh, up to Config.WaitTimeout.
//
// A refresh is single-flight within a process (one goroutine per [Cache],
// shared by all its callers) and across processes it is decided by a lock in
// Redis: one script re-checks the token and takes the lock only if the token
// still needs replacing. The lock holder fetches a token from its [Source]
// (OAuth2 client credentials by default, see [ClientCredentials]), stores it
// with a TTL of expires_in − Config.Skew, releases the lock and publishes a
// notice, all in one script. The other replicas wait for that notice on one
// shared subscription per Cache; a jittered fallback timer
// (Config.FallbackMin–FallbackMax, capped by the lock's remaining lease)
// re-reads the token and retries the lock, so a refresher that died leaves a
// lock that only delays the others until its lease (Config.LockTTL) ends.
//
// A 401 from the upstream should be answered with [Cache.Invalidate] of
// exactly the token that failed: it deletes the token only if Redis still
// holds that one, so a burst of 401s causes one refresh, not N.
//
// Tokens and secrets never appear in logs or error strings; logs carry a
// fingerprint (the first 6 hex digits of the token's SHA-256) at most.
//
// # Upstream failures
//
// When the Source fails, the refresher keeps the lock for
// Config.FailureBackoff instead of deleting it, and its own waiting callers
// get the error at once (wrapped in [ErrUnavailable]). The other replicas keep
// waiting and the first to retry the lock after the backoff asks the upstream
// again. So however many replicas and callers there are, the upstream sees at
// most one token request in flight (a fetch is cut off when its lease ends)
// and, while it fails, about one request per FailureBackoff at most.
//
// # Not for
//
// It caches one token per Config.Key: not per-user tokens, not refresh
// tokens, and not an http.RoundTripper; callers set the Authorization header
// themselves. It does not survive the loss of Redis: while Redis is
// unreachable, Get serves a still-valid local copy and otherwise fails with
// ErrUnavailable rather than asking the upstream from every replica.
package token

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// Errors returned by the package. Match them with errors.Is.
var (
	// ErrUnavailable is returned by Get when no token could be had: a wait
	// for a refresh outlasted Config.WaitTimeout or the caller's context,
	// the Source failed, or Redis could not be read and there was no valid
	// local copy. It wraps the cause (for example an *EndpointError,
	// a Redis error or context.DeadlineExceeded).
	//
	// Callers should treat it as retryable: back off and try again (in a
	// task handler, return it so the task is retried). The exception is an
	// error that also matches ErrBadToken, which a retry will not fix.
	ErrUnavailable = errors.New("token: unavailable")
	// ErrBadToken is wrapped, inside ErrUnavailable, when the Source returns
	// a token that cannot be used: an empty value, no lifetime, or a lifetime
	// not longer than Config.Skew + Config.RefreshBefore. It points at a
	// configuration mismatch with the upstream.
	ErrBadToken = errors.New("token: unusable token from source")
	// ErrClosed is returned by Get and Invalidate after Close, and by a Get
	// that was waiting when Close was called.
	ErrClosed = errors.New("token: cache closed")
)

// Token is an access token as a Source returns it.
type Token struct {
	// Value is the access token itself, e.g. what follows "Bearer ".
	Value string
	// ExpiresIn is how long the token is valid from when the Source
	// received it (the OAuth2 expires_in).
	ExpiresIn time.Duration
}

// Source fetches a new access token from the upstream. A Cache calls Fetch
// from one goroutine at a time, and with at most one Fetch in flight across
// all replicas that share the Redis key.
//
// Fetch must honour ctx: the Cache gives it a context that ends after
// Config.LockTTL, when another replica may take over the refresh.
type Source interface {
	Fetch(ctx context.Context) (Token, error)
}

// SourceFunc adapts a function to a [Source].
type SourceFunc func(ctx context.Context) (Token, error)

// Fetch calls f(ctx).
func (f SourceFunc) Fetch(ctx context.Context) (Token, error) { return f(ctx) }

var _ Source = SourceFunc(nil)

// fingerprint is what logs may show of a token: the first 6 hex digits of
// its SHA-256.
func fingerprint(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:3])
}
