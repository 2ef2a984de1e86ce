package keyorder_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/conntest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file run the lock on a real Redis Cluster and a real
// Sentinel group, with clients built by redisconn from URLs as the binaries
// build theirs.

func topologyLocker(t *testing.T, c redis.UniversalClient, prefix string) *keyorder.Locker {
	t.Helper()
	l, err := keyorder.New(space(t, c, prefix, keyorder.SeqConfig{}), keyorder.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

// handOver has holder take key, starts waiter's Acquire with one-minute
// random delays (so only a release notice can wake it in time), releases
// once the waiter has marked the lock, and requires the waiter to be woken
// by the notice with a newer fence. rdb reads the lock hash.
func handOver(t *testing.T, rdb redis.UniversalClient, holder, waiter *keyorder.Locker, prefix, key string) {
	t.Helper()
	ctx := t.Context()
	held, err := holder.TryAcquire(ctx, key, "holder")
	require.NoError(t, err)
	require.NoError(t, held.Refresh(ctx), "renewal on %s", key)

	got := make(chan *keyorder.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, key, "waiter", keyorder.Wait{MinDelay: time.Minute, MaxDelay: time.Minute, Deadline: 2 * time.Minute})
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	require.Eventually(t, func() bool {
		return rdb.HExists(ctx, prefix+"lock:{"+key+"}", "w").Val()
	}, 10*time.Second, 2*time.Millisecond, "waiter never marked %s", key)
	require.NoError(t, held.Release(ctx))
	select {
	case lease := <-got:
		st := lease.Stats()
		require.Equal(t, 1, st.WokenByNotice, "%s: %+v", key, st)
		require.Greater(t, lease.Fence(), held.Fence())
		require.NoError(t, lease.Release(ctx))
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: waiter not woken by the release notice", key)
	}
}

func TestLockOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	rdb := conntest.Client(t, db.URL())
	holder := topologyLocker(t, rdb, db.Prefix)
	waiter := topologyLocker(t, conntest.Client(t, db.URL()), db.Prefix)

	// One key on every master: the notices are published on each key's
	// node and must reach the waiter's subscription, which lives on the
	// node of the channel's slot.
	keys := db.Cluster.OnEachMaster(func(i int) string { return "SO" + strconv.Itoa(i) })
	channel := db.Prefix + "lock:released"
	t.Logf("keys %v on %v; the channel's slot is on %s", keys, db.Cluster.Masters(), db.Cluster.MasterOf(channel))
	for _, key := range keys {
		handOver(t, rdb, holder, waiter, db.Prefix, key)
	}
}

func TestLockOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	rdb := conntest.Client(t, db.URL())
	holder := topologyLocker(t, rdb, db.Prefix)
	waiter := topologyLocker(t, conntest.Client(t, db.URL()), db.Prefix)
	handOver(t, rdb, holder, waiter, db.Prefix, "SO1")
}

// After a Sentinel failover the Locker's notice subscription must follow the
// new master. SENTINEL FAILOVER leaves the old master running, as a master
// that nobody writes to, until the sentinels turn it into a replica at least
// 8 s later (only then does it drop its clients): a subscription left there
// hears no release notice in between.
func TestLockNoticeAfterSentinelFailover(t *testing.T) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	holderRDB := conntest.Client(t, db.URL())
	waiterRDB := conntest.Client(t, db.URL())
	holder := topologyLocker(t, holderRDB, db.Prefix)
	waiter := topologyLocker(t, waiterRDB, db.Prefix)
	handOver(t, holderRDB, holder, waiter, db.Prefix, "SO1") // the waiter is subscribed

	failedOver := time.Now()
	old, cur, err := db.Group.Failover(ctx)
	require.NoError(t, err)
	t.Logf("failed over from %s to %s", old, cur)

	// Both clients follow the new master (their first commands may still
	// fail while go-redis switches).
	_, curPort, _ := net.SplitHostPort(cur)
	for _, c := range []redis.UniversalClient{holderRDB, waiterRDB} {
		require.Eventually(t, func() bool {
			port, err := c.ConfigGet(ctx, "port").Result()
			return err == nil && port["port"] == curPort
		}, 30*time.Second, 10*time.Millisecond, "client never reached the new master")
	}
	// The waiter's subscription is on the new master well before the
	// sentinels would make the old master drop it.
	node := redis.NewClient(&redis.Options{Addr: cur})
	defer node.Close()
	channel := db.Prefix + "lock:released"
	require.Eventually(t, func() bool {
		n, err := node.PubSubNumSub(ctx, channel).Result()
		return err == nil && n[channel] >= 1
	}, 5*time.Second, 10*time.Millisecond, "subscription still not on the new master 5 s after the failover ended")
	t.Logf("subscription on the new master %v after the failover began", time.Since(failedOver).Round(time.Millisecond))

	handOver(t, holderRDB, holder, waiter, db.Prefix, "SO1")
	handOver(t, holderRDB, holder, waiter, db.Prefix, "SO2")
}
