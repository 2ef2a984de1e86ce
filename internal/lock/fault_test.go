package lock_test

import (
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A release that cannot reach Redis (here: CLIENT PAUSE holds every command
// longer than the release may take) leaves the lock to its lease; the waiter
// still gets it within the TTL, never later, and never while the holder
// still holds it.
func TestClientPauseDuringRelease(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "CLIENT PAUSE")
	const ttl = 1500 * time.Millisecond
	holder := newLockerOn(t, db.NewClient(t), db, lock.Config{TTL: ttl, ReleaseTimeout: 300 * time.Millisecond})
	waiter := newLockerOn(t, db.NewClient(t), db, lock.Config{TTL: ttl})
	lease, err := holder.TryAcquire(t.Context(), "SO-pause", "holder")
	require.NoError(t, err)
	acquiredAt := time.Now()

	got := make(chan *lock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(t.Context(), "SO-pause", "waiter",
			lock.Wait{MinDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Deadline: 20 * time.Second})
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	require.Eventually(t, func() bool {
		return db.Client.HExists(t.Context(), db.Prefix+"lock:{SO-pause}", "w").Val()
	}, 5*time.Second, 2*time.Millisecond)

	admin := db.NewClient(t)
	require.NoError(t, admin.Do(t.Context(), "CLIENT", "PAUSE", 1000, "ALL").Err())
	err = lease.Release(t.Context())
	require.Error(t, err, "release cannot complete while Redis is paused")
	require.NotErrorIs(t, err, lock.ErrNotHeld)

	select {
	case l := <-got:
		require.Less(t, time.Since(acquiredAt), ttl+time.Second, "waiter got the lock within the lease (plus its retry delay)")
		require.Greater(t, l.Fence(), lease.Fence())
		require.NoError(t, l.Release(t.Context()))
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter never got the lock")
	}
}
