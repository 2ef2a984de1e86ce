package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// The switches that lose no acknowledged write (redisproc's failover.go):
// a client increments a counter through each, and the counter on the new
// master is at least the number of increments Redis acknowledged.

// incrementer INCRs key from its own goroutine until stopped, counting the
// increments Redis acknowledged; an error (the switch) is retried.
type incrementer struct {
	acked int64
	ok    chan struct{} // receives after each acknowledged increment
	stop  chan struct{}
	done  chan struct{}
}

func startIncrementer(ctx context.Context, c redis.Cmdable, key string) *incrementer {
	in := &incrementer{ok: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(in.done)
		for {
			select {
			case <-in.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			if c.Incr(ctx, key).Err() == nil {
				in.acked++
				select {
				case in.ok <- struct{}{}:
				default:
				}
			}
		}
	}()
	return in
}

// waitAcked waits for one more acknowledged increment (the client works
// again after a switch).
func (in *incrementer) waitAcked(t *testing.T) {
	t.Helper()
	select {
	case <-in.ok:
	case <-time.After(30 * time.Second):
		t.Fatal("no increment acknowledged for 30 s")
	}
	select { // and one sent after that
	case <-in.ok:
	case <-time.After(30 * time.Second):
		t.Fatal("no increment acknowledged for 30 s")
	}
}

// end stops the incrementer and returns its count.
func (in *incrementer) end() int64 {
	close(in.stop)
	<-in.done
	return in.acked
}

func requireCount(t *testing.T, ctx context.Context, addr string, db int, key string, acked int64) {
	t.Helper()
	n := redis.NewClient(&redis.Options{Addr: addr, DB: db})
	defer n.Close()
	v, err := n.Get(ctx, key).Int64()
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, acked, "acknowledged increments lost")
	t.Logf("%d increments acknowledged, counter at %d", acked, v)
}

func TestClusterFailoverLosesNoWrite(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("%sk%d", db.Prefix, i) })[2]
	shard := db.Cluster.ShardOf(key)
	in := startIncrementer(ctx, db.Client, key)
	in.waitAcked(t)

	start := time.Now()
	old, cur, err := db.Cluster.Failover(ctx, shard)
	require.NoError(t, err)
	t.Logf("shard %d: CLUSTER FAILOVER from %s to %s in %v", shard, old, cur, time.Since(start).Round(time.Millisecond))
	require.NotEqual(t, old, cur)
	require.Equal(t, cur, db.Cluster.MasterOf(key))
	in.waitAcked(t)
	requireCount(t, ctx, cur, 0, key, in.end())

	// The old master is the new one's replica: the shard can switch back.
	back, again, err := db.Cluster.Failover(ctx, shard)
	require.NoError(t, err)
	require.Equal(t, cur, back)
	require.Equal(t, old, again)
}

func TestClusterKillMasterInSyncLosesNoWrite(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("%sk%d", db.Prefix, i) })[0]
	shard := db.Cluster.ShardOf(key)
	in := startIncrementer(ctx, db.Client, key)
	in.waitAcked(t)

	start := time.Now()
	old, cur, err := db.Cluster.KillMasterInSync(ctx, shard)
	require.NoError(t, err)
	t.Logf("shard %d: %s paused until in sync, killed, %s took over in %v", shard, old, cur, time.Since(start).Round(time.Millisecond))
	in.waitAcked(t)
	requireCount(t, ctx, cur, 0, key, in.end())
	require.NoError(t, db.Cluster.Rejoin(ctx, old))
}

func TestSentinelFailoverInSyncLosesNoWrite(t *testing.T) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	in := startIncrementer(ctx, db.Client, "k")
	in.waitAcked(t)

	// Twice: the second one switches back to the first master, which the
	// first switch made a replica in sync.
	var first string
	for i := range 2 {
		start := time.Now()
		old, cur, err := db.Group.FailoverInSync(ctx)
		require.NoError(t, err)
		t.Logf("failover %d from %s to %s in %v", i+1, old, cur, time.Since(start).Round(time.Millisecond))
		require.NotEqual(t, old, cur)
		if i == 0 {
			first = old
		} else {
			require.Equal(t, first, cur)
		}
		in.waitAcked(t)
	}
	cur, err := db.Group.Master(ctx)
	require.NoError(t, err)
	requireCount(t, ctx, cur, db.DB, "k", in.end())
}

// TestSentinelFailoverWhenReadyTwice: the second plain failover waits until
// the sentinels have made the old master a replica in sync (promoting it
// earlier would lose every write since the first).
func TestSentinelFailoverWhenReadyTwice(t *testing.T) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	first, cur, waited, err := db.Group.FailoverWhenReady(ctx)
	require.NoError(t, err)
	t.Logf("failover 1 from %s to %s after %v waiting for the replica", first, cur, waited.Round(time.Millisecond))
	require.NoError(t, db.Client.Set(ctx, "k", "between", 0).Err())
	old, back, waited, err := db.Group.FailoverWhenReady(ctx)
	require.NoError(t, err)
	t.Logf("failover 2 from %s to %s after %v waiting for the replica", old, back, waited.Round(time.Millisecond))
	require.Equal(t, cur, old)
	require.Equal(t, first, back)
	n := redis.NewClient(&redis.Options{Addr: back, DB: db.DB})
	defer n.Close()
	v, err := n.Get(ctx, "k").Result()
	require.NoError(t, err)
	require.Equal(t, "between", v, "the write between the failovers reached the node promoted second")
}

