package token

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/fakeclock"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

func TestColdStartFetchesOnce(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	const replicas, perReplica = 10, 50
	caches := make([]*Cache, replicas)
	for i := range caches {
		caches[i] = newReplica(t, db, u.source(t), fast(), zaptest.NewLogger(t))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	start := make(chan struct{})
	got := make([]string, replicas*perReplica)
	errs := make([]error, replicas*perReplica)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			<-start
			got[i], errs[i] = caches[i%replicas].Get(ctx)
		})
	}
	close(start)
	wg.Wait()

	for i := range got {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, got[0], got[i], "caller %d", i)
	}
	require.EqualValues(t, 1, u.Issued.Load(), "token fetches")
	require.Equal(t, http.StatusOK, u.Call(t, got[0]))
}

func TestRefreshesOncePerExpiry(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3) // 3s tokens: stored for 2.5s, due after 1.5s
	cfg := fast()
	cfg.RefreshBefore = time.Second
	cfg.Skew = 500 * time.Millisecond
	key := testKey(db)

	// A fetch while Redis holds a token that is not yet due would be a
	// second fetch for the same expiry.
	var early atomic.Int64
	u.OnIssue(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if db.Client.PTTL(ctx, key).Val() > cfg.RefreshBefore {
			early.Add(1)
		}
	})

	const replicas, perReplica = 5, 4
	var (
		mu      sync.Mutex
		served  = make(map[string]bool)
		failed  []error
		invalid int
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for i := range replicas {
		c := newReplica(t, db, u.source(t), cfg, nil)
		for range perReplica {
			wg.Go(func() {
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for {
					tok, err := c.Get(t.Context())
					ok := err == nil && u.Valid(tok)
					mu.Lock()
					switch {
					case err != nil:
						failed = append(failed, fmt.Errorf("replica %d: %w", i, err))
					case !ok:
						invalid++
					default:
						served[tok] = true
					}
					mu.Unlock()
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			})
		}
	}
	const want = 4 // a cold start and three refreshes
	allServed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		toks := u.Tokens()
		for _, tok := range toks {
			if !served[tok] {
				return false
			}
		}
		return len(toks) >= want
	}
	waitFor(t, 20*time.Second, allServed)
	close(stop)
	wg.Wait()

	require.Empty(t, failed)
	require.Zero(t, invalid, "tokens served that the upstream refused")
	require.Zero(t, early.Load(), "fetches while a token that was not due was stored")
	// Every fetch produced a token that was served: none was wasted.
	require.Len(t, served, int(u.Issued.Load()))
}

func TestCrashedRefresherIsReplaced(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	key := testKey(db)
	// A refresher died holding the lock: its lease has a second left.
	require.NoError(t, db.Client.Set(t.Context(), lockKey(key), "crashed", time.Second).Err())
	var ownerAtFetch atomic.Value
	u.OnIssue(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ownerAtFetch.Store(db.Client.Get(ctx, lockKey(key)).Val())
	})

	const replicas, perReplica = 5, 10
	caches := make([]*Cache, replicas)
	for i := range caches {
		caches[i] = newReplica(t, db, u.source(t), fast(), nil) // WaitTimeout 10s
	}
	got := make([]string, replicas*perReplica)
	errs := make([]error, replicas*perReplica)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = caches[i%replicas].Get(t.Context()) })
	}
	wg.Wait()

	for i := range got {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, got[0], got[i], "caller %d", i)
	}
	require.EqualValues(t, 1, u.Issued.Load())
	owner, _ := ownerAtFetch.Load().(string)
	require.NotEmpty(t, owner)
	require.NotEqual(t, "crashed", owner, "fetched without taking over the lock")
	require.Equal(t, http.StatusOK, u.Call(t, got[0]))
}

