// Command ownstore runs an orderworker worker around an order store of its
// own, MemStore (an in-memory map), from outside the orderworker module: it
// shows that the public packages (worker, worker/orders,
// worker/orders/storetest, worker/workertest, producer, tasks) are enough
// to plug in a store.
//
//	REDIS_URL=redis://localhost:6379/0 go run .
//
// It seeds order SO1 and applies the order:modify and order:exchange tasks
// that producers enqueue (go run ../../cmd/producer modify SO1 -remark hi)
// until SIGINT or SIGTERM. Its test runs the store conformance suite on
// MemStore, single tasks through the worker's handlers with
// worker/workertest, and one change end to end.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "ownstore:", err)
		stop()
		os.Exit(1)
	}
}

// run starts a worker on REDIS_URL around a MemStore seeded with SO1, and
// stops it when ctx ends.
func run(ctx context.Context, getenv func(string) string) error {
	opts, err := redis.ParseURL(getenv("REDIS_URL"))
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store := NewMemStore()
	if err := store.Put(ctx, orders.Order{No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}); err != nil {
		return err
	}
	w, err := startWorker(rdb, store, worker.Config{})
	if err != nil {
		return err
	}
	<-ctx.Done()
	w.Shutdown()
	return nil
}

// startWorker builds a worker around store and starts it. It serves the
// kinds whose write store implements (worker.KindsFor): a kind added to
// orderworker later, whose write MemStore lacks, is left to workers that
// serve it, rather than refused at start.
func startWorker(rdb redis.UniversalClient, store orders.Store, cfg worker.Config) (*worker.Worker, error) {
	cfg.Kinds = worker.KindsFor(store)
	w, err := worker.New(rdb, store, cfg)
	if err != nil {
		return nil, err
	}
	if err := w.Start(); err != nil {
		w.Shutdown()
		return nil, err
	}
	return w, nil
}
