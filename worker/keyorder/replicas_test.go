package keyorder_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// replicated starts a master and one replica whose link to the master
// goes through a fault proxy, and returns a client of the master and the
// proxy, once the replica is in sync.
func replicated(t *testing.T) (*redis.Client, *faultproxy.Proxy) {
	t.Helper()
	master := redistest.Dedicated(t)
	replica := redistest.Dedicated(t)
	proxy, err := faultproxy.New(master.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	t.Cleanup(func() { _ = mc.Close() })
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	require.NoError(t, rc.Do(t.Context(), "REPLICAOF", host, port).Err())
	require.Eventually(t, func() bool {
		info, err := rc.Info(t.Context(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 10*time.Millisecond, "the replica never synced")
	return mc, proxy
}

// With WaitReplicas, a lease's write goes out only once a replica has the
// key's state: while the replica's link is cut, the write is not sent and
// the error is no failure; once it heals, the write goes out.
func TestWriteWaitsForTheReplicas(t *testing.T) {
	t.Parallel()
	mc, proxy := replicated(t)
	l, err := keyorder.New(space(t, mc, "t:", keyorder.SeqConfig{}), keyorder.Config{WaitReplicas: 1, WaitTimeout: waitInReach})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	const key = "SO-wait"
	turns := reserve(t, l.Sequencer(), key, 1)
	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	defer func() { _ = lease.Release(context.Background()) }()

	writes := 0
	write := func() error { writes++; return nil }
	require.NoError(t, lease.WriteCaughtUp(t.Context(), write, nil))
	require.Equal(t, 1, writes, "confirmed: written")

	proxy.Blackhole()
	err = lease.WriteCaughtUp(t.Context(), write, nil)
	require.ErrorIs(t, err, keyorder.ErrNotReplicated)
	require.False(t, keyorder.IsFailure(err), "the change is not to blame")
	require.Equal(t, 1, writes, "not confirmed: not written")

	proxy.Heal()
	require.Eventually(t, func() bool {
		return lease.WriteCaughtUp(t.Context(), write, nil) == nil
	}, 10*time.Second, 10*time.Millisecond, "the write never went out after the heal")
	require.Equal(t, 2, writes)
}

// A catch-up is a write too: the write sent again after it waits for the
// replicas to have the new fence and offset, so that a second failover
// cannot hand them out again.
func TestWriteAfterACatchUpWaitsForTheReplicas(t *testing.T) {
	t.Parallel()
	mc, proxy := replicated(t)
	l, err := keyorder.New(space(t, mc, "t:", keyorder.SeqConfig{}), keyorder.Config{WaitReplicas: 1, WaitTimeout: waitInReach})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	const key = "SO-wait-ahead"
	turns := reserve(t, l.Sequencer(), key, 1)
	lease, err := l.AcquireTurn(t.Context(), key, "m", turns[0], slow)
	require.NoError(t, err)
	defer func() { _ = lease.Release(context.Background()) }()

	var fences []int64
	errPassed := errors.New("passed")
	write := func() error {
		fences = append(fences, lease.Fence())
		if len(fences) == 1 {
			// The store saw a newer fence; the replica goes away before
			// the write is sent again.
			proxy.Blackhole()
			return keyorder.WithAhead(errPassed, keyorder.StoreAhead{Fence: lease.Fence() + 10})
		}
		return nil
	}
	err = lease.WriteCaughtUp(t.Context(), write, nil)
	require.ErrorIs(t, err, keyorder.ErrNotReplicated, "the caught-up write waits for the replica")
	require.Len(t, fences, 1)
	proxy.Heal()
}

// WaitReplicas above what Redis has: no write goes out, and each attempt
// says why.
func TestWriteWithoutReplicasIsNotSent(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	const key = "SO-no-replica"
	lease, err := l.TryAcquire(t.Context(), key, "m")
	require.NoError(t, err)
	defer func() { _ = lease.Release(context.Background()) }()
	err = lease.WriteCaughtUp(t.Context(), func() error { t.Fatal("written unconfirmed"); return nil }, nil)
	require.ErrorIs(t, err, keyorder.ErrNotReplicated)
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged within 10ms")

	_, err = keyorder.New(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.Config{WaitReplicas: -1})
	require.ErrorContains(t, err, "negative WaitReplicas")
}

// The worker's Redis user may write the WAIT marker and WAIT: without a
// replica, the write is refused as unconfirmed, not for a permission.
func TestWriteWaitsForTheReplicasAsTheWorkersUser(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Worker, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	user := db.AsUser(t, rules...)
	l := newLockerOn(t, user.Client, db, keyorder.Config{WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "SO-acl-wait", "m")
	require.NoError(t, err)
	defer func() { _ = lease.Release(context.Background()) }()
	err = lease.WriteCaughtUp(t.Context(), func() error { return nil }, nil)
	require.ErrorIs(t, err, keyorder.ErrNotReplicated)
	require.NotContains(t, err.Error(), "NOPERM")
	require.ErrorContains(t, err, "0 of 1 replicas")
}

// BenchmarkWriteWaitsForTheReplicas is the cost of WaitReplicas per write,
// side by side on one master with one replica: a write that waits for
// the replica against one that does not (the write itself does nothing).
func BenchmarkWriteWaitsForTheReplicas(b *testing.B) {
	master := redistest.Dedicated(b)
	replica := redistest.Dedicated(b)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	b.Cleanup(func() { _ = mc.Close() })
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	b.Cleanup(func() { _ = rc.Close() })
	host, port, err := net.SplitHostPort(master.Addr())
	require.NoError(b, err)
	require.NoError(b, rc.Do(b.Context(), "REPLICAOF", host, port).Err())
	require.Eventually(b, func() bool {
		info, err := rc.Info(b.Context(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 10*time.Millisecond)
	for _, n := range []int{0, 1} {
		b.Run("WaitReplicas="+strconv.Itoa(n), func(b *testing.B) {
			l, err := keyorder.New(space(b, mc, "b:", keyorder.SeqConfig{}), keyorder.Config{WaitReplicas: n})
			require.NoError(b, err)
			defer func() { _ = l.Close() }()
			lease, err := l.TryAcquire(b.Context(), "SO-bench-"+strconv.Itoa(n), "m")
			require.NoError(b, err)
			defer func() { _ = lease.Release(context.Background()) }()
			for b.Loop() {
				if err := lease.WriteCaughtUp(b.Context(), func() error { return nil }, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// waitInReach is the WaitTimeout of the tests with a replica: one in reach
// acknowledges well within it, on a busy machine too.
const waitInReach = time.Second