func TestStuckRefresherIsReplaced(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	// Replica A's upstream hangs: its fetch is cut off after its LockTTL.
	cfg := fast()
	cfg.LockTTL = time.Second
	entered := make(chan struct{}, 1)
	stuck := SourceFunc(func(ctx context.Context) (Token, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return Token{}, ctx.Err()
	})
	a := newReplica(t, db, stuck, cfg, nil)
	aErr := make(chan error, 1)
	go func() {
		_, err := a.Get(t.Context())
		aErr <- err
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("replica A did not start fetching")
	}

	const replicas, perReplica = 4, 10
	caches := make([]*Cache, replicas)
	for i := range caches {
		caches[i] = newReplica(t, db, u.source(t), fast(), nil)
	}
	got := make([]string, replicas*perReplica)
	errs := make([]error, replicas*perReplica)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = caches[i%replicas].Get(t.Context()) })
	}
	wg.Wait()

	for i := range got {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, got[0], got[i], "caller %d", i)
	}
	require.EqualValues(t, 1, u.Issued.Load())
	err := <-aErr
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestInvalidateStormRefreshesOnce(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	const replicas, perReplica = 5, 20
	caches := make([]*Cache, replicas)
	for i := range caches {
		caches[i] = newReplica(t, db, u.source(t), fast(), nil)
	}
	n := replicas * perReplica

	// Every caller holds the first token when the upstream revokes it.
	first := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range first {
		wg.Go(func() { first[i], errs[i] = caches[i%replicas].Get(t.Context()) })
	}
	wg.Wait()
	for i := range first {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, first[0], first[i], "caller %d", i)
	}
	u.Revoke(first[0])

	// All of them get a 401, invalidate that token and try again.
	got := make([]string, n)
	for i := range got {
		wg.Go(func() {
			c := caches[i%replicas]
			errs[i] = func() error {
				if status := u.Call(t, first[i]); status != http.StatusUnauthorized {
					return fmt.Errorf("first call: status %d, want 401", status)
				}
				if err := c.Invalidate(t.Context(), first[i]); err != nil {
					return err
				}
				var err error
				if got[i], err = c.Get(t.Context()); err != nil {
					return err
				}
				if status := u.Call(t, got[i]); status != http.StatusOK {
					return fmt.Errorf("retry: status %d, want 200", status)
				}
				return nil
			}()
		})
	}
	wg.Wait()

	for i := range got {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, got[0], got[i], "caller %d", i)
	}
	require.NotEqual(t, first[0], got[0])
	require.EqualValues(t, 2, u.Issued.Load(), "one fetch at start, one after the 401s")
}

func TestInvalidateDeletesOnlyThatToken(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	key := testKey(db)
	c := newReplica(t, db, noFetch(t), fast(), nil)
	require.NoError(t, db.Client.Set(t.Context(), key, "new-token", time.Minute).Err())

	require.NoError(t, c.Invalidate(t.Context(), "old-token"))
	require.Equal(t, "new-token", db.Client.Get(t.Context(), key).Val())

	require.NoError(t, c.Invalidate(t.Context(), "new-token"))
	require.Zero(t, db.Client.Exists(t.Context(), key).Val())
}

func TestStaleTokenServedWhileRefreshing(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	key := testKey(db)
	// Due (under RefreshBefore's 50 min) but valid for 40 min more: a
	// loaded machine's stalls cannot outlast it, as they could a few
	// seconds. The upstream's hour-long token is not due.
	cfg := fast()
	cfg.RefreshBefore = 50 * time.Minute
	require.NoError(t, db.Client.Set(t.Context(), key, "stale-token", 40*time.Minute).Err())
	u.Block()
	c := newReplica(t, db, u.source(t), cfg, nil)

	// A Get that waited for the blocked refresh would wait until this
	// deadline: any bound below the test's own timeout tells the two apart,
	// and a long one holds on a loaded machine.
	get := func() (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return c.Get(ctx)
	}
	tok, err := get()
	require.NoError(t, err)
	require.Equal(t, "stale-token", tok)
	u.waitStarted(t, 30*time.Second) // the background refresh is at the upstream

	tok, err = get()
	require.NoError(t, err)
	require.Equal(t, "stale-token", tok, "while the refresh is blocked")

	u.Unblock()
	waitFor(t, 30*time.Second, func() bool {
		tok, err := get()
		return err == nil && tok != "stale-token"
	})
	require.EqualValues(t, 1, u.Issued.Load())
}

