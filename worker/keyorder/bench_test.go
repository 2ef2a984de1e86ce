package keyorder_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/redis/go-redis/v9"
)

// countHook counts the commands a client sends (a pipeline counts once: it is
// one round trip).
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// BenchmarkAcquireRelease measures an uncontended acquire and release, and
// reports the Redis round trips they cost.
func BenchmarkAcquireRelease(b *testing.B) {
	db := redistest.New(b)
	c := db.NewClient(b)
	hook := &countHook{}
	c.AddHook(hook)
	l, err := keyorder.New(space(b, c, db.Prefix, keyorder.SeqConfig{}), keyorder.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	// Load the scripts so NOSCRIPT fallbacks do not count.
	lease, err := l.Acquire(ctx, "warm", "", keyorder.Wait{})
	if err != nil {
		b.Fatal(err)
	}
	_ = lease.Release(ctx)
	hook.n.Store(0)
	b.ResetTimer()
	i := 0
	for b.Loop() {
		lease, err := l.Acquire(ctx, "SO-"+strconv.Itoa(i%1000), "bench", keyorder.Wait{})
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(hook.n.Load())/float64(i), "roundtrips/op")
}

// contender takes and gives back one key in a loop. acquire returns a release
// func, or nil when it gave up.
type contender func(ctx context.Context, who int) (release func())

// BenchmarkHandoff measures the time from a holder starting its release to
// the next holder having the lock, with four contenders on one key, for this
// lock and for the seed-style poller it replaces. Each op is one hand-off.
// Run it with a fixed count, e.g. -benchtime 200x: the seed poller needs
// hundreds of milliseconds per hand-off.
func BenchmarkHandoff(b *testing.B) {
	b.Run("lock=orderworker", func(b *testing.B) {
		db := redistest.New(b)
		lockers := make([]*keyorder.Locker, 4)
		for i := range lockers {
			l, err := keyorder.New(space(b, db.NewClient(b), db.Prefix, keyorder.SeqConfig{}), keyorder.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			lockers[i] = l
		}
		runHandoff(b, func(ctx context.Context, who int) func() {
			lease, err := lockers[who].Acquire(ctx, "SO-hot", "c"+strconv.Itoa(who), keyorder.Wait{Deadline: 30 * time.Second})
			if err != nil {
				return nil
			}
			return func() { _ = lease.Release(ctx) }
		})
	})
	b.Run("lock=seed-poller", func(b *testing.B) {
		db := redistest.New(b)
		clients := make([]*redis.Client, 4)
		for i := range clients {
			clients[i] = db.NewClient(b)
		}
		key := db.Prefix + "seed:SO-hot"
		runHandoff(b, func(ctx context.Context, who int) func() {
			c := clients[who]
			if !seedAcquire(ctx, c, key) {
				return nil
			}
			return func() { seedRelease(ctx, c, key) }
		})
	})
}

// seedAcquire is the lock orderworker replaces, kept for comparison: check,
// then set (not atomic), sleeping a random 0–1000 ms between checks, giving up
// after 5 s (where the old code went ahead without the lock).
func seedAcquire(ctx context.Context, c *redis.Client, key string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c.Exists(ctx, key).Val() == 0 {
			c.Set(ctx, key, "1", 30*time.Second)
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-time.After(rand.N(1000 * time.Millisecond)):
		case <-ctx.Done():
			return false
		}
	}
}

func seedRelease(ctx context.Context, c *redis.Client, key string) {
	if c.Exists(ctx, key).Val() == 1 {
		c.Del(ctx, key)
	}
}

func runHandoff(b *testing.B, acquire contender) {
	const contenders = 4
	const hold = 2 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu          sync.Mutex
		samples     []time.Duration
		releasedAt  atomic.Int64 // unix ns of the last release start; 0 = none pending
		done        = make(chan struct{})
		doneOnce    sync.Once
		wg          sync.WaitGroup
		handoffsDue = b.N
		turn        = make(chan struct{}) // closed by each new holder
	)
	b.ResetTimer()
	for who := range contenders {
		wg.Go(func() {
			for ctx.Err() == nil {
				release := acquire(ctx, who)
				if release == nil {
					continue
				}
				at := releasedAt.Swap(0)
				now := time.Now().UnixNano()
				mu.Lock()
				if at != 0 {
					samples = append(samples, time.Duration(now-at))
					if len(samples) >= handoffsDue {
						doneOnce.Do(func() { close(done) })
					}
				}
				close(turn)
				turn = make(chan struct{})
				mine := turn
				mu.Unlock()
				select {
				case <-time.After(hold):
				case <-ctx.Done():
				}
				releasedAt.Store(time.Now().UnixNano())
				release()
				// Let another contender have the next turn, so that every
				// sample is a hand-off between two holders.
				select {
				case <-mine:
				case <-ctx.Done():
				}
			}
		})
	}
	<-done
	b.StopTimer()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(samples)
	q := func(p float64) float64 {
		return float64(samples[int(p*float64(len(samples)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkStatus measures a view of a sequence with 10 and with 3,000
// positions waiting: it reads one page either way, so the two should cost
// the same (compare their ns/op).
func BenchmarkStatus(b *testing.B) {
	for _, n := range []int{10, 3000} {
		b.Run("waiting="+strconv.Itoa(n), func(b *testing.B) {
			db := redistest.New(b)
			c := db.NewClient(b)
			q := newSequencer(b, c, db, keyorder.SeqConfig{})
			backlog(b, q, c, "SO-bench", n)
			hook := &countHook{}
			c.AddHook(hook)
			ctx := context.Background()
			if _, err := q.Status(ctx, "SO-bench"); err != nil { // loads the script
				b.Fatal(err)
			}
			hook.n.Store(0)
			i := 0
			for b.Loop() {
				st, err := q.Status(ctx, "SO-bench")
				if err != nil || st.Waiting != int64(n) {
					b.Fatal(st.Waiting, err)
				}
				i++
			}
			b.ReportMetric(float64(hook.n.Load())/float64(i), "roundtrips/op")
		})
	}
}
