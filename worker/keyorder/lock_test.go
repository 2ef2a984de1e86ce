package keyorder_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// newLocker returns a Locker isolated to the test, closed at cleanup.
func newLocker(t *testing.T, db *redistest.DB, cfg keyorder.Config) *keyorder.Locker {
	t.Helper()
	return newLockerOn(t, db.Client, db, cfg)
}

func newLockerOn(t *testing.T, c redis.UniversalClient, db *redistest.DB, cfg keyorder.Config) *keyorder.Locker {
	t.Helper()
	l, err := keyorder.New(space(t, c, db.Prefix, keyorder.SeqConfig{}), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

func TestExactlyOneWinnerAmongRacers(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const racers = 100
	lockers := make([]*keyorder.Locker, 10) // ten "processes", each its own pool
	for i := range lockers {
		lockers[i] = newLockerOn(t, db.NewClient(t), db, keyorder.Config{})
	}
	var wins atomic.Int32
	var leases sync.Map
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			<-start
			lease, err := lockers[i%len(lockers)].TryAcquire(t.Context(), "SO-race", "racer "+strconv.Itoa(i))
			if err != nil {
				require.ErrorIs(t, err, keyorder.ErrBusy)
				return
			}
			wins.Add(1)
			leases.Store(i, lease)
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, int32(1), wins.Load())
	leases.Range(func(_, v any) bool {
		require.NoError(t, v.(*keyorder.Lease).Release(t.Context()))
		return true
	})
}

func TestCounterUnderLockLosesNothing(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const workers, each = 8, 25
	counter := db.Prefix + "counter"
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		c := db.NewClient(t) // a connection pool of its own
		l := newLockerOn(t, c, db, keyorder.Config{Wait: keyorder.Wait{MinDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond, Deadline: time.Minute}})
		wg.Go(func() {
			for i := range each {
				err := l.Do(t.Context(), "SO-counter", "worker "+strconv.Itoa(w)+" #"+strconv.Itoa(i), keyorder.Wait{},
					func(ctx context.Context, _ *keyorder.Lease) error {
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						defer inside.Add(-1)
						n, err := c.Get(ctx, counter).Int()
						if err != nil && !errors.Is(err, redis.Nil) {
							return err
						}
						return c.Set(ctx, counter, n+1, 0).Err()
					})
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.Zero(t, overlaps.Load(), "two holders at once")
	n, err := db.Client.Get(t.Context(), counter).Int()
	require.NoError(t, err)
	require.Equal(t, workers*each, n)
}

// Seed bug: the release deleted the key without checking the owner.
func TestReleaseAfterExpiryDeletesNothing(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	short := newLocker(t, db, keyorder.Config{TTL: 100 * time.Millisecond})
	l := newLocker(t, db, keyorder.Config{})
	a, err := short.TryAcquire(t.Context(), "SO-expire", "a")
	require.NoError(t, err)
	b, err := l.Acquire(t.Context(), "SO-expire", "b", keyorder.Wait{Deadline: 5 * time.Second})
	require.NoError(t, err, "b takes over once a's lease ends")

	require.ErrorIs(t, a.Release(t.Context()), keyorder.ErrNotHeld)
	_, err = l.TryAcquire(t.Context(), "SO-expire", "c")
	var busy *keyorder.BusyError
	require.ErrorAs(t, err, &busy, "a's late release must not free b's lock")
	require.Equal(t, "b", busy.Holder)
	require.NoError(t, b.Release(t.Context()))
	require.ErrorIs(t, b.Release(t.Context()), keyorder.ErrNotHeld, "second release")
}

// Seed bug: in one path the release deleted only when the key existed, and a
// missing lock was silently "released". Releasing a lock that is gone must
// say so and leave the key alone.
func TestReleaseOfVanishedLockIsNotHeld(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	a, err := l.TryAcquire(t.Context(), "SO-gone", "a")
	require.NoError(t, err)
	require.NoError(t, db.Client.Del(t.Context(), db.Prefix+"lock:{SO-gone}").Err())
	require.ErrorIs(t, a.Release(t.Context()), keyorder.ErrNotHeld)
}

// Seed bug: a waiter slept a random 0–1000 ms between checks. A waiter here is
// woken by the release notice long before its (deliberately huge) delay.
func TestWaiterWokenByReleaseNotice(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	waits := make(chan string, 1)
	l := newLocker(t, db, keyorder.Config{OnWait: func(key, meta, holder string) { waits <- key + " " + meta + " " + holder }})
	holder, err := l.TryAcquire(t.Context(), "SO-wake", "exchange")
	require.NoError(t, err)

	got := make(chan *keyorder.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(t.Context(), "SO-wake", "modify",
			keyorder.Wait{MinDelay: time.Minute, MaxDelay: time.Minute, Deadline: 2 * time.Minute})
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	// Release once the waiter has marked the lock, so the notice is sent.
	require.Eventually(t, func() bool {
		return db.Client.HExists(t.Context(), db.Prefix+"lock:{SO-wake}", "w").Val()
	}, 5*time.Second, 2*time.Millisecond)
	require.NoError(t, holder.Release(t.Context()))
	select {
	case lease := <-got:
		st := lease.Stats()
		require.Equal(t, 1, st.WokenByNotice)
		require.Zero(t, st.WokenByDelay)
		require.Equal(t, "SO-wake modify exchange", <-waits, "OnWait once, naming the holder")
		require.Greater(t, lease.Fence(), holder.Fence())
		require.NoError(t, lease.Release(t.Context()))
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by the release notice")
	}
}

// A notice that never comes (here: the lock is deleted behind the Locker's
// back, so nothing is published) only costs the random delay.
func TestWaiterWithoutNoticeAcquiresWithinMaxDelay(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	_, err := l.TryAcquire(t.Context(), "SO-quiet", "exchange")
	require.NoError(t, err)

	got := make(chan *keyorder.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(t.Context(), "SO-quiet", "modify",
			keyorder.Wait{MinDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: time.Minute})
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	require.Eventually(t, func() bool {
		return db.Client.HExists(t.Context(), db.Prefix+"lock:{SO-quiet}", "w").Val()
	}, 5*time.Second, 2*time.Millisecond)
	require.NoError(t, db.Client.Del(t.Context(), db.Prefix+"lock:{SO-quiet}").Err())
	select {
	case lease := <-got:
		require.Zero(t, lease.Stats().WokenByNotice)
		require.GreaterOrEqual(t, lease.Stats().WokenByDelay, 1)
		require.NoError(t, lease.Release(t.Context()))
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not acquire after its delay")
	}
}

// Seed bug: past the deadline the old code went ahead without the lock. Here
// the deadline is an error that names the holder, and no lease.
func TestDeadlineReturnsBusyNamingHolder(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	holder, err := l.TryAcquire(t.Context(), "SO-busy", "order:exchange task-1")
	require.NoError(t, err)
	lease, err := l.Acquire(t.Context(), "SO-busy", "order:modify task-2",
		keyorder.Wait{MinDelay: 10 * time.Millisecond, MaxDelay: 30 * time.Millisecond, Deadline: 200 * time.Millisecond})
	require.Nil(t, lease)
	require.ErrorIs(t, err, keyorder.ErrBusy)
	var busy *keyorder.BusyError
	require.ErrorAs(t, err, &busy)
	require.Equal(t, "order:exchange task-1", busy.Holder)
	require.Equal(t, "SO-busy", busy.Key)
	require.Positive(t, busy.TTL)
	require.GreaterOrEqual(t, busy.Waited, 200*time.Millisecond)
	require.Contains(t, err.Error(), "order:exchange task-1")
	require.NoError(t, holder.Release(t.Context()))
}

func TestAcquireHonoursContext(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	holder, err := l.TryAcquire(t.Context(), "SO-ctx", "exchange")
	require.NoError(t, err)
	defer func() { require.NoError(t, holder.Release(t.Context())) }()

	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "SO-ctx", "modify", keyorder.Wait{MinDelay: time.Minute, MaxDelay: time.Minute, Deadline: time.Hour})
		errc <- err
	}()
	require.Eventually(t, func() bool {
		return db.Client.HExists(t.Context(), db.Prefix+"lock:{SO-ctx}", "w").Val()
	}, 5*time.Second, 2*time.Millisecond)
	cancel(cause)
	select {
	case err := <-errc:
		require.ErrorIs(t, err, cause)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire ignored the cancelled context")
	}
}

func TestTakeoverWhenHolderDies(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	dead := newLockerOn(t, db.NewClient(t), db, keyorder.Config{TTL: 200 * time.Millisecond})
	live := newLocker(t, db, keyorder.Config{TTL: 200 * time.Millisecond})
	a, err := dead.TryAcquire(t.Context(), "SO-dead", "crashed worker")
	require.NoError(t, err) // never released, never renewed
	b, err := live.Acquire(t.Context(), "SO-dead", "next", keyorder.Wait{Deadline: 5 * time.Second})
	require.NoError(t, err)
	require.Greater(t, b.Fence(), a.Fence())
	require.NoError(t, b.Release(t.Context()))
}

func TestKeptLeaseOutlivesTTL(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	// Long enough that a heavily loaded machine still renews in time (every
	// TTL/3, with retries at a quarter of what is left before the lease
	// ends): a stall longer than the lease loses any lease-based lock.
	ttl := 3 * time.Second
	l := newLocker(t, db, keyorder.Config{TTL: ttl})
	other := newLocker(t, db, keyorder.Config{TTL: ttl})
	lease, err := l.TryAcquire(t.Context(), "SO-keep", "long task")
	require.NoError(t, err)
	ctx := lease.Keep(t.Context())
	// For two TTLs, nobody else may get in and the work is not cancelled.
	until := time.Now().Add(2 * ttl)
	for time.Now().Before(until) {
		_, err := other.TryAcquire(t.Context(), "SO-keep", "intruder")
		require.ErrorIs(t, err, keyorder.ErrBusy)
		require.NoError(t, ctx.Err())
	}
	require.NoError(t, lease.Release(t.Context()))
	require.Error(t, ctx.Err(), "release ends the kept context")
	_, err = other.TryAcquire(t.Context(), "SO-keep", "next")
	require.NoError(t, err)
}

func TestRenewalFailureCancelsWithErrLost(t *testing.T) {
	tests := []struct {
		name  string
		steal func(t *testing.T, db *redistest.DB, key string)
	}{
		{"deleted", func(t *testing.T, db *redistest.DB, key string) {
			require.NoError(t, db.Client.Del(t.Context(), key).Err())
		}},
		{"stolen", func(t *testing.T, db *redistest.DB, key string) {
			require.NoError(t, db.Client.HSet(t.Context(), key, "owner", "someone-else").Err())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			l := newLocker(t, db, keyorder.Config{TTL: 90 * time.Millisecond})
			lease, err := l.TryAcquire(t.Context(), "SO-lost", "victim")
			require.NoError(t, err)
			ctx := lease.Keep(t.Context())
			tt.steal(t, db, db.Prefix+"lock:{SO-lost}")
			select {
			case <-ctx.Done():
				require.ErrorIs(t, context.Cause(ctx), keyorder.ErrLost)
			case <-time.After(5 * time.Second):
				t.Fatal("lost lease did not cancel the work")
			}
			require.ErrorIs(t, lease.Release(t.Context()), keyorder.ErrNotHeld)
		})
	}
}

func TestDoWrapsErrLost(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{TTL: 90 * time.Millisecond})
	err := l.Do(t.Context(), "SO-do", "victim", keyorder.Wait{}, func(ctx context.Context, lease *keyorder.Lease) error {
		require.NoError(t, db.Client.Del(t.Context(), db.Prefix+"lock:{SO-do}").Err())
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, keyorder.ErrLost)
	require.ErrorIs(t, err, context.Canceled)
}

func TestFenceStrictlyIncreases(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	short := newLocker(t, db, keyorder.Config{TTL: 50 * time.Millisecond})
	lockKey, fenceKey := db.Prefix+"lock:{SO-fence}", db.Prefix+"lock:{SO-fence}:fence"
	var last int64
	next := func(how string) {
		t.Helper()
		by := l
		if how == "left to expire" {
			by = short
		}
		lease, err := by.Acquire(t.Context(), "SO-fence", how, keyorder.Wait{Deadline: 5 * time.Second})
		require.NoError(t, err)
		require.Greater(t, lease.Fence(), last, how)
		last = lease.Fence()
		if how != "left to expire" {
			require.NoError(t, lease.Release(t.Context()))
		}
	}
	for range 20 {
		next("released")
	}
	next("left to expire")
	require.Eventually(t, func() bool { return db.Client.Exists(t.Context(), lockKey).Val() == 0 }, 5*time.Second, 2*time.Millisecond)
	next("after expiry")
	// The key idles past the fence retention: its counter is gone too.
	require.NoError(t, db.Client.Del(t.Context(), fenceKey).Err())
	next("after retention")
	// The counter runs ahead of the clock (as after a clock step back).
	ahead := time.Now().Add(time.Hour).UnixMicro()
	require.NoError(t, db.Client.Set(t.Context(), fenceKey, ahead, 0).Err())
	next("clock behind")
	require.Equal(t, ahead+1, last)

	ttl := db.Client.PTTL(t.Context(), fenceKey).Val()
	require.Positive(t, ttl, "fence counter must expire: memory stays bounded")
}

func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	for _, key := range []string{"", "a{b", "a}b", string(make([]byte, keyorder.MaxKeyLen+1))} {
		_, err := l.TryAcquire(t.Context(), key, "")
		require.ErrorIs(t, err, keyorder.ErrInvalidKey)
	}
}

func TestAcquireAfterClose(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l, err := keyorder.New(seqOn(t, db.Client, keyorder.SeqConfig{Prefix: db.Prefix}), keyorder.Config{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = l.Acquire(t.Context(), "SO-closed", "", keyorder.Wait{})
	require.ErrorIs(t, err, keyorder.ErrClosed)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	tests := []struct {
		name string
		cfg  keyorder.Config
	}{
		{"min above max", keyorder.Config{Wait: keyorder.Wait{MinDelay: time.Second, MaxDelay: time.Millisecond}}},
		{"negative deadline", keyorder.Config{Wait: keyorder.Wait{Deadline: -time.Second}}},
		{"retention under ttl", keyorder.Config{TTL: time.Hour, FenceRetention: time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := keyorder.New(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), tt.cfg)
			require.Error(t, err)
		})
	}
	_, err := keyorder.New(nil, keyorder.Config{})
	require.Error(t, err, "a Locker needs a Sequencer")
	_, err = keyorder.New(&keyorder.Sequencer{}, keyorder.Config{})
	require.Error(t, err, "a zero Sequencer is none")
	_, err = keyorder.NewClient(&keyorder.Sequencer{}, keyorder.ClientConfig{})
	require.Error(t, err, "a zero Sequencer is none")
	_, err = keyorder.NewRunner(&keyorder.Sequencer{}, keyorder.RunnerConfig{Key: keyOf})
	require.Error(t, err, "a zero Sequencer is none")
	_, err = keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: "x{"})
	require.Error(t, err, "a brace in the prefix")
}
