package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/telemetry"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// settings are the worker's configuration, one field per setting.
type settings struct {
	Redis          *redisconn.Options
	LogLevel       string
	LogFormat      string
	Prefix         string
	OpsAddr        string
	MetricsTokens  []string
	Concurrency    int
	Queues         string
	Shards         tasks.Shards
	StrictPriority bool
	LockTTL        time.Duration
	WaitReplicas   int
	WaitTimeout    time.Duration
	Waits          map[string]*worker.Wait // by kind name
	Failures       map[string]*string      // by kind name: halt or continue
	GapWait        time.Duration
	DrainMax       int
	DrainFor       time.Duration
	BusyRetryMin   time.Duration
	BusyRetryMax   time.Duration
	Shutdown       time.Duration
	SimulateWork   time.Duration

	OrderStore orderstore.Settings
}

// declare registers the worker's settings on s.
func declare(s *config.Set, c *settings) {
	s.Redis(&c.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL,
		"Redis shared by all processes: "+config.RedisURLForms)
	s.String(&c.LogLevel, "log-level", "LOG_LEVEL", "info", "log level: "+logging.Levels).Check(logging.CheckLevel)
	s.String(&c.LogFormat, "log-format", "LOG_FORMAT", logging.FormatJSON, "log format: json or console").Check(logging.CheckFormat)
	s.String(&c.Prefix, "key-prefix", "KEY_PREFIX", orderkeys.DefaultPrefix, "prefix of orderworker's Redis keys (locks, orders, token); shared by all processes").Check(noBraces)
	s.String(&c.OpsAddr, "ops-addr", "OPS_ADDR", "127.0.0.1:9090", "listen address of /healthz, /readyz and /metrics; off to disable; the default listens on this host's loopback only: :9090 (or 0.0.0.0:9090) listens on every interface, as probes and scrapes of a container need")
	s.StringList(&c.MetricsTokens, "metrics-tokens", "METRICS_TOKENS", nil, "comma-separated bearer tokens, each at least 16 characters, one of which /metrics then requires (several allow rotation); empty: /metrics is open. /healthz and /readyz stay open").Secret()
	s.Int(&c.Concurrency, "concurrency", "WORKER_CONCURRENCY", worker.DefaultConcurrency, "tasks run at once by this process").Check(config.Positive[int])
	s.String(&c.Queues, "queues", "WORKER_QUEUES", defaultQueues(), "queues to serve with their priority weights; with shards, every shard of a queue has its weight").Check(checkQueues).
		DocDefault("each kind's queue at the kind's weight (`worker -h` shows them)")
	s.Shards(&c.Shards, "queue-shards", "QUEUE_SHARDS", "queues each task type is spread over, by CRC-32 of the order number (1: the types' own queues), served and accepted: "+config.ShardsForms+"; the same on every process")
	s.Bool(&c.StrictPriority, "strict-priority", "WORKER_STRICT_PRIORITY", false, "serve a queue only when higher-weighted ones are empty")
	s.Duration(&c.LockTTL, "lock-ttl", "LOCK_TTL", worker.DefaultLockTTL, "order lock lease; renewed every third of it while a task runs").Check(config.Positive[time.Duration])
	s.Int(&c.WaitReplicas, "wait-replicas", "WAIT_REPLICAS", 0,
		"replicas that must have an order's lock, fence, positions and task before a change is written to the order store (Redis WAIT), so that a failover cannot hand them out again; set it with ORDER_STORE=http, at most the replicas each master has (a warning at start names a master with fewer, when INFO may be read); 0: no wait").Check(config.NonNegative[int])
	s.Duration(&c.WaitTimeout, "wait-timeout", "WAIT_TIMEOUT", worker.DefaultWaitTimeout,
		"how long a write waits for WAIT_REPLICAS before the task goes back to run again (not a failure); below the Redis read timeout").Check(config.Positive[time.Duration])
	// One setting of each family per kind; the doc shows each family as
	// one row, so that a kind added with the default wait changes nothing
	// in it.
	const perKind = "; one per kind of the worker's table, named by the kind's name (worker -h lists them)"
	def := worker.DefaultWait()
	waitMin := &config.Family[time.Duration]{Flag: "<kind>-wait-min", Env: "<KIND>_WAIT_MIN", Default: def.MinDelay,
		Usage: "shortest random delay of a task of the kind waiting for its order or its turn" + perKind}
	waitMax := &config.Family[time.Duration]{Flag: "<kind>-wait-max", Env: "<KIND>_WAIT_MAX", Default: def.MaxDelay,
		Usage: "longest random delay of a task of the kind waiting for its order or its turn" + perKind}
	waitDeadline := &config.Family[time.Duration]{Flag: "<kind>-wait-deadline", Env: "<KIND>_WAIT_DEADLINE", Default: def.Deadline,
		Usage: "how long a task of the kind waits for its order or its turn before going back to the queue (not a failure)" + perKind}
	c.Waits = make(map[string]*worker.Wait)
	for _, k := range worker.Kinds() {
		w := new(worker.Wait)
		c.Waits[k.Kind.Name] = w
		flag, env, name := k.Kind.Name+"-wait-", strings.ToUpper(k.Kind.Name)+"_WAIT_", k.Kind.Name
		s.Duration(&w.MinDelay, flag+"min", env+"MIN", k.Wait.MinDelay, "shortest random delay of "+article(name)+" waiting for its order or its turn").Check(config.Positive[time.Duration]).Of(waitMin, name)
		s.Duration(&w.MaxDelay, flag+"max", env+"MAX", k.Wait.MaxDelay, "longest random delay of "+article(name)+" waiting for its order or its turn").Check(config.Positive[time.Duration]).Of(waitMax, name)
		s.Duration(&w.Deadline, flag+"deadline", env+"DEADLINE", k.Wait.Deadline, "how long "+article(name)+" waits for its order or its turn before going back to the queue (not a failure)").Check(config.Positive[time.Duration]).Of(waitDeadline, name)
	}
	failure := &config.Family[string]{Flag: "<kind>-failure", Env: "<KIND>_FAILURE", Default: string(worker.Halt),
		Usage: "what becomes of an order whose change of the kind fails past its retries: halt (the change stays the order's head, nothing behind it runs, and the order is listed as blocked halted until an operator retries or skips it; docs/operations.md) or continue (archived; the order's next change goes on)" + perKind}
	c.Failures = make(map[string]*string)
	for _, k := range worker.Kinds() {
		f := new(string)
		c.Failures[k.Kind.Name] = f
		name := k.Kind.Name
		s.String(f, name+"-failure", strings.ToUpper(name)+"_FAILURE", string(k.Failure),
			"what becomes of an order whose "+name+" fails past its retries: halt or continue").Check(checkFailure).Of(failure, name)
	}
	s.Duration(&c.GapWait, "gap-wait", "GAP_WAIT", worker.DefaultGapWait, "how long an order's next position may stay without its task before the tasks behind it check with asynq and skip it if the task does not exist").Check(config.Positive[time.Duration])
	s.Int(&c.DrainMax, "drain-max", "WORKER_DRAIN_MAX", worker.DefaultDrainMax, "most changes of one order a worker runs in one quantum of a hold of its lock, the first included; 1 turns the drain off (the quantum: docs/guarantees.md, the holder drains)").Check(config.Positive[int])
	s.Duration(&c.DrainFor, "drain-for", "WORKER_DRAIN_FOR", worker.DefaultDrainFor, "longest time of one quantum of a hold of an order's lock (see WORKER_DRAIN_MAX)").Check(config.Positive[time.Duration])
	s.Duration(&c.BusyRetryMin, "busy-retry-min", "BUSY_RETRY_MIN", worker.DefaultBusyRetryMin, "shortest delay before a task that waited, lost its lease or met a stale fence runs again").Check(config.Positive[time.Duration])
	s.Duration(&c.BusyRetryMax, "busy-retry-max", "BUSY_RETRY_MAX", worker.DefaultBusyRetryMax, "longest delay before a task that waited, lost its lease or met a stale fence runs again").Check(config.Positive[time.Duration])
	s.Duration(&c.Shutdown, "shutdown-timeout", "SHUTDOWN_TIMEOUT", worker.DefaultShutdownTimeout, "how long SIGTERM lets tasks in flight finish before they go back to their queue").Check(config.Positive[time.Duration])
	s.Duration(&c.SimulateWork, "simulate-work", "WORKER_SIMULATE_WORK", 0, "testing aid: every task works this long inside its lock before it writes; 0 in production").Check(config.NonNegative[time.Duration])
	orderstore.Declare(s, &c.OrderStore)
}

