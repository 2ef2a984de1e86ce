// Command bench measures orderworker against plain asynq, against itself
// with ordering off, and against the seed-style lock it replaces, in one run
// on one dedicated redis-server: throughput, lock hand-off, round trips,
// Redis commands, CPU and memory per task, and the order histories' checks,
// for each workload (10 ms of work at concurrency 20, no work at
// concurrency 100) on uncontended and on hot orders. It also measures what
// accepting a change costs the producer against raw asynq, and prints the
// targets met or not. With -replicas it measures how throughput scales with
// worker processes. Run it with -h for its flags; `make bench` runs the
// default configuration.
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
