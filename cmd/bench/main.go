// Command bench measures orderworker against plain asynq and against the
// seed-style lock it replaces, in one run on one dedicated redis-server:
// throughput, lock hand-off, Redis commands per task and memory, on
// uncontended and on contended orders. With -replicas it measures how
// throughput scales with worker processes. Run it with -h for its flags;
// `make bench` runs the default configuration.
//
// It is a measuring tool, not part of `go test`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
