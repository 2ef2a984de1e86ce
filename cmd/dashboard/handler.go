package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hibiken/asynqmon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// readyTimeout bounds the Redis PING behind /readyz.
const readyTimeout = 2 * time.Second

// newHandler returns the dashboard's routes, wrapped in the access log:
//
//	<root>/...   asynqmon's UI and API, behind authentication, with task IDs
//	             outside the contract shown escaped and refused in writes,
//	             queues outside the deployment hidden and refused, and a
//	             Content-Security-Policy
//	<root>/orders, <root>/orders/{order_no}
//	             the order page (see orderPages), behind authentication
//	<root>/blocked-orders, <root>/blocked-orders.json (.js, .css)
//	             the blocked-orders page and its data (see blockedPages),
//	             behind authentication
//	/metrics     Prometheus metrics, behind authentication if MetricsAuth:
//	             the UI's credentials or a metrics token (the only route a
//	             metrics token opens)
//	/healthz     200 while the process serves
//	/readyz      200 while Redis answers PING, else 503 (the answer is
//	             kept for 1 s: at most about one PING a second)
//	/            redirects to <root>/ when root is not /
func newHandler(cfg *settings, rdb redis.UniversalClient, store orders.Store, log *zap.Logger) (http.Handler, error) {
	protect := func(h http.Handler) http.Handler { return h }
	protectMetrics := protect
	if cfg.auth != nil {
		// Failed logins are throttled per client (see loginThrottle), on
		// every authenticated route of the UI, with one count per client
		// for all; /metrics has a count of its own, so that failed logins
		// at the UI never throttle the scraper, nor the other way round.
		// /metrics also takes the metrics tokens, which open nothing else.
		guarded := func(s httpauth.Scheme, log *zap.Logger) func(http.Handler) http.Handler {
			throttle := newLoginThrottle(loginFailBurst, loginFailEvery, maxThrottledClients, time.Now, log)
			require := httpauth.Require(throttle.scheme(s))
			return func(h http.Handler) http.Handler { return throttle.guard(s, require(notePrincipal(h))) }
		}
		protect = guarded(cfg.auth, log.Named("auth"))
		metricsScheme := cfg.auth
		if cfg.metricsAuth != nil {
			metricsScheme = httpauth.Any(cfg.auth, cfg.metricsAuth)
		}
		protectMetrics = guarded(metricsScheme, log.Named("auth").With(zap.String("route", "/metrics")))
	}

	monRoot := cfg.Root
	if monRoot == "/" {
		monRoot = ""
	}
	mon := asynqmon.New(asynqmon.Options{
		RootPath: monRoot,
		// asynqmon gets the process's client, whatever the topology
		// (see redisconn.ConnOpt); so the handler's Close, which would
		// close it, is never called, and run closes rdb last.
		RedisConnOpt:      redisconn.ConnOpt(rdb),
		ReadOnly:          cfg.ReadOnly,
		PayloadFormatter:  asynqmon.PayloadFormatterFunc(formatPayload),
		ResultFormatter:   asynqmon.ResultFormatterFunc(formatResult),
		PrometheusAddress: cfg.PrometheusURL,
	})
	// Cross-origin protection refuses the UI's write requests (POST, DELETE)
	// when a browser says they come from another site: the browser would
	// otherwise attach the cached basic-auth credentials to them. The task ID
	// guard keeps a crafted task ID, queue or group name from turning a click
	// into another action (see guardAPI).
	// asynqmon's pages get a Content-Security-Policy that allows their own
	// inline scripts only (see asynqmonCSP).
	kinds := cfg.Kinds
	if kinds == nil {
		kinds = tasks.Kinds()
	}
	queues := newQueueSet(cfg.Shards, kinds, log.Named("guard"))
	csp, err := asynqmonCSP(mon, monRoot)
	if err != nil {
		return nil, err
	}
	ui := protect(uiHeaders(withCSP(csp, http.NewCrossOriginProtection().Handler(guardAPI(monRoot+"/api/", queues, mon)))))

	views, err := orderview.New(rdb, store, orderview.Config{KeyPrefix: cfg.KeyPrefix, GapWait: cfg.GapWait, Shards: cfg.Shards,
		Kinds: kinds, BlockedAfter: cfg.BlockedAfter})
	if err != nil {
		return nil, fmt.Errorf("order views (KEY_PREFIX, GAP_WAIT, QUEUE_SHARDS, BLOCKED_AFTER): %w", err)
	}
	actionRate, err := parseActionRate(cfg.ActionRate)
	if err != nil {
		return nil, fmt.Errorf("DASHBOARD_ACTION_RATE: %w", err)
	}
	// The operator actions (orderops) hold nothing to close: they never
	// take a lock. With the Redis store they note each action in the
	// order's history (the writing dashboard's user may write it).
	ops, err := orderops.New(rdb, orderops.Config{KeyPrefix: cfg.KeyPrefix, Shards: cfg.Shards, Kinds: kinds, Logger: log, Store: store,
		Rate: actionRate, Burst: cfg.ActionBurst})
	if err != nil {
		return nil, fmt.Errorf("order actions (KEY_PREFIX, QUEUE_SHARDS): %w", err)
	}
	pages, err := newOrderPages(views, ops, rdb, queues, kinds, monRoot, cfg.ReadOnly, log.Named("orders"))
	if err != nil {
		return nil, fmt.Errorf("order page: %w", err)
	}
	// The actions are POSTs: cross-origin protection refuses them from
	// another site, as it does asynqmon's.
	orderUI := protect(uiHeaders(http.NewCrossOriginProtection().Handler(pages)))
	blocked, err := newBlockedPages(views, pages, monRoot, cfg.ReadOnly, log.Named("blocked"))
	if err != nil {
		return nil, fmt.Errorf("blocked-orders page: %w", err)
	}
	blockedUI := protect(uiHeaders(blocked))

	reg := prometheus.NewRegistry()
	seq, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{})
	if err != nil {
		return nil, fmt.Errorf("key space (KEY_PREFIX): %w", err)
	}
	if err := registerMetrics(reg, rdb, cfg.Shards.AllQueues(kinds), log.Named("metrics"),
		newBlockedCollector(views, blockedScrapeTimeout, log.Named("metrics")),
		newBacklogCollector(seq, backlogScrapeTimeout, log.Named("metrics"))); err != nil {
		return nil, err
	}
	// A collector that fails costs only its own series: the scrape serves
	// the rest, and the error is logged (ContinueOnError), so that one
	// failing read never takes asynq's queue gauges and their alerts down.
	var metricsHandler http.Handler = promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(log.Named("metrics")),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	if cfg.MetricsAuth {
		metricsHandler = protectMetrics(metricsHandler)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /healthz", noStore(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})))
	mux.Handle("GET /readyz", noStore(readyz(rdb, log)))
	mux.Handle("GET /metrics", metricsHandler)
	mux.Handle(monRoot+"/orders", orderUI)
	mux.Handle(monRoot+"/orders/", orderUI)
	for _, ext := range []string{"", ".json", ".js", ".css"} {
		mux.Handle(monRoot+blockedPath+ext, blockedUI)
	}
	if cfg.Root == "/" {
		mux.Handle("/", ui)
	} else {
		mux.Handle(cfg.Root, ui)
		mux.Handle(cfg.Root+"/", ui)
		mux.Handle("GET /{$}", http.RedirectHandler(cfg.Root+"/", http.StatusFound))
	}
	return httpserve.AccessLog(log.Named("http"), mux), nil
}