func TestUnavailableAfterWaitTimeout(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	// A lease another replica may hold: at most fast()'s LockTTL (a longer
	// one is taken over, TestStaleRefreshLockIsTakenOver).
	require.NoError(t, db.Client.Set(t.Context(), lockKey(testKey(db)), "someone-else", fast().LockTTL).Err())
	cfg := fast()
	cfg.WaitTimeout = 300 * time.Millisecond
	c := newReplica(t, db, noFetch(t), cfg, nil)

	_, err := c.Get(t.Context())
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, errLockHeld)
}

func TestGetHonoursContext(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	require.NoError(t, db.Client.Set(t.Context(), lockKey(testKey(db)), "someone-else", fast().LockTTL).Err())
	c := newReplica(t, db, noFetch(t), fast(), nil) // WaitTimeout 10s

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestSourceFailureBacksOff(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	u.FailTokens.Store(true)
	cfg := fast()
	cfg.FailureBackoff = 300 * time.Millisecond
	a := newReplica(t, db, u.source(t), cfg, nil)
	b := newReplica(t, db, u.source(t), cfg, nil)

	_, err := a.Get(t.Context())
	require.ErrorIs(t, err, ErrUnavailable)
	var re *EndpointError
	require.ErrorAs(t, err, &re)
	require.Equal(t, http.StatusServiceUnavailable, re.StatusCode)
	// The failed refresher keeps the lock for the backoff.
	pttl := db.Client.PTTL(t.Context(), lockKey(testKey(db))).Val()
	require.Greater(t, pttl, time.Duration(0))
	require.LessOrEqual(t, pttl, cfg.FailureBackoff)

	u.FailTokens.Store(false)
	tok, err := b.Get(t.Context()) // waits out the backoff, then fetches
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, u.Call(t, tok))
	require.EqualValues(t, 2, u.TokenRequests.Load(), "one failed request, one good")
}

func TestRejectsUnusableTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tok  Token
	}{
		{name: "empty value", tok: Token{ExpiresIn: time.Hour}},
		{name: "no lifetime", tok: Token{Value: "x"}},
		{name: "negative lifetime", tok: Token{Value: "x", ExpiresIn: -time.Second}},
		{name: "not longer than skew plus refresh before", tok: Token{Value: "x", ExpiresIn: 15 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			src := SourceFunc(func(context.Context) (Token, error) { return tt.tok, nil })
			c := newReplica(t, db, src, fast(), nil) // Skew 5s, RefreshBefore 10s

			_, err := c.Get(t.Context())
			require.ErrorIs(t, err, ErrUnavailable)
			require.ErrorIs(t, err, ErrBadToken)
			require.Zero(t, db.Client.Exists(t.Context(), testKey(db)).Val())
		})
	}
}

func TestLocalCopyRespectsExpiry(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	key := testKey(db)
	clk := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := db.NewClient(t)
	hook := &countHook{}
	rdb.AddHook(hook)
	// RefreshBefore is 10s; LocalMaxAge is long so only the expiry matters.
	c, err := New(rdb, noFetch(t), Config{Key: key, LocalMaxAge: time.Hour, Now: clk.Now}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	require.NoError(t, db.Client.Set(t.Context(), key, "first", time.Minute).Err())

	tok, err := c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "first", tok)
	require.NoError(t, db.Client.Set(t.Context(), key, "second", time.Minute).Err())
	trips := hook.n.Load()

	clk.Add(49 * time.Second) // 11s left: more than RefreshBefore
	tok, err = c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "first", tok, "served from the local copy")
	require.Equal(t, trips, hook.n.Load(), "no round trip for a fresh local copy")

	clk.Add(2 * time.Second) // 9s left: due, so Redis is asked
	tok, err = c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "second", tok)
}

