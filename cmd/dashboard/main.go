// Command dashboard serves asynqmon, the web UI of the asynq queues, behind
// authentication, together with Prometheus metrics of the queues and
// health checks. Run it with -h for its settings; [run] documents its
// behaviour and the choices behind it.
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
	err := run(ctx, os.Args, os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