// checkFailure accepts a failure policy: halt or continue.
func checkFailure(s string) error {
	if p := worker.FailurePolicy(s); p != worker.Halt && p != worker.Continue {
		return errors.New("want halt or continue")
	}
	return nil
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

// defaultQueues is worker.DefaultQueues as WORKER_QUEUES writes it, highest
// weight first.
func defaultQueues() string {
	var parts []string
	for _, k := range worker.Kinds() {
		parts = append(parts, k.Kind.Queue+"="+strconv.Itoa(k.Kind.Weight))
	}
	return strings.Join(parts, ",")
}

// article puts "a" or "an" before a kind's name.
func article(name string) string {
	if strings.ContainsRune("aeiou", rune(name[0])) {
		return "an " + name
	}
	return "a " + name
}

// run is the worker process: it loads the settings, connects to Redis,
// starts the worker and the ops server, waits for ctx to end, and shuts down
// in reverse order. It logs to stderr.
func run(ctx context.Context, args []string, getenv func(string) string) error {
	return runLogTo(ctx, args, getenv, nil)
}

// runLogTo is run with its log written to logw (os.Stderr when nil).
func runLogTo(ctx context.Context, args []string, getenv func(string) string, logw io.Writer) error {
	c, err := parseRun(args, getenv)
	if c == nil || err != nil {
		return err // nil after -h
	}
	log, err := logging.New(c.LogLevel, c.LogFormat, logw)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	c.logStart(log)

	// Tracing, by the standard OTEL_* variables only: off unless set.
	tr, stopTracing, err := telemetry.Start(ctx, "orderworker-worker", getenv, log)
	if err != nil {
		return err
	}
	defer stopTracing() // last, after the worker's runs ended: their spans are flushed

	rdb := c.Redis.NewClient()
	defer rdb.Close()
	if err := telemetry.InstrumentRedis(rdb, tr.Provider()); err != nil {
		return err
	}
	reg, metrics, err := newRegistry()
	if err != nil {
		return err
	}
	opened, err := c.openStore(rdb, metrics, tr, log)
	if err != nil {
		return err
	}
	defer opened.Close()
	w, err := c.newWorker(rdb, opened.Store, metrics, tr, log)
	if err != nil {
		return err
	}
	if err := c.start(ctx, rdb, w, log); err != nil {
		return err
	}
	return c.serveOps(ctx, w, opsHandler(rdb, w, reg, c.metricsAuth), log)
}

// runSettings are the worker's settings, parsed and checked, with what
// they are read into.
type runSettings struct {
	settings
	queues      map[string]int
	metricsAuth httpauth.Scheme // nil: /metrics is open
	ignored     []string        // the order API settings ORDER_STORE ignores
	logField    zap.Field       // the settings, as the start's log line shows them
}

// parseRun reads and checks the worker's settings from args and getenv. It
// returns nil and no error after -h.
func parseRun(args []string, getenv func(string) string) (*runSettings, error) {
	var c runSettings
	s := config.NewSet("worker", getenv)
	declare(s, &c.settings)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	c.queues, _ = parseQueues(c.Queues) // checked by Parse
	var err error
	if c.ignored, err = c.OrderStore.Check(); err != nil {
		return nil, err
	}
	if c.metricsAuth, err = metricsScheme(c.MetricsTokens); err != nil {
		return nil, err
	}
	c.logField = s.LogField()
	return &c, nil
}

// logStart makes log go-redis's log too, and logs the start with the
// settings.
func (c *runSettings) logStart(log *zap.Logger) {
	logging.Redis.Set(log) // go-redis's own lines (see logging.CaptureRedis)
	log.Info("starting", c.logField)
	if len(c.ignored) > 0 {
		log.Warn("order API settings ignored: ORDER_STORE is not http", zap.Strings("settings", c.ignored))
	}
}

// newRegistry returns the registry /metrics serves, with the Go and
// process collectors and the worker's metrics registered in it.
func newRegistry() (*prometheus.Registry, *worker.Metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := worker.NewMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	return reg, metrics, nil
}

// openStore opens the order store of ORDER_STORE, its token's refreshes
// and waits counted in metrics. The caller closes it.
func (c *runSettings) openStore(rdb redis.UniversalClient, metrics *worker.Metrics, tr *telemetry.Tracing, log *zap.Logger) (*orderstore.Store, error) {
	return orderstore.Open(rdb, c.Prefix, &c.OrderStore, orderstore.Hooks{
		OnRefresh:      metrics.TokenRefreshed,
		OnWait:         metrics.TokenWaited,
		TracerProvider: tr.Provider(),
		SharedToken:    true, // the workers share theirs through Redis; no one else may read it
	}, log)
}

// newWorker returns the worker of the settings, writing to store.
func (c *runSettings) newWorker(rdb redis.UniversalClient, store orders.Store, metrics *worker.Metrics, tr *telemetry.Tracing, log *zap.Logger) (*worker.Worker, error) {
	var kinds []worker.Kind // the default, worker.Kinds()
	if c.SimulateWork > 0 {
		kinds = storehook.Kinds(kinds, storehook.Delay(c.SimulateWork))
	}
	waits := make(map[string]worker.Wait, len(c.Waits))
	for name, w := range c.Waits {
		waits[name] = *w
	}
	failures := make(map[string]worker.FailurePolicy, len(c.Failures))
	for name, f := range c.Failures {
		failures[name] = worker.FailurePolicy(*f)
	}
	return worker.New(rdb, store, worker.Config{
		Kinds:           kinds,
		KeyPrefix:       c.Prefix,
		LockTTL:         c.LockTTL,
		WaitReplicas:    c.WaitReplicas,
		WaitTimeout:     c.WaitTimeout,
		Metrics:         metrics,
		Concurrency:     c.Concurrency,
		Queues:          c.queues,
		Shards:          c.Shards,
		StrictPriority:  c.StrictPriority,
		Waits:           waits,
		Failures:        failures,
		GapWait:         c.GapWait,
		DrainMax:        c.DrainMax,
		DrainFor:        c.DrainFor,
		BusyRetryMin:    c.BusyRetryMin,
		BusyRetryMax:    c.BusyRetryMax,
		ShutdownTimeout: c.Shutdown,
		Logger:          log,
		TracerProvider:  tr.Provider(),
	})
}

// start checks the release notices and starts w.
func (c *runSettings) start(ctx context.Context, rdb redis.UniversalClient, w *worker.Worker, log *zap.Logger) error {
	// Before the first task: with a Redis user that may not use the notice
	// channel, the worker runs without notices (slower: waiters poll) and
	// says which ACL rule would give them back. A Redis that does not
	// answer (a Cluster master or a Sentinel master failing over, which
	// takes seconds) is asked again for up to 10 s.
	err := checkUntil(ctx, 10*time.Second, w.CheckNotices)
	switch {
	case errors.Is(err, worker.ErrNoNotices):
		log.Warn("release notices are off: waiting tasks poll with their random delays", zap.Error(err))
	case err != nil:
		return fmt.Errorf("check Redis (REDIS_URL): %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	warnReplicas(pingCtx, rdb, c.WaitReplicas, log)
	cancel()
	if err := w.Start(); err != nil {
		return err
	}
	log.Info("worker started", zap.String("worker_id", w.ID()), zap.Any("queues", w.Queues()), zap.Int("concurrency", c.Concurrency),
		zap.String("order_store", c.OrderStore.Store))
	return nil
}

// serveOps serves ops (unless OPS_ADDR is off) until ctx is done or the
// ops server stops by itself, then shuts w down, and the ops server after
// it: probes and scrapes see the shutdown through. It returns the ops
// server's error.
func (c *runSettings) serveOps(ctx context.Context, w *worker.Worker, ops http.Handler, log *zap.Logger) error {
	var opsErr error
	opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOps()
	var opsDone chan error // nil, never ready, without an ops server
	if c.OpsAddr != "off" {
		ln, err := net.Listen("tcp", c.OpsAddr)
		if err != nil {
			w.Shutdown()
			return fmt.Errorf("ops listener on %s (OPS_ADDR): %w", c.OpsAddr, err)
		}
		everywhere := httpserve.EveryInterface(ln.Addr())
		log.Info("ops server listening", zap.String("addr", ln.Addr().String()), zap.Bool("every_interface", everywhere))
		if everywhere && c.metricsAuth == nil {
			log.Warn("the ops port listens on every interface and /metrics needs no token (METRICS_TOKENS): anyone who reaches the port reads the queues' names and sizes")
		}
		opsDone = make(chan error, 1)
		go func() {
			opsDone <- httpserve.Serve(opsCtx, ln, ops, httpserve.Config{ShutdownTimeout: 5 * time.Second}, log.Named("ops"))
		}()
	}
	select {
	case <-ctx.Done():
	case opsErr = <-opsDone: // it stopped by itself: shut down and say why
		opsDone = nil
	}
	log.Info("shutting down", zap.Duration("timeout", c.Shutdown))
	w.Shutdown()
	stopOps()
	if opsDone != nil {
		opsErr = <-opsDone
	}
	log.Info("worker stopped")
	return opsErr
}

// metricsRealm names the worker's /metrics in its WWW-Authenticate
// challenge.
const metricsRealm = "orderworker worker metrics"

// metricsScheme is the authentication /metrics requires with the bearer
// tokens of METRICS_TOKENS, nil (open) without any. A bad token is an
// error naming the setting and the token's position, never its value.
func metricsScheme(tokens []string) (httpauth.Scheme, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	s, err := httpauth.Bearer(metricsRealm, tokens)
	if err != nil {
		return nil, fmt.Errorf("METRICS_TOKENS (-metrics-tokens): %w", err)
	}
	return s, nil
}

// opsHandler serves the worker's health endpoints and metrics. /metrics
// requires metricsAuth when it is not nil; the health endpoints are always
// open, since probes carry no credentials and the answers reveal nothing.
func opsHandler(rdb redis.UniversalClient, w *worker.Worker, reg *prometheus.Registry, metricsAuth httpauth.Scheme) http.Handler {
	mux := http.NewServeMux()
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if metricsAuth != nil {
		metrics = httpauth.Require(metricsAuth)(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = rw.Write([]byte("ok\n"))
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
		_, _ = rw.Write([]byte("ready\n"))
	})
	return mux
}

// checkUntil calls check until it returns nil or an error matching
// [worker.ErrNoNotices] (a refusal, which asking again does not change), and
// returns that; after limit it returns the last error. It runs for up to
// limit even when ctx ends (a SIGTERM at start-up), as the single check
// before it did: start-up is short, and the worker stops right after.
// Each call gets what is left of limit.
func checkUntil(ctx context.Context, limit time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		err := check(ctx)
		if err == nil || errors.Is(err, worker.ErrNoNotices) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
