package token

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkWaiterLatency measures the time from a new token being stored to
// the callers that waited for it having it: 10 replicas (each its own Redis
// client) with 10 waiting callers each, side by side with the seed-style
// poller it replaces (re-read every 200 ms, at most 10 times). Each op is one
// token hand-over to all 100 callers; p50/p99/max are over all callers of all
// ops. Run it with a fixed count, e.g. -benchtime 30x: the poller needs up to
// 200 ms per op.
func BenchmarkWaiterLatency(b *testing.B) {
	const replicas, perReplica = 10, 10
	b.Run("lock=shared", func(b *testing.B) {
		db := redistest.New(b)
		key := testKey(db)
		caches := make([]*Cache, replicas)
		for i := range caches {
			c, err := New(db.NewClient(b), benchSource(b), Config{Key: key, WaitTimeout: time.Minute, LockTTL: time.Minute}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			caches[i] = c
		}
		ctx := b.Context()
		var samples []time.Duration
		for i := 0; b.Loop(); i++ {
			tok := "bench-token-" + strconv.Itoa(i)
			// The refresher is this benchmark: it holds the lock while the
			// callers start waiting.
			if err := db.Client.Set(ctx, lockKey(key), "bench", time.Minute).Err(); err != nil {
				b.Fatal(err)
			}
			var entered atomic.Int32
			got, wait := startWaiters(replicas*perReplica, func(j int) (string, error) {
				entered.Add(1)
				return caches[j%replicas].Get(ctx)
			})
			benchWaitUntil(b, func() bool {
				if entered.Load() < replicas*perReplica {
					return false
				}
				for _, c := range caches {
					if c.waiting.Load() == 0 {
						return false
					}
				}
				return true
			})
			at := time.Now()
			err := storeScript.Run(ctx, db.Client, []string{key, lockKey(key)},
				"bench", tok, time.Hour.Milliseconds(), channelName(key), "bench", 0).Err()
			if err != nil {
				b.Fatal(err)
			}
			samples = collect(b, samples, tok, at, got, wait)
			for _, c := range caches { // the next op starts with no token
				if err := c.Invalidate(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		}
		reportLatency(b, samples)
	})
	b.Run("lock=seed-poller", func(b *testing.B) {
		db := redistest.New(b)
		key := testKey(db)
		clients := make([]*redis.Client, replicas)
		for i := range clients {
			clients[i] = db.NewClient(b)
		}
		ctx := b.Context()
		var samples []time.Duration
		for i := 0; b.Loop(); i++ {
			tok := "bench-token-" + strconv.Itoa(i)
			if err := db.Client.Del(ctx, key).Err(); err != nil {
				b.Fatal(err)
			}
			var missed atomic.Int32
			got, wait := startWaiters(replicas*perReplica, func(j int) (string, error) {
				return seedPoll(ctx, clients[j%replicas], key, &missed)
			})
			benchWaitUntil(b, func() bool { return missed.Load() == replicas*perReplica })
			// Store at a random point of the pollers' 200 ms cycle, as a
			// refresher in another process would.
			time.Sleep(rand.N(200 * time.Millisecond))
			at := time.Now()
			if err := db.Client.Set(ctx, key, tok, time.Hour).Err(); err != nil {
				b.Fatal(err)
			}
			samples = collect(b, samples, tok, at, got, wait)
		}
		reportLatency(b, samples)
	})
}

// seedPoll is the waiting of the token cache orderworker replaces, kept for
// comparison: read the token, sleep 200 ms, at most 10 times, then fail.
// missed counts callers whose first read found nothing.
func seedPoll(ctx context.Context, c *redis.Client, key string, missed *atomic.Int32) (string, error) {
	for n := range 10 {
		v, err := c.Get(ctx, key).Result()
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", err
		}
		if n == 0 {
			missed.Add(1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", errors.New("seed poller: no token after 10 polls")
}

type result struct {
	tok string
	at  time.Time
	err error
}

// startWaiters runs n callers of get at once; wait waits for them all.
func startWaiters(n int, get func(j int) (string, error)) (got []result, wait func()) {
	got = make([]result, n)
	var wg sync.WaitGroup
	for j := range got {
		wg.Go(func() {
			tok, err := get(j)
			got[j] = result{tok: tok, at: time.Now(), err: err}
		})
	}
	return got, wg.Wait
}

// collect waits for the callers and appends their latencies from at.
func collect(b *testing.B, samples []time.Duration, tok string, at time.Time, got []result, wait func()) []time.Duration {
	b.Helper()
	wait()
	for _, r := range got {
		if r.err != nil || r.tok != tok {
			b.Fatalf("caller got %q, %v; want %q", r.tok, r.err, tok)
		}
		samples = append(samples, r.at.Sub(at))
	}
	return samples
}

func reportLatency(b *testing.B, samples []time.Duration) {
	b.Helper()
	slices.Sort(samples)
	q := func(p float64) float64 {
		return float64(samples[int(p*float64(len(samples)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// benchWaitUntil polls cond until it holds; the benchmark fails after 10 s.
func benchWaitUntil(b *testing.B, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("waiters not ready within 10s")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// benchSource fails the benchmark if the Cache fetches: the benchmark
// itself stores the tokens.
func benchSource(b *testing.B) Source {
	return SourceFunc(func(context.Context) (Token, error) {
		b.Error("unexpected fetch")
		return Token{}, errors.New("benchmark: no fetch expected")
	})
}
