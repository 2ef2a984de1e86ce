// Command producer enqueues order tasks and reads orders from the command
// line, and serves the HTTP intake for upstream systems not written in Go
// ("producer serve"), and prints each process's Redis ACL rules ("producer
// acl"). Run it with -h for the commands and settings.
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
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}
