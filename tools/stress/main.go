// Command stress is orderworker's reliability suite. It runs the real
// binaries: a dedicated redis-server with an fsync'd append-only file and
// several cmd/worker processes, feeds them mixed modify and exchange tasks
// over a few orders while it kills workers with SIGKILL (and restarts them)
// and restarts Redis once, waits for the queues to drain, and then checks
// from the order histories and asynq's Inspector that no task was lost, no
// event was applied twice, no two critical sections on an order overlapped,
// fences only went up, and no order was left locked. It exits non-zero on
// any violation.
//
// Inside the chaos phase, the hot-order phase (hot.go) floods a few orders
// of their own with hundreds of changes each, so that the workers drain
// them in holds of the lock, and SIGKILLs and freezes workers in the
// middle of those holds while Redis switches; the same checks cover them,
// and the report gives the evidence that the kills hit holds.
//
// -redis sentinel and -redis cluster run the same on a local Sentinel group
// or Redis Cluster, with failovers in place of the restart: two SENTINEL
// FAILOVERs, or a CLUSTER FAILOVER of one shard and a SIGKILL of another
// shard's master. -failover-sync (on by default) makes the switches that
// Redis does not coordinate lose no acknowledged write, so that the checks
// stay strict; see docs/testing.md, "The reliability suite on
// Sentinel and Cluster".
//
// Every run also ends with the history checker (tools/stress/history),
// over what the order store accepted write by write: per order, positions
// up in the order of acceptance, fences never down, an equal fence only
// from the same hold, each event applied once, and the order its replay.
// -store http runs the workers on the HTTP order store against the
// reference order API (orderapitest), served in process on loopback over
// a Redis of its own that no nemesis touches; the checker then reads the
// API's own log too.
//
// Run it with -h for its flags; `make stress` runs the full configuration
// and CI runs -short (about three minutes).
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
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stress:", err)
		os.Exit(1)
	}
}
