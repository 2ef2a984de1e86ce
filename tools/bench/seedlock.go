package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
)

// The seed's lock, as DESIGN.md describes it.
const (
	seedDeadline = 5 * time.Second  // after which it went ahead without the lock
	seedMaxSleep = time.Second      // a waiter slept a random 0 to this between checks
	seedKeyTTL   = 30 * time.Second // the key's expiry
)

// seedLock runs a modify the way the seed did: it checks the order's key
// with EXISTS and then SETs it (two commands, not atomic, so two tasks can
// both see it free), sleeps a random 0–1000 ms between checks, and after
// 5 s goes ahead without the lock, which it counts. It releases with EXISTS
// then DEL, without checking who owns the key. The work and the store
// write are (b)'s; the store needs a fence, so every write carries fence 1,
// which the store accepts again and again: the seed had no fencing.
type seedLock struct {
	rdb       redis.UniversalClient
	store     orders.Modifier
	work      time.Duration
	keyPrefix string
	bypasses  atomic.Int64
	waits     *waits
}

var _ asynq.Handler = (*seedLock)(nil)

func (s *seedLock) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.Parse[tasks.ModifyPayload](t.Payload())
	if err != nil {
		return err
	}
	key := s.keyPrefix + p.OrderNo
	start := time.Now()
	locked := s.acquire(ctx, key)
	s.waits.add(p.EventID, time.Since(start), true)
	if !locked {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		s.bypasses.Add(1)
	}
	defer s.release(ctx, key)
	wctx := orders.WithWrite(ctx, orders.Write{Fence: 1, Worker: "bench-c", StartedAt: time.Now()})
	if err := storehook.Sleep(ctx, s.work); err != nil {
		return err
	}
	_, err = s.store.Modify(wctx, p.EventID, p.OrderNo, orders.Changes{
		Address: p.Changes.Address, Remark: p.Changes.Remark, Items: p.Changes.Items,
	})
	if err != nil && orders.Permanent(err) {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}

// acquire reports whether it took the key before the deadline.
func (s *seedLock) acquire(ctx context.Context, key string) bool {
	deadline := time.Now().Add(seedDeadline)
	for {
		if s.rdb.Exists(ctx, key).Val() == 0 {
			s.rdb.Set(ctx, key, "1", seedKeyTTL)
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if storehook.Sleep(ctx, rand.N(seedMaxSleep)) != nil {
			return false
		}
	}
}

func (s *seedLock) release(ctx context.Context, key string) {
	ctx = context.WithoutCancel(ctx)
	if s.rdb.Exists(ctx, key).Val() == 1 {
		s.rdb.Del(ctx, key)
	}
}