// TestSentinelFailoverAfterLagLosesTheLag: the nemesis does lose what the
// master acknowledged while its replica's link was cut, and leaves a
// group whose new master has a replica in sync (a WAIT for one replica is
// met), twice in a row.
func TestSentinelFailoverAfterLagLosesTheLag(t *testing.T) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 2 {
		in := startIncrementer(ctx, db.Client, fmt.Sprintf("k%d", i))
		in.waitAcked(t)
		start := time.Now()
		old, cur, err := db.Group.FailoverAfterLag(ctx, time.Second)
		require.NoError(t, err)
		t.Logf("failover %d after a 1 s lag, from %s to %s in %v", i+1, old, cur, time.Since(start).Round(time.Millisecond))
		require.NotEqual(t, old, cur)
		in.waitAcked(t)
		acked := in.end()
		n := redis.NewClient(&redis.Options{Addr: cur, DB: db.DB})
		v, err := n.Get(ctx, fmt.Sprintf("k%d", i)).Int64()
		require.NoError(t, err)
		require.Less(t, v, acked, "the lag's acknowledged increments are lost")
		t.Logf("%d increments acknowledged, %d kept", acked, v)
		got, err := n.Do(ctx, "WAIT", 1, 1000).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(1), got, "the new master has a replica again")
		_ = n.Close()
	}
}

// TestClusterFailoverAfterLagLosesTheLag: the Cluster's nemesis does lose
// what the shard's master acknowledged while its replica's link was cut,
// and leaves the shard with a replica in sync (a WAIT for one replica is
// met), twice in a row on the same shard (the second switches back to the
// first master, which rejoined empty).
func TestClusterFailoverAfterLagLosesTheLag(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	key := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("%sk%d", db.Prefix, i) })[1]
	shard := db.Cluster.ShardOf(key)
	var first string
	for i := range 2 {
		in := startIncrementer(ctx, db.Client, key)
		in.waitAcked(t)
		start := time.Now()
		old, cur, err := db.Cluster.FailoverAfterLag(ctx, shard, time.Second)
		require.NoError(t, err)
		t.Logf("shard %d, failover %d after a 1 s lag, from %s to %s in %v", shard, i+1, old, cur, time.Since(start).Round(time.Millisecond))
		require.NotEqual(t, old, cur)
		require.Equal(t, cur, db.Cluster.MasterOf(key))
		if i == 0 {
			first = old
		} else {
			require.Equal(t, first, cur, "the second switch promotes the first master, rejoined")
		}
		in.waitAcked(t)
		acked := in.end()
		n := redis.NewClient(&redis.Options{Addr: cur})
		v, err := n.Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Less(t, v, acked, "the lag's acknowledged increments are lost")
		t.Logf("%d increments acknowledged, %d kept", acked, v)
		got, err := n.Do(ctx, "WAIT", 1, 1000).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(1), got, "the new master has a replica again")
		_ = n.Close()
		// The next round counts from what the new master kept.
		require.NoError(t, db.Client.Del(ctx, key).Err())
	}
}

// A Cluster whose replicas' clocks are behind: a replica promoted by the
// lag's nemesis serves a TIME that far behind the machine's.
func TestClusterReplicaBehindIsPromotedBehind(t *testing.T) {
	redistest.SkipShort(t, "a Redis Cluster")
	c, err := redisproc.StartClusterBehind(30 * time.Second)
	if errors.Is(err, redisproc.ErrNoFaketime) && os.Getenv("CI") == "" {
		t.Skipf("needs libfaketime: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	old, cur, err := c.FailoverAfterLag(ctx, 0, time.Second)
	require.NoError(t, err)
	for addr, behind := range map[string]bool{old: false, cur: true} {
		n := redis.NewClient(&redis.Options{Addr: addr})
		tm, err := n.Time(ctx).Result()
		_ = n.Close()
		require.NoError(t, err)
		skew := time.Since(tm)
		if behind {
			require.InDelta(t, 30, skew.Seconds(), 5, "the promoted replica's clock is 30 s behind")
		} else {
			require.InDelta(t, 0, skew.Seconds(), 5, "the old master's clock is the machine's")
		}
	}
}

// A Sentinel group whose replica's clock is behind: once promoted, its
// TIME is that far behind the machine's (libfaketime with the allocator
// shim; Debian's redis-server would deadlock under libfaketime alone).
func TestSentinelReplicaBehindIsPromotedBehind(t *testing.T) {
	redistest.SkipShort(t, "a Sentinel group")
	g, err := redisproc.StartSentinelBehind(30 * time.Second)
	if errors.Is(err, redisproc.ErrNoFaketime) && os.Getenv("CI") == "" {
		t.Skipf("needs libfaketime: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(g.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	old, cur, err := g.FailoverAfterLag(ctx, time.Second)
	require.NoError(t, err)
	for addr, behind := range map[string]bool{old: false, cur: true} {
		c := redis.NewClient(&redis.Options{Addr: addr})
		tm, err := c.Time(ctx).Result()
		_ = c.Close()
		require.NoError(t, err)
		skew := time.Since(tm)
		if behind {
			require.InDelta(t, 30, skew.Seconds(), 5, "the promoted replica's clock is 30 s behind")
		} else {
			require.InDelta(t, 0, skew.Seconds(), 5, "the old master's clock is the machine's")
		}
	}
}
