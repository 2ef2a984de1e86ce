package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tasks"
)

// runPlainWorker is the bench binary's -as-worker=plain mode: a plain asynq
// worker process, (a) of the replica runs, configured like cmd/worker from
// REDIS_URL, WORKER_CONCURRENCY and WORKER_SIMULATE_WORK. Its handler only
// sleeps the work time. It runs until ctx ends (SIGTERM).
func runPlainWorker(ctx context.Context, getenv func(string) string) error {
	opts, err := redisconn.Parse(cmp.Or(getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"))
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	concurrency, err := strconv.Atoi(cmp.Or(getenv("WORKER_CONCURRENCY"), "20"))
	if err != nil || concurrency <= 0 {
		return fmt.Errorf("WORKER_CONCURRENCY=%q: want a positive number", getenv("WORKER_CONCURRENCY"))
	}
	work, err := time.ParseDuration(cmp.Or(getenv("WORKER_SIMULATE_WORK"), "0s"))
	if err != nil || work < 0 {
		return fmt.Errorf("WORKER_SIMULATE_WORK=%q: want a duration >= 0", getenv("WORKER_SIMULATE_WORK"))
	}
	rdb := opts.NewClient()
	defer rdb.Close()
	noop := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return storehook.Sleep(ctx, work) })
	mux := asynq.NewServeMux()
	for _, k := range tasks.Kinds() {
		mux.Handle(k.Type, noop)
	}
	srv := asynq.NewServerFromRedisClient(rdb, plainConfig(concurrency))
	if err := srv.Start(mux); err != nil {
		return err
	}
	<-ctx.Done()
	srv.Shutdown()
	return nil
}
