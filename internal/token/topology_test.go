package token

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/conntest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// The tests in this file run the shared token cache on a real Redis Cluster
// and a real Sentinel group, each replica with a client built by redisconn
// from the URL, as the worker builds its own.

func topologyReplica(t *testing.T, url string, src Source, cfg Config) *Cache {
	t.Helper()
	c, err := New(conntest.Client(t, url), src, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// exerciseTokens checks, for the token key, that a cold start of several
// replicas fetches once and that a waiting replica is woken by the notice
// of a token stored by another.
func exerciseTokens(t *testing.T, url, key string) {
	t.Helper()
	u := newUpstream(t, 3600)
	cfg := fast()
	cfg.Key = key
	const replicas, perReplica = 4, 10
	caches := make([]*Cache, replicas)
	for i := range caches {
		caches[i] = topologyReplica(t, url, u.source(t), cfg)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make([]string, replicas*perReplica)
	errs := make([]error, len(got))
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = caches[i%replicas].Get(ctx) })
	}
	wg.Wait()
	for i := range got {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, got[0], got[i], "caller %d", i)
	}
	require.EqualValues(t, 1, u.Issued.Load(), "token fetches for %s", key)
	require.Equal(t, http.StatusOK, u.Call(t, got[0]))

	// The notice: a replica with nothing cached waits for a refresher that
	// holds the lock; fallback re-reads are 10 s apart, so only the notice
	// delivers in time.
	rdb := conntest.Client(t, url)
	require.NoError(t, rdb.Del(ctx, key).Err())
	require.NoError(t, rdb.Set(ctx, lockKey(key), "refresher", time.Minute).Err())
	c := topologyReplica(t, url, noFetch(t), Config{Key: key, FallbackMin: 10 * time.Second, FallbackMax: 10 * time.Second, LockTTL: time.Minute})
	res := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		tok, err := c.Get(ctx)
		if err != nil {
			tok = err.Error()
		}
		res <- tok
	}()
	waitFor(t, 5*time.Second, func() bool { return c.waiting.Load() == 1 })
	require.NoError(t, storeScript.Run(ctx, rdb, []string{key, lockKey(key)},
		"refresher", "published-token", time.Minute.Milliseconds(), channelName(key), "fp", 0).Err())
	require.Equal(t, "published-token", <-res)
}

func TestTokensOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	// The deployment's key form, with its hash tag on every master in turn.
	keys := db.Cluster.OnEachMaster(func(i int) string { return db.Prefix + "token:{upstream" + strconv.Itoa(i) + "}" })
	for i, key := range keys {
		t.Run("master"+strconv.Itoa(i), func(t *testing.T) { exerciseTokens(t, db.URL(), key) })
	}
}

func TestTokensOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	exerciseTokens(t, db.URL(), db.Prefix+"token:{upstream}")
}
