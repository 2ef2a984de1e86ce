package token

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// upstream is the fake upstream's token endpoint as the tests use it, with
// a real protected endpoint (upstreamtest.Server.Call) that refuses
// expired, revoked and unknown tokens.
type upstream struct{ *upstreamtest.Server }

func newUpstream(t testing.TB, expiresIn int64) upstream {
	t.Helper()
	u := upstream{upstreamtest.New(t, nil)}
	u.ExpiresIn.Store(expiresIn)
	return u
}

// source returns a new client credentials Source for the upstream, as one
// replica would have.
func (u upstream) source(t testing.TB) Source {
	t.Helper()
	return u.sourceWith(t, upstreamtest.ClientSecret)
}

func (u upstream) sourceWith(t testing.TB, secret string) Source {
	t.Helper()
	src, err := ClientCredentials(ClientCredentialsConfig{
		TokenURL:     u.TokenURL(),
		ClientID:     upstreamtest.ClientID,
		ClientSecret: secret,
		Scopes:       []string{"orders"},
		AuthStyle:    oauth2.AuthStyleInHeader,
		HTTPClient:   u.Client(),
	})
	require.NoError(t, err)
	return src
}

// waitStarted waits until a token request reaches the upstream.
func (u upstream) waitStarted(t testing.TB, limit time.Duration) {
	t.Helper()
	select {
	case <-u.TokenStarted:
	case <-time.After(limit):
		t.Fatalf("no token request within %v", limit)
	}
}

// testKey is the token key of a test, under its prefix.
func testKey(db *redistest.DB) string { return db.Prefix + "token:{upstream}" }

// newReplica returns a Cache on a Redis client of its own (as a separate
// process would have), closed at cleanup. An empty cfg.Key means testKey.
func newReplica(t testing.TB, db *redistest.DB, src Source, cfg Config, log *zap.Logger) *Cache {
	t.Helper()
	if cfg.Key == "" {
		cfg.Key = testKey(db)
	}
	c, err := New(db.NewClient(t), src, cfg, log)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// fast is a config scaled down for tests.
func fast() Config {
	return Config{
		LockTTL:        5 * time.Second,
		WaitTimeout:    10 * time.Second,
		FallbackMin:    10 * time.Millisecond,
		FallbackMax:    50 * time.Millisecond,
		FailureBackoff: 100 * time.Millisecond,
	}
}

// waitFor polls cond until it holds or the limit passes.
func waitFor(t testing.TB, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		<-tick.C
	}
}

// countHook counts the round trips a client makes.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// noFetch is a Source for tests where the Cache must not fetch.
func noFetch(t testing.TB) Source {
	return SourceFunc(func(context.Context) (Token, error) {
		t.Errorf("unexpected fetch from the source")
		return Token{}, context.Canceled
	})
}
