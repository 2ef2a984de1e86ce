// Command worker runs orderworker's asynq worker: it takes the tasks of
// every kind of the contract (tasks.Kinds) from Redis and applies each
// inside its order's lock.
// Run it with -h for its settings; every one is also an environment variable.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/orderworker/orderworker/internal/logging"
)

func main() {
	logging.CaptureRedis() // go-redis's own lines go to the logger run builds
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
