package redistest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestSlotMatchesRedis(t *testing.T) {
	db := redistest.NewCluster(t)
	ctx := t.Context()
	for _, k := range []string{"", "a", "SO1", "ow:order:{SO1}", "ow:lock:{SO1}:fence", "{}x", "a{}{b}", "x{y", "asynq:{order_modify}:pending", "ü{ñ}"} {
		want, err := db.Client.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, int(want), redisproc.Slot(k), "slot of %q", k)
	}
}

func TestClusterOnEachMaster(t *testing.T) {
	db := redistest.NewCluster(t)
	ctx := t.Context()
	nos := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("SO%d", i) })
	require.Len(t, nos, 3)
	masters := db.Cluster.Masters()
	for i, no := range nos {
		key := db.Prefix + "order:{" + no + "}"
		require.Equal(t, masters[i], db.Cluster.MasterOf(key))
		require.NoError(t, db.Client.Set(ctx, key, "v", 0).Err())
		// The key is on that master, read without the cluster client.
		n := redis.NewClient(&redis.Options{Addr: masters[i]})
		v, err := n.Get(ctx, key).Result()
		_ = n.Close()
		require.NoError(t, err)
		assert.Equal(t, "v", v)
	}
}

func TestClusterCleanupDeletesPrefix(t *testing.T) {
	redistest.SkipShort(t, "a Redis Cluster")
	var prefix string
	var masters []string
	t.Run("writes", func(t *testing.T) {
		db := redistest.NewCluster(t)
		prefix, masters = db.Prefix, db.Cluster.Masters()
		for _, k := range db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("%sk%d", db.Prefix, i) }) {
			require.NoError(t, db.Client.Set(t.Context(), k, "v", 0).Err())
		}
	})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters})
	defer c.Close()
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, prefix+"*").Result()
		if err == nil && len(keys) > 0 {
			err = fmt.Errorf("%s kept %v", n.Options().Addr, keys)
		}
		return err
	})
	require.NoError(t, err)
}

func TestSentinelIsolatesTests(t *testing.T) {
	a, b := redistest.NewSentinel(t), redistest.NewSentinel(t)
	require.NotEqual(t, a.DB, b.DB)
	ctx := t.Context()
	require.NoError(t, a.Client.Set(ctx, "k", "a", 0).Err())
	n, err := b.Client.Exists(ctx, "k").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.True(t, strings.Contains(a.URL(), "master_name="+redisproc.MasterName), a.URL())
}

func TestSentinelFailover(t *testing.T) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, db.Client.Set(ctx, "k", "before", 0).Err())
	// WAIT makes the write reach the replica before the failover.
	require.NoError(t, db.Client.Do(ctx, "WAIT", 1, 5000).Err())

	start := time.Now()
	old, cur, err := db.Group.Failover(ctx)
	require.NoError(t, err)
	t.Logf("failover from %s to %s in %v", old, cur, time.Since(start).Round(time.Millisecond))
	require.NotEqual(t, old, cur)
	require.Contains(t, db.Group.Nodes(), cur)

	// The failover client follows: it writes to the new master.
	require.Eventually(t, func() bool {
		return db.Client.Set(ctx, "k", "after", 0).Err() == nil
	}, 30*time.Second, 20*time.Millisecond)
	n := redis.NewClient(&redis.Options{Addr: cur, DB: db.DB})
	defer n.Close()
	v, err := n.Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "after", v)
}

func TestClusterKillMasterAndRejoin(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("%sk%d", db.Prefix, i) })[1]
	shard := db.Cluster.ShardOf(key)
	require.Equal(t, 1, shard)
	require.NoError(t, db.Client.Set(ctx, key, "before", 0).Err())
	// WAIT makes the write reach the replica before the kill.
	require.NoError(t, db.Client.Do(ctx, "WAIT", 1, 5000).Err())

	start := time.Now()
	old, cur, err := db.Cluster.KillMaster(ctx, shard)
	require.NoError(t, err)
	t.Logf("shard %d: %s killed, %s took over in %v", shard, old, cur, time.Since(start).Round(time.Millisecond))
	require.NotEqual(t, old, cur)
	require.Equal(t, cur, db.Cluster.Masters()[shard])
	require.Equal(t, cur, db.Cluster.MasterOf(key))

	// The cluster client follows the new master (after a MOVED or a dial
	// error it reloads the slots), and the acknowledged write survived.
	require.Eventually(t, func() bool {
		v, err := db.Client.Get(ctx, key).Result()
		return err == nil && v == "before"
	}, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, db.Client.Set(ctx, key, "after", 0).Err())

	require.NoError(t, db.Cluster.Rejoin(ctx, old))
	n := redis.NewClient(&redis.Options{Addr: old})
	defer n.Close()
	require.NoError(t, n.Do(ctx, "READONLY").Err())
	require.Eventually(t, func() bool {
		v, err := n.Get(ctx, key).Result()
		return err == nil && v == "after"
	}, 30*time.Second, 20*time.Millisecond, "the old master replicates the new one")

	// Once back, the shard survives a second kill: the old master takes
	// its slots back.
	back, again, err := db.Cluster.KillMaster(ctx, shard)
	require.NoError(t, err)
	require.Equal(t, cur, back)
	require.Equal(t, old, again)
}
