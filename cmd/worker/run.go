package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// settings are the worker's configuration, one field per setting.
type settings struct {
	Redis          *redis.Options
	LogLevel       string
	LogFormat      string
	Prefix         string
	OpsAddr        string
	Concurrency    int
	Queues         string
	StrictPriority bool
	LockTTL        time.Duration
	ModifyWait     lock.Wait
	ExchangeWait   lock.Wait
	BusyRetryMin   time.Duration
	BusyRetryMax   time.Duration
	Shutdown       time.Duration
	SimulateWork   time.Duration
}

// declare registers the worker's settings on s.
func declare(s *config.Set, c *settings) {
	s.Redis(&c.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL,
		"Redis shared by all processes: redis://[user:pass@]host:port/db, rediss:// for TLS")
	s.String(&c.LogLevel, "log-level", "LOG_LEVEL", "info", "log level: "+logging.Levels).Check(logging.CheckLevel)
	s.String(&c.LogFormat, "log-format", "LOG_FORMAT", logging.FormatJSON, "log format: json or console").Check(logging.CheckFormat)
	s.String(&c.Prefix, "key-prefix", "KEY_PREFIX", "ow:", "prefix of orderworker's Redis keys (locks, orders); shared by all processes").Check(noBraces)
	s.String(&c.OpsAddr, "ops-addr", "OPS_ADDR", ":9090", "listen address of /healthz, /readyz and /metrics; empty to disable")
	s.Int(&c.Concurrency, "concurrency", "WORKER_CONCURRENCY", 20, "tasks run at once by this process").Check(config.Positive[int])
	s.String(&c.Queues, "queues", "WORKER_QUEUES", "order_exchange=6,order_modify=3", "queues to serve with their priority weights").Check(checkQueues)
	s.Bool(&c.StrictPriority, "strict-priority", "WORKER_STRICT_PRIORITY", false, "serve a queue only when higher-weighted ones are empty")
	s.Duration(&c.LockTTL, "lock-ttl", "LOCK_TTL", 30*time.Second, "order lock lease; renewed every third of it while a task runs").Check(config.Positive[time.Duration])
	s.Duration(&c.ModifyWait.MinDelay, "modify-wait-min", "MODIFY_WAIT_MIN", worker.DefaultModifyWait.MinDelay, "shortest random delay of a modify waiting for its order").Check(config.Positive[time.Duration])
	s.Duration(&c.ModifyWait.MaxDelay, "modify-wait-max", "MODIFY_WAIT_MAX", worker.DefaultModifyWait.MaxDelay, "longest random delay of a modify waiting for its order").Check(config.Positive[time.Duration])
	s.Duration(&c.ModifyWait.Deadline, "modify-wait-deadline", "MODIFY_WAIT_DEADLINE", worker.DefaultModifyWait.Deadline, "how long a modify waits for its order before going back to the queue").Check(config.Positive[time.Duration])
	s.Duration(&c.ExchangeWait.MinDelay, "exchange-wait-min", "EXCHANGE_WAIT_MIN", worker.DefaultExchangeWait.MinDelay, "shortest random delay of an exchange waiting for its order").Check(config.Positive[time.Duration])
	s.Duration(&c.ExchangeWait.MaxDelay, "exchange-wait-max", "EXCHANGE_WAIT_MAX", worker.DefaultExchangeWait.MaxDelay, "longest random delay of an exchange waiting for its order").Check(config.Positive[time.Duration])
	s.Duration(&c.ExchangeWait.Deadline, "exchange-wait-deadline", "EXCHANGE_WAIT_DEADLINE", worker.DefaultExchangeWait.Deadline, "how long an exchange waits for its order before going back to the queue").Check(config.Positive[time.Duration])
	s.Duration(&c.BusyRetryMin, "busy-retry-min", "BUSY_RETRY_MIN", 500*time.Millisecond, "shortest delay before a task that met its wait deadline runs again").Check(config.Positive[time.Duration])
	s.Duration(&c.BusyRetryMax, "busy-retry-max", "BUSY_RETRY_MAX", 2*time.Second, "longest delay before a task that met its wait deadline runs again").Check(config.Positive[time.Duration])
	s.Duration(&c.Shutdown, "shutdown-timeout", "SHUTDOWN_TIMEOUT", 25*time.Second, "how long SIGTERM lets tasks in flight finish before they go back to their queue").Check(config.Positive[time.Duration])
	s.Duration(&c.SimulateWork, "simulate-work", "WORKER_SIMULATE_WORK", 0, "testing aid: every task works this long inside its lock before it writes; 0 in production").Check(config.NonNegative[time.Duration])
}

