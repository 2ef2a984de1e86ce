// Command demo plays orderworker's core scenario in one process, on an
// embedded in-process Redis: an exchange holds an order while modifies of
// the same order wait for it and are woken the moment it is released. It
// prints a timeline and the final orders, then exits; -serve keeps the
// worker and the embedded Redis running. -trace traces the changes with
// OpenTelemetry, keeping the spans in memory, and prints the trace of one
// change that waited for its turn as a tree: accepted, waited behind its
// predecessor, locked, written, turn passed on.
//
//	go run ./cmd/demo
//	go run ./cmd/demo -trace
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
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
