package keyorder_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
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
	holder := newLockerOn(t, db.NewClient(t), db, keyorder.Config{TTL: ttl, ReleaseTimeout: 300 * time.Millisecond})
	waiter := newLockerOn(t, db.NewClient(t), db, keyorder.Config{TTL: ttl})
	lease, err := holder.TryAcquire(t.Context(), "SO-pause", "holder")
	require.NoError(t, err)
	acquiredAt := time.Now()

	got := make(chan *keyorder.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(t.Context(), "SO-pause", "waiter",
			keyorder.Wait{MinDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Deadline: 20 * time.Second})
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
	require.NotErrorIs(t, err, keyorder.ErrNotHeld)

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

// With Redis stalled (SIGSTOP), an Acquire still ends with its context:
// starting the notice subscription, which cannot complete, holds up no
// caller. (Before, the first waiter subscribed under the Locker's mutex on
// a background context, and every Acquire hung until the client's
// timeouts, here a minute.)
func TestAcquireNotStalledBySubscription(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "SIGSTOP")
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := keyorder.New(seqOn(t, rdb, keyorder.SeqConfig{}), keyorder.Config{})
	require.NoError(t, err)
	require.NoError(t, rdb.Ping(t.Context()).Err(), "a pooled connection for the acquire scripts")
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	require.NoError(t, p.Pause())
	t.Cleanup(func() { require.NoError(t, p.Resume()) }) // before Close, which waits for the SUBSCRIBE

	errs := make(chan error, 3)
	for i := range cap(errs) {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			_, err := l.Acquire(ctx, "SO-stall-"+strconv.Itoa(i), "waiter", keyorder.Wait{})
			errs <- err
		}()
	}
	for range cap(errs) {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, context.DeadlineExceeded)
		case <-time.After(20 * time.Second):
			t.Fatal("an Acquire is stalled past its context by the notice subscription")
		}
	}
}

// A waiter is woken when the notice subscription is made again after a
// lost connection, since a notice may have been lost meanwhile: here the
// lock is deleted behind the Locker's back (no notice at all), and the
// waiter, whose random delays are a minute, gets it at the resubscription.
func TestResubscriptionWakesWaiters(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "CLIENT KILL")
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	waiting := make(chan string, 1)
	l, err := keyorder.New(seqOn(t, rdb, keyorder.SeqConfig{}), keyorder.Config{OnWait: func(_, meta, _ string) { waiting <- meta }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	_, err = l.TryAcquire(t.Context(), "SO-resub", "holder")
	require.NoError(t, err)

	got := make(chan *keyorder.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(t.Context(), "SO-resub", "waiter", keyorder.Wait{MinDelay: time.Minute, MaxDelay: time.Minute, Deadline: 2 * time.Minute})
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	require.Equal(t, "waiter", <-waiting)
	require.NoError(t, rdb.Del(t.Context(), keyorder.DefaultPrefix+"{SO-resub}").Err())
	n, err := rdb.ClientKillByFilter(t.Context(), "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the Locker's one subscription")
	select {
	case lease := <-got:
		require.Equal(t, 1, lease.Stats().WokenByNotice, "woken by the resubscription")
		require.NoError(t, lease.Release(t.Context()))
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not woken by the resubscription")
	}
}