// registerMetrics registers the series of the dashboard's /metrics on reg:
// the Go runtime's, the process's, asynq's queue gauges of queues, read
// from rdb at each scrape, each queue on its own (newQueueCollector), and
// more: the blocked-orders gauges (newBlockedCollector) and the backlog
// gauges (newBacklogCollector). The alert rules
// and the Grafana dashboard in deploy/ name these (and the worker's); a
// test of this package checks that every name they use is registered here
// or by worker.NewMetrics.
func registerMetrics(reg prometheus.Registerer, rdb redis.UniversalClient, queues []string, log *zap.Logger, more ...prometheus.Collector) error {
	for _, c := range append([]prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newQueueCollector(rdb, queues, queueScrapeTimeout, log),
	}, more...) {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// readyz answers /readyz from a Redis PING whose result is kept for
// httpserve.DefaultReadyFor, so that a flood of unauthenticated probes
// makes about one PING a second.
func readyz(rdb redis.UniversalClient, log *zap.Logger) http.HandlerFunc {
	ready := httpserve.NewReady(func(ctx context.Context) error { return rdb.Ping(ctx).Err() }, readyTimeout, 0, nil)
	return func(w http.ResponseWriter, r *http.Request) {
		if err := ready.Check(r.Context()); err != nil {
			log.Warn("not ready: redis ping failed", zap.Error(err))
			http.Error(w, "redis unreachable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}
}

func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// uiHeaders adds the browser hardening headers of the UI: no framing (so
// the write buttons cannot be clickjacked), no MIME sniffing, and no
// referrer leaving the dashboard.
func uiHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// notePrincipal tells the access log who is authenticated.
func notePrincipal(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpserve.InfoFrom(r.Context()).Principal, _ = httpauth.Principal(r.Context())
		h.ServeHTTP(w, r)
	})
}