func TestLocalCopyMaxAge(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	key := testKey(db)
	clk := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newReplica(t, db, noFetch(t), Config{LocalMaxAge: time.Second, Now: clk.Now}, nil)
	require.NoError(t, db.Client.Set(t.Context(), key, "first", time.Minute).Err())

	tok, err := c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "first", tok)
	require.NoError(t, db.Client.Set(t.Context(), key, "second", time.Minute).Err())

	tok, err = c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "first", tok)

	clk.Add(time.Second)
	tok, err = c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "second", tok)
}

func TestCloseStopsWaiters(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	require.NoError(t, db.Client.Set(t.Context(), lockKey(testKey(db)), "someone-else", time.Minute).Err())
	c := newReplica(t, db, noFetch(t), Config{WaitTimeout: time.Minute, LockTTL: time.Minute}, nil)

	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(t.Context())
		errc <- err
	}()
	waitFor(t, 5*time.Second, func() bool { return c.waiting.Load() == 1 })
	require.NoError(t, c.Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Get still waiting after Close")
	}
	_, err := c.Get(t.Context())
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, c.Invalidate(t.Context(), "x"), ErrClosed)
	require.NoError(t, c.Close(), "second Close")
}

func TestCloseHandsOverTheLock(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	cfg := fast()
	cfg.LockTTL = time.Minute // only a hand-over can let B in within its wait
	entered := make(chan struct{}, 1)
	stuck := SourceFunc(func(ctx context.Context) (Token, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return Token{}, ctx.Err()
	})
	a := newReplica(t, db, stuck, cfg, nil)
	b := newReplica(t, db, u.source(t), cfg, nil)
	aErr := make(chan error, 1)
	go func() {
		_, err := a.Get(t.Context())
		aErr <- err
	}()
	<-entered

	require.NoError(t, a.Close())
	require.ErrorIs(t, <-aErr, ErrClosed)
	require.Zero(t, db.Client.Exists(t.Context(), lockKey(testKey(db))).Val(), "lock released at once")
	tok, err := b.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, u.Call(t, tok))
}

func TestHooks(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	var refreshes, waits atomic.Int64
	cfg := fast()
	cfg.OnRefresh = func(d time.Duration, err error) {
		if err == nil && d > 0 {
			refreshes.Add(1)
		}
	}
	cfg.OnWait = func(d time.Duration) { waits.Add(1) }
	c := newReplica(t, db, u.source(t), cfg, nil)

	_, err := c.Get(t.Context())
	require.NoError(t, err)
	_, err = c.Get(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, refreshes.Load())
	require.EqualValues(t, 1, waits.Load(), "only the cold Get waited")
}