func noBraces(s string) error {
	if strings.ContainsAny(s, "{}") {
		return errors.New("must not contain { or }")
	}
	return nil
}

// parseQueues reads "name=weight,name=weight".
func parseQueues(s string) (map[string]int, error) {
	out := map[string]int{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if !ok || err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want queue=weight with a positive weight", part)
		}
		out[strings.TrimSpace(name)] = n
	}
	if len(out) == 0 {
		return nil, errors.New("no queue")
	}
	return out, nil
}

func checkQueues(s string) error {
	_, err := parseQueues(s)
	return err
}

// run is the worker process: it loads the settings, connects to Redis,
// starts the worker and the ops server, waits for ctx to end, and shuts down
// in reverse order.
func run(ctx context.Context, args []string, getenv func(string) string) error {
	var c settings
	s := config.NewSet("worker", getenv)
	declare(s, &c)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil
		}
		return err
	}
	queues, _ := parseQueues(c.Queues) // checked by Parse

	log, err := logging.New(c.LogLevel, c.LogFormat, nil)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	rdb := redis.NewClient(c.Redis)
	defer rdb.Close()

	locker, err := lock.New(rdb, lock.Config{Prefix: c.Prefix + "lock:", TTL: c.LockTTL, Logger: log.Named("lock")})
	if err != nil {
		return err
	}
	defer locker.Close()
	var store orders.Store
	store, err = orders.NewRedis(rdb, orders.RedisConfig{Prefix: c.Prefix})
	if err != nil {
		return err
	}
	if c.SimulateWork > 0 {
		store = slowStore{Store: store, work: c.SimulateWork}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := worker.NewMetrics(reg)
	if err != nil {
		return err
	}
	w, err := worker.New(rdb, locker, store, worker.Config{
		Metrics:         metrics,
		Concurrency:     c.Concurrency,
		Queues:          queues,
		StrictPriority:  c.StrictPriority,
		ModifyWait:      c.ModifyWait,
		ExchangeWait:    c.ExchangeWait,
		BusyRetryMin:    c.BusyRetryMin,
		BusyRetryMax:    c.BusyRetryMax,
		ShutdownTimeout: c.Shutdown,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	if err := w.Start(); err != nil {
		return err
	}
	log.Info("worker started", zap.String("worker_id", w.ID()), zap.Any("queues", queues), zap.Int("concurrency", c.Concurrency))

	var ops *http.Server
	opsErr := make(chan error, 1)
	if c.OpsAddr != "" {
		ln, err := net.Listen("tcp", c.OpsAddr)
		if err != nil {
			w.Shutdown()
			return fmt.Errorf("ops listener: %w", err)
		}
		ops = &http.Server{Handler: opsHandler(rdb, w, reg), ReadHeaderTimeout: 5 * time.Second}
		log.Info("ops server listening", zap.String("addr", ln.Addr().String()))
		go func() { opsErr <- ops.Serve(ln) }()
	}

	select {
	case <-ctx.Done():
	case err := <-opsErr:
		log.Error("ops server stopped", zap.Error(err))
	}
	log.Info("shutting down", zap.Duration("timeout", c.Shutdown))
	w.Shutdown()
	if ops != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ops.Shutdown(sctx)
	}
	log.Info("worker stopped")
	return nil
}

// opsHandler serves the worker's health endpoints and metrics.
func opsHandler(rdb redis.UniversalClient, w *worker.Worker, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := rdb.Ping(ctx).Err(); err != nil {
			http.Error(rw, "redis unreachable\n", http.StatusServiceUnavailable)
			return
		}
		if err := w.Ping(); err != nil {
			http.Error(rw, "worker not running\n", http.StatusServiceUnavailable)
			return
		}
		rw.Write([]byte("ready\n"))
	})
	return mux
}

// slowStore makes every write take a while inside the order's lock, for
// tests and benchmarks (WORKER_SIMULATE_WORK). The wait ends early, with the
// context's cause, when the task is cancelled.
type slowStore struct {
	orders.Store
	work time.Duration
}

func (s slowStore) Modify(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
	if err := s.wait(ctx); err != nil {
		return orders.Result{}, err
	}
	return s.Store.Modify(ctx, ev, no, c)
}

func (s slowStore) Exchange(ctx context.Context, ev, no string, x orders.Exchange) (orders.Result, error) {
	if err := s.wait(ctx); err != nil {
		return orders.Result{}, err
	}
	return s.Store.Exchange(ctx, ev, no, x)
}

func (s slowStore) wait(ctx context.Context) error {
	t := time.NewTimer(s.work)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
