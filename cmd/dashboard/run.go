package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/logging"
)

// run is the dashboard process. args is the whole command line (program
// name first), getenv looks up environment variables, and stdout receives
// the logs and the -h text.
//
// It loads the settings (see [settings] for the defaults and why), builds the
// logger and the process's one Redis client, serves until ctx is done, and
// then shuts down gracefully: the server stops accepting, lets requests in
// flight finish within the shutdown timeout, and the Redis client is closed
// last. It returns nil after -h and after a clean shutdown, and an error for
// bad settings, a port it cannot listen on, or a shutdown that timed out.
//
// Redis may be down at start: the dashboard starts anyway, logs a warning,
// and /readyz answers 503 until Redis answers.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, set, err := loadSettings(args[1:], getenv, stdout)
	if errors.Is(err, config.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	root, err := logging.New(cfg.LogLevel, cfg.LogFormat, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = root.Sync() }()
	logging.Redis.Set(root) // go-redis's own lines (see logging.CaptureRedis)
	log := root.Named("dashboard")

	log.Info("starting", set.LogField())

	rdb := cfg.Redis.NewClient()
	defer func() {
		if err := rdb.Close(); err != nil {
			log.Warn("close redis", zap.Error(err))
		}
	}()
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		log.Warn("redis not reachable yet; serving anyway", zap.String("redis", string(cfg.Redis.Topology)), zap.Strings("redis_addrs", cfg.Redis.Addrs()), zap.Error(err))
	}
	cancel()

	if ignored, _ := cfg.OrderStore.Check(); len(ignored) > 0 {
		log.Warn("order API settings ignored: ORDER_STORE is not http", zap.Strings("settings", ignored))
	}
	store, err := orderstore.Open(rdb, cfg.KeyPrefix, &cfg.OrderStore, orderstore.Hooks{}, log.Named("orders"))
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }() // always nil
	handler, err := newHandler(cfg, rdb, store.Store, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s (DASHBOARD_ADDR): %w", cfg.Addr, err)
	}
	everywhere := httpserve.EveryInterface(ln.Addr())
	log.Info("listening",
		zap.String("addr", ln.Addr().String()),
		zap.Bool("every_interface", everywhere),
		zap.String("root", cfg.Root),
		zap.String("auth", cfg.authKind),
		zap.Bool("read_only", cfg.ReadOnly),
		zap.Bool("metrics_auth", cfg.MetricsAuth))
	if cfg.InsecureNoAuth {
		log.Warn("authentication is off (-insecure-no-auth): anyone who reaches the port sees the queues and the orders, and, unless DASHBOARD_READ_ONLY, may change the queues and run the operator actions (retry, skip, hold, resume)",
			zap.Bool("every_interface", everywhere), zap.Bool("read_only", cfg.ReadOnly))
	}
	return httpserve.Serve(ctx, ln, handler, httpserve.Config{
		ReadTimeout:     cfg.ReadTimeout,
		WriteTimeout:    cfg.WriteTimeout,
		IdleTimeout:     cfg.IdleTimeout,
		ShutdownTimeout: cfg.ShutdownTimeout,
	}, log)
}
