package notice_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/notice"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

func newChannel(t *testing.T, rdb redis.UniversalClient, name string) *notice.Channel {
	t.Helper()
	c := notice.New(rdb, name, notice.Config{})
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// ready registers a waiter and waits until the subscription is confirmed.
func ready(t *testing.T, c *notice.Channel, key string, match func(string) bool) *notice.Waiter {
	t.Helper()
	w := c.Wait(key, match)
	t.Cleanup(w.Stop)
	require.NoError(t, w.Ready(t.Context(), 10*time.Second))
	return w
}

func woken(t *testing.T, w *notice.Waiter, what string) {
	t.Helper()
	select {
	case <-w.C:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not woken", what)
	}
}

func notWoken(t *testing.T, w *notice.Waiter, what string) {
	t.Helper()
	select {
	case <-w.C:
		t.Fatalf("%s: woken", what)
	default:
	}
}

// atPos wakes a waiter at position pos for a notice naming it or a later
// position, as the lock's waiters do.
func atPos(pos int64) func(string) bool {
	return func(next string) bool {
		n, err := strconv.ParseInt(next, 10, 64)
		return err == nil && pos <= n
	}
}

// Notices wake the waiters of their key that they match, and the waiters of
// every notice; nobody else. A fence notice (the last) shows that every
// earlier notice was handled: notices arrive in order.
func TestNoticesWakeTheirWaiters(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	name := db.Prefix + "notices"
	c := newChannel(t, db.Client, name)
	anyKey := ready(t, c, "A", nil)
	third := ready(t, c, "A", atPos(3))
	other := ready(t, c, "B", nil)
	all := ready(t, c, "", nil)
	fence := ready(t, c, "fence", nil)
	publish := func(payload string) {
		t.Helper()
		require.NoError(t, db.Client.Publish(t.Context(), name, payload).Err())
		require.NoError(t, db.Client.Publish(t.Context(), name, "fence").Err())
		woken(t, fence, "fence after "+payload)
	}

	publish("A 2")
	woken(t, anyKey, "A's waiter without a position")
	notWoken(t, third, "position 3 by the notice of position 2")
	notWoken(t, other, "B's waiter")
	woken(t, all, "the waiter of every notice")

	publish("A 3")
	woken(t, third, "position 3 by its own notice")
	woken(t, anyKey, "A's waiter without a position")
	publish("A 7")
	woken(t, third, "position 3 by a later position's notice")
	publish("A x")
	notWoken(t, third, "position 3 by a malformed notice")
	publish("A")
	woken(t, third, "position 3 by the bare key")
	notWoken(t, other, "B's waiter")
	woken(t, all, "the waiter of every notice")

	third.Stop()
	publish("A")
	notWoken(t, third, "a stopped waiter")
}

// When the subscription's connection is lost, go-redis subscribes again;
// a notice may have been lost meanwhile, so every waiter is woken.
func TestResubscriptionWakesEveryWaiter(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "CLIENT KILL")
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newChannel(t, rdb, "notices")
	a := ready(t, c, "A", atPos(5))
	all := ready(t, c, "", func(string) bool { return false })

	n, err := rdb.ClientKillByFilter(t.Context(), "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the Channel's one subscription")
	woken(t, a, "a waiter of a key")
	woken(t, all, "a waiter of every notice")
}

// Registering never waits for Redis: with the server stopped, Wait returns
// at once and Ready gives up at its limit or with the context.
func TestWaitDoesNotWaitForRedis(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "SIGSTOP")
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	c := notice.New(rdb, "notices", notice.Config{})
	require.NoError(t, p.Pause())
	t.Cleanup(func() { require.NoError(t, c.Close()) }) // after Resume: the SUBSCRIBE is under way
	t.Cleanup(func() { require.NoError(t, p.Resume()) })

	done := make(chan error, 2)
	go func() {
		w := c.Wait("A", nil)
		defer w.Stop()
		done <- w.Ready(t.Context(), 50*time.Millisecond)
	}()
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		w := c.Wait("B", nil)
		defer w.Stop()
		done <- w.Ready(ctx, time.Minute)
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter is stalled by the subscription")
		}
	}
}

// A refused channel (a Redis user without it in its ACL) turns notices
// off: waiters are never woken and never wait for a subscription.
func TestCheckTurnsRefusedNoticesOff(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "ACL users")
	p := redistest.Dedicated(t)
	admin := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "worker", "on", ">secret-pass", "~*", "+@all", "resetchannels").Err())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), Username: "worker", Password: "secret-pass"})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newChannel(t, rdb, "ow:lock:released")

	err := c.Check(t.Context())
	require.ErrorIs(t, err, notice.ErrNoPermission)
	require.ErrorContains(t, err, `"&ow:lock:released"`)
	w := c.Wait("A", nil)
	defer w.Stop()
	require.NoError(t, w.Ready(t.Context(), time.Minute), "no subscription to wait for")

	ok := newChannel(t, admin, "ow:lock:released")
	require.NoError(t, ok.Check(t.Context()))
}