func TestLogsAndErrorsNeverShowSecrets(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	u := newUpstream(t, 3600)
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	key := testKey(db)
	var errs []error
	keep := func(_ string, err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}

	// Cold start across replicas, then a 401 and its refresh.
	a := newReplica(t, db, u.source(t), fast(), log)
	b := newReplica(t, db, u.source(t), fast(), log)
	tok, err := a.Get(t.Context())
	require.NoError(t, err)
	keep(b.Get(t.Context()))
	require.NoError(t, b.Invalidate(t.Context(), tok))
	keep(b.Get(t.Context()))

	// A replica with the wrong secret.
	bad := newReplica(t, db, u.sourceWith(t, "wrong-secret-value"), fast(), log)
	require.NoError(t, db.Client.Del(t.Context(), key).Err())
	_, err = bad.Get(t.Context())
	require.ErrorIs(t, err, ErrUnavailable)
	errs = append(errs, err)

	// The upstream fails while a due token is served: the background
	// refresh logs its failure.
	u.FailTokens.Store(true)
	require.NoError(t, db.Client.Set(t.Context(), key, "due-token-value", 5*time.Second).Err())
	c := newReplica(t, db, u.source(t), fast(), log)
	keep(c.Get(t.Context()))
	waitFor(t, 5*time.Second, func() bool {
		return logs.FilterMessage("background token refresh failed").Len() > 0
	})
	u.FailTokens.Store(false)
	waitFor(t, 5*time.Second, func() bool {
		tok, err := c.Get(t.Context())
		return err == nil && tok != "due-token-value"
	})

	require.NotZero(t, logs.FilterMessage("token refreshed").Len())
	require.Equal(t, fingerprint(u.Tokens()[0]),
		logs.FilterMessage("token refreshed").All()[0].ContextMap()["token_fp"])
	secrets := append(u.Tokens(), upstreamtest.ClientSecret, "wrong-secret-value", "due-token-value")
	for _, e := range logs.All() {
		text := fmt.Sprint(e.LoggerName, " ", e.Message, " ", e.ContextMap())
		for _, s := range secrets {
			require.NotContains(t, text, s)
		}
	}
	for _, err := range errs {
		for _, s := range secrets {
			require.NotContains(t, err.Error(), s)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	tests := []struct {
		name string
		cfg  Config
	}{
		{name: "no hash tag", cfg: Config{Key: "ow:token:upstream"}},
		{name: "empty hash tag", cfg: Config{Key: "ow:token:{}"}},
		{name: "unclosed hash tag", cfg: Config{Key: "ow:token:{upstream"}},
		{name: "negative skew", cfg: Config{Skew: -time.Second}},
		{name: "negative wait", cfg: Config{WaitTimeout: -time.Second}},
		{name: "negative lock TTL", cfg: Config{LockTTL: -time.Second}},
		{name: "fallback min above max", cfg: Config{FallbackMin: time.Second, FallbackMax: time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(db.Client, noFetch(t), tt.cfg, nil)
			require.Error(t, err)
		})
	}
	_, err := New(nil, noFetch(t), Config{}, nil)
	require.Error(t, err)
	_, err = New(db.Client, nil, Config{}, nil)
	require.Error(t, err)
}

func TestClientCredentials(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 3600)
	tok, err := u.source(t).Fetch(t.Context())
	require.NoError(t, err)
	require.True(t, u.Valid(tok.Value))
	require.InDelta(t, float64(time.Hour), float64(tok.ExpiresIn), float64(time.Second))

	_, err = u.sourceWith(t, "wrong").Fetch(t.Context())
	var re *EndpointError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "invalid_client", re.Code)

	for _, cfg := range []ClientCredentialsConfig{
		{ClientID: "id"},
		{TokenURL: "/relative", ClientID: "id"},
		{TokenURL: "https://auth.example/token"},
	} {
		_, err := ClientCredentials(cfg)
		require.Error(t, err)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := fingerprint("secret")
	require.Len(t, fp, 6)
	require.Equal(t, fp, fingerprint("secret"))
	require.NotEqual(t, fp, fingerprint("secret2"))
}

func TestNoticeWakesWaiters(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	key := testKey(db)
	require.NoError(t, db.Client.Set(t.Context(), lockKey(key), "refresher", time.Minute).Err())
	// Fallback re-reads are 10s apart: only the notice can deliver in time.
	c := newReplica(t, db, noFetch(t), Config{FallbackMin: 10 * time.Second, FallbackMax: 10 * time.Second, LockTTL: time.Minute}, nil)

	got := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		tok, err := c.Get(ctx)
		if err != nil {
			tok = err.Error()
		}
		got <- tok
	}()
	waitFor(t, 5*time.Second, func() bool { return c.waiting.Load() == 1 })
	require.NoError(t, storeScript.Run(t.Context(), db.Client, []string{key, lockKey(key)},
		"refresher", "published-token", time.Minute.Milliseconds(), channelName(key), "fp", 0).Err())
	require.Equal(t, "published-token", <-got)
}

func TestServesValidLocalCopyWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	key := "token:{upstream}"
	require.NoError(t, rdb.Set(t.Context(), key, "cached", time.Minute).Err())
	clk := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := New(rdb, noFetch(t), Config{Key: key, Now: clk.Now}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })

	tok, err := c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "cached", tok)
	p.Kill()

	clk.Add(2 * time.Second) // past LocalMaxAge: Get asks Redis, which is down
	tok, err = c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, "cached", tok)

	clk.Add(time.Minute) // expired: nothing left to serve
	_, err = c.Get(t.Context())
	require.ErrorIs(t, err, ErrUnavailable)
}

// A Redis user without the notice channel in its ACL (Redis 7's default for
// new users) still gets and stores tokens: the refused PUBLISH must not fail
// the store that happened, nor make the refresher fetch again.
func TestRefreshWithoutChannelPermission(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "ACL users")
	srv := redistest.Dedicated(t)
	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	admin := redis.NewClient(opts)
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "worker", "on", ">secret-pass", "~*", "+@all", "resetchannels").Err())
	opts.Username, opts.Password = "worker", "secret-pass"
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })

	u := newUpstream(t, 3600)
	cfg := fast()
	cfg.Key = "acl:token:{upstream}"
	var refreshErrs atomic.Int32
	cfg.OnRefresh = func(_ time.Duration, err error) {
		if err != nil {
			refreshErrs.Add(1)
		}
	}
	c, err := New(rdb, u.source(t), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	tok, err := c.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, u.Call(t, tok))
	stored, err := admin.Get(t.Context(), "acl:token:{upstream}").Result()
	require.NoError(t, err)
	require.Equal(t, tok, stored)
	require.EqualValues(t, 1, u.Issued.Load(), "fetched once")
	require.Zero(t, refreshErrs.Load(), "the refused notice failed the refresh")
}

// A refresh lock that no refresh can have set (a lease of a day, none at
// all, or a key of another type) is taken over at once, as the workers'
// Redis user that `producer acl worker` prints (ORDER_STORE=http): it must
// not wedge the refreshes until it expires. A lease that a refresh can
// have set is still waited for (TestCrashedRefresherIsReplaced).
func TestStaleRefreshLockIsTakenOver(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Worker, acl.Options{KeyPrefix: db.Prefix, OrderAPI: true})
	require.NoError(t, err)
	worker := db.AsUser(t, rules...)
	tests := []struct {
		name  string
		plant func(ctx context.Context, key string) error
	}{
		{"a day", func(ctx context.Context, key string) error {
			return db.Client.Set(ctx, key, "squatter", 24*time.Hour).Err()
		}},
		{"no expiry", func(ctx context.Context, key string) error { return db.Client.Set(ctx, key, "squatter", 0).Err() }},
		{"a hash", func(ctx context.Context, key string) error {
			return db.Client.HSet(ctx, key, "owner", "squatter").Err()
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, 3600)
			key := fmt.Sprintf("%stoken:{upstream}%d", db.Prefix, i)
			require.NoError(t, tt.plant(t.Context(), lockKey(key)))
			cfg := fast()
			cfg.Key, cfg.WaitTimeout = key, 3*time.Second
			core, logs := observer.New(zap.WarnLevel)
			c, err := New(worker.NewClient(t), u.source(t), cfg, zap.New(core))
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, c.Close()) })
			tok, err := c.Get(t.Context())
			require.NoError(t, err, "the stale lock wedged the refresh")
			require.Equal(t, http.StatusOK, u.Call(t, tok))
			require.EqualValues(t, 1, u.Issued.Load())
			require.Equal(t, 1, logs.FilterMessageSnippet("refresh lock taken over").Len())
			n, err := db.Client.Exists(t.Context(), lockKey(key)).Result()
			require.NoError(t, err)
			require.Zero(t, n, "the lock was released after the refresh")
		})
	}
}
