package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/token"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/redis/go-redis/v9"
)

// tokenResult is the latency of token waiters after a refresh: from the new
// token being stored to each caller that waited for it having it.
type tokenResult struct {
	System  string  `json:"system"`
	Samples int     `json:"samples"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// Token measurement shape: rounds of a cold start, each with replicas
// processes (own Redis client) of perReplica callers.
const (
	tokenRounds     = 10
	tokenReplicas   = 10
	tokenPerReplica = 10
)

// measureTokens runs the shared token cache (internal/token) and the
// seed-style poller it replaces (re-read every 200 ms, 10 times at most) on
// the same Redis, one after the other.
func measureTokens(ctx context.Context, opts *redisconn.Options) ([]tokenResult, error) {
	shared, err := tokenShared(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("shared token cache: %w", err)
	}
	seed, err := tokenSeed(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("seed poller: %w", err)
	}
	return []tokenResult{summarize("shared cache (orderworker)", shared), summarize("seed 200 ms poller", seed)}, nil
}

func summarize(system string, d []time.Duration) tokenResult {
	slices.Sort(d)
	return tokenResult{System: system, Samples: len(d),
		P50Ms: ms(benchkit.Quantile(d, 0.50)), P99Ms: ms(benchkit.Quantile(d, 0.99)), MaxMs: ms(benchkit.Quantile(d, 1))}
}

// tokenShared measures internal/token: every round, all callers ask at a
// cold start; one replica's fetch is held until the others wait, then
// returns, and the cache stores and publishes the token.
func tokenShared(ctx context.Context, opts *redisconn.Options) ([]time.Duration, error) {
	var samples []time.Duration
	for round := range tokenRounds {
		key := fmt.Sprintf("bench:token%d:{upstream}", round)
		release := make(chan struct{})
		fetching := make(chan struct{}, 1)
		var mu sync.Mutex
		var storedAt time.Time
		src := token.SourceFunc(func(ctx context.Context) (token.Token, error) {
			select {
			case fetching <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return token.Token{}, ctx.Err()
			}
			mu.Lock()
			storedAt = time.Now() // the cache stores it in its next round trip
			mu.Unlock()
			return token.Token{Value: fmt.Sprintf("tok-%d", round), ExpiresIn: 10 * time.Minute}, nil
		})
		var caches []*token.Cache
		var clients []redis.UniversalClient
		closeAll := func() {
			for _, c := range caches {
				_ = c.Close()
			}
			for _, c := range clients {
				_ = c.Close()
			}
		}
		for range tokenReplicas {
			rdb := opts.NewClient()
			clients = append(clients, rdb)
			c, err := token.New(rdb, src, token.Config{Key: key, WaitTimeout: time.Minute}, nil)
			if err != nil {
				closeAll()
				return nil, err
			}
			caches = append(caches, c)
		}
		got := make(chan time.Time, tokenReplicas*tokenPerReplica)
		errs := make(chan error, tokenReplicas*tokenPerReplica)
		var wg sync.WaitGroup
		for i := range tokenReplicas * tokenPerReplica {
			wg.Go(func() {
				if _, err := caches[i%tokenReplicas].Get(ctx); err != nil {
					errs <- err
					return
				}
				got <- time.Now()
			})
		}
		select {
		case <-fetching:
		case <-ctx.Done():
			close(release)
			wg.Wait()
			closeAll()
			return nil, ctx.Err()
		}
		// Give every caller time to be waiting (a tool, not a test: a
		// caller that is late only makes its own sample shorter).
		time.Sleep(100 * time.Millisecond)
		close(release)
		wg.Wait()
		closeAll()
		close(got)
		close(errs)
		if err := <-errs; err != nil {
			return nil, err
		}
		for t := range got {
			samples = append(samples, t.Sub(storedAt))
		}
	}
	return samples, nil
}

// tokenSeed measures the poller orderworker replaced: callers re-read the
// token every 200 ms, 10 times at most, until the refresher stores it.
func tokenSeed(ctx context.Context, opts *redisconn.Options) ([]time.Duration, error) {
	var samples []time.Duration
	rdb := opts.NewClient()
	defer rdb.Close()
	for round := range tokenRounds {
		key := fmt.Sprintf("bench:seedtoken%d", round)
		got := make(chan time.Time, tokenReplicas*tokenPerReplica)
		var wg sync.WaitGroup
		for range tokenReplicas * tokenPerReplica {
			wg.Go(func() {
				// Callers arrive spread over one poll interval.
				time.Sleep(rand.N(200 * time.Millisecond))
				for range 10 {
					if rdb.Exists(ctx, key).Val() == 1 {
						got <- time.Now()
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
			})
		}
		time.Sleep(300 * time.Millisecond)
		storedAt := time.Now()
		if err := rdb.Set(ctx, key, "tok", time.Minute).Err(); err != nil {
			return nil, err
		}
		wg.Wait()
		close(got)
		for t := range got {
			samples = append(samples, t.Sub(storedAt))
		}
		_ = rdb.Del(ctx, key).Err()
	}
	return samples, nil
}

func printTokens(out io.Writer, rs []tokenResult) {
	fmt.Fprintf(out, "\ntoken waiters after a refresh (%d cold starts × %d replicas × %d callers): time from the new token being stored to each waiter having it\n\n",
		tokenRounds, tokenReplicas, tokenPerReplica)
	fmt.Fprintf(out, "  %-28s %8s %8s %8s %8s\n", "system", "samples", "p50 ms", "p99 ms", "max ms")
	for _, r := range rs {
		fmt.Fprintf(out, "  %-28s %8d %8.2f %8.2f %8.2f\n", r.System, r.Samples, r.P50Ms, r.P99Ms, r.MaxMs)
	}
}
