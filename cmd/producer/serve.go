package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/intake"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/telemetry"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// serveSettings is the configuration of "producer serve".
//
// There is no default API key, and serve refuses to start without one
// unless -insecure-no-auth is given. That switch is a flag only, with no
// environment variable, so that turning authentication off shows on the
// command line and is never inherited from a stray variable; it may not be
// combined with keys.
type serveSettings struct {
	common
	Addr            string
	APIKeys         []string
	AdminKeys       []string
	InsecureNoAuth  bool
	MaxBody         int
	ReadTimeout     time.Duration
	WriteTimeout    time.Duration
	IdleTimeout     time.Duration
	RequestTimeout  time.Duration
	ShutdownTimeout time.Duration
	Rate            string
	Burst           int
	KeyRates        []string
	ActionRate      string
	ActionBurst     int
	LogLevel        string
	LogFormat       string
}

// declareServe declares the settings of serve on s.
func declareServe(s *config.Set, c *serveSettings) {
	s.String(&c.Addr, "addr", "INTAKE_ADDR", "127.0.0.1:8080", "listen address, host:port; the default listens on this host's loopback only: :8080 (or 0.0.0.0:8080) listens on every interface, as a container needs").Check(config.NotEmpty)
	s.StringList(&c.APIKeys, "api-keys", "INTAKE_API_KEYS", nil, "comma-separated bearer API keys, each at least 16 characters; several allow rotation").Secret()
	s.StringList(&c.AdminKeys, "admin-keys", "INTAKE_ADMIN_KEYS", nil, "comma-separated bearer keys of the admin scope: the only keys the operator actions (POST /v1/orders/{order_no}/actions/...) accept, recorded as admin#N; none: no key may act. Run the intake with the intake-admin ACL rule when set").Secret()
	s.Bool(&c.InsecureNoAuth, "insecure-no-auth", "", false, "serve without authentication (flag only; for local development)")
	s.Int(&c.MaxBody, "max-body", "INTAKE_MAX_BODY", intake.DefaultMaxBody, "largest request body in bytes; larger ones get 413").Check(config.Positive[int], atMostPayload)
	s.Duration(&c.ReadTimeout, "read-timeout", "INTAKE_READ_TIMEOUT", httpserve.DefaultReadTimeout, "longest time to read a request, headers and body").Check(config.Positive[time.Duration])
	s.Duration(&c.WriteTimeout, "write-timeout", "INTAKE_WRITE_TIMEOUT", httpserve.DefaultWriteTimeout, "longest time from the end of the request headers to the end of the answer").Check(config.Positive[time.Duration])
	s.Duration(&c.IdleTimeout, "idle-timeout", "INTAKE_IDLE_TIMEOUT", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection stays open").Check(config.Positive[time.Duration])
	s.Duration(&c.RequestTimeout, "request-timeout", "INTAKE_REQUEST_TIMEOUT", intake.DefaultRequestTimeout, "longest Redis work of one request before it is answered 503; below the write timeout").Check(config.Positive[time.Duration])
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "INTAKE_SHUTDOWN_TIMEOUT", httpserve.DefaultShutdownTimeout, "how long SIGTERM lets requests in flight finish").Check(config.Positive[time.Duration])
	s.String(&c.Rate, "rate", "INTAKE_RATE", "2000", "enqueues a second each API key may make, sustained, past a burst of INTAKE_BURST (a token bucket per key and per replica; reads are not limited); past it 429 rate_limited with Retry-After; off for no limit (0 is refused)").Check(checkRate)
	s.Int(&c.Burst, "burst", "INTAKE_BURST", intake.DefaultBurst, "enqueues an API key may make at once above INTAKE_RATE: the size of its bucket").Check(config.Positive[int])
	s.StringList(&c.KeyRates, "key-rates", "INTAKE_KEY_RATES", nil, "per-key overrides of INTAKE_RATE and INTAKE_BURST, comma-separated N=RATE, N=RATE:BURST or N=off, N the key's position in INTAKE_API_KEYS (key#N in the logs); e.g. 2=50:200,3=off").Check(checkKeyRates)
	s.String(&c.ActionRate, "action-rate", "INTAKE_ACTION_RATE", "1", "operator actions a second each admin key (admin#N) may take, sustained, past a burst of INTAKE_ACTION_BURST (a token bucket per key and per replica); past it 429 rate_limited with Retry-After, and nothing is done; off for no limit (0 is refused)").Check(checkRate)
	s.Int(&c.ActionBurst, "action-burst", "INTAKE_ACTION_BURST", orderops.DefaultBurst, "operator actions an admin key may take at once above INTAKE_ACTION_RATE").Check(config.Positive[int])
	declareCommon(s, &c.common)
	s.String(&c.LogLevel, "log-level", "LOG_LEVEL", "info", "log level: "+logging.Levels).Check(logging.CheckLevel)
	s.String(&c.LogFormat, "log-format", "LOG_FORMAT", logging.FormatJSON, "log format: json or console").Check(logging.CheckFormat)
}

func atMostPayload(n int) error {
	if n > tasks.MaxPayloadBytes {
		return fmt.Errorf("must be at most %d (the largest payload the workers parse)", tasks.MaxPayloadBytes)
	}
	return nil
}

// parseRate reads a rate setting: a positive number of enqueues a second,
// or "off" for no limit. 0 is refused rather than read as "refuse
// everything" or as "off": the one way to turn a limit off is to say so.
func parseRate(raw string) (rate.Limit, error) {
	raw = strings.TrimSpace(raw)
	if strings.EqualFold(raw, "off") {
		return intake.Unlimited, nil
	}
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, errors.New("want a positive number of enqueues a second, or off for no limit")
	}
	return rate.Limit(f), nil
}

func checkRate(raw string) error {
	_, err := parseRate(raw)
	return err
}

// parseKeyRates reads INTAKE_KEY_RATES: items N=RATE, N=RATE:BURST or
// N=off, N a key's 1-based position, each N once.
func parseKeyRates(items []string) (map[int]intake.Limit, error) {
	out := make(map[int]intake.Limit)
	for _, item := range items {
		pos, spec, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(strings.TrimSpace(pos))
		if !ok || err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want N=RATE, N=RATE:BURST or N=off, N the key's position from 1", item)
		}
		if _, dup := out[n]; dup {
			return nil, fmt.Errorf("key #%d given twice", n)
		}
		rateRaw, burstRaw, hasBurst := strings.Cut(spec, ":")
		r, err := parseRate(rateRaw)
		if err != nil {
			return nil, fmt.Errorf("key #%d: %w", n, err)
		}
		var b int
		if hasBurst {
			b, err = strconv.Atoi(strings.TrimSpace(burstRaw))
			if err != nil || b < 1 {
				return nil, fmt.Errorf("key #%d: the burst after ':' must be a positive integer", n)
			}
		}
		out[n] = intake.Limit{Rate: r, Burst: b}
	}
	return out, nil
}

func checkKeyRates(items []string) error {
	_, err := parseKeyRates(items)
	return err
}

// serve runs the HTTP intake (package intake) until ctx is done, then shuts
// down gracefully: it stops accepting, lets the requests in flight finish
// within the shutdown timeout, and closes Redis last. args are the
// arguments after "serve"; the logs and the -h text go to stdout.
//
// It returns nil after -h and after a clean shutdown, and an error for bad
// settings, missing API keys (without -insecure-no-auth), an address it
// cannot listen on, or a shutdown that timed out. Redis may be down at
// start: serve starts anyway, warns, and answers 503 (/readyz included)
// until Redis answers.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	c, err := parseServe(args, getenv, stdout)
	if c == nil || err != nil {
		return err // nil after -h
	}
	root, err := logging.New(c.LogLevel, c.LogFormat, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = root.Sync() }()
	log := c.logStart(root)

	// Tracing, by the standard OTEL_* variables only: off unless set.
	tr, stopTracing, err := telemetry.Start(ctx, "orderworker-intake", getenv, log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer stopTracing() // last, after the server answered its last request

	rdb := c.Redis.NewClient()
	defer func() {
		if err := rdb.Close(); err != nil {
			log.Warn("close redis", zap.Error(err))
		}
	}()
	if err := telemetry.InstrumentRedis(rdb, tr.Provider()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	p, err := c.newProducer(rdb, tr)
	if err != nil {
		return err
	}
	defer p.Close()
	// The reads of the order API (ORDER_STORE=http) join the request's trace.
	store, err := orderstore.Open(rdb, c.Prefix, &c.OrderStore, orderstore.Hooks{TracerProvider: tr.Provider()}, root)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer store.Close()
	handler, err := c.newIntake(rdb, p, store.Store, tr, log)
	if err != nil {
		return err
	}
	c.checkRedis(ctx, rdb, p, log)
	return c.listenAndServe(ctx, handler, log)
}

// serveRun is the settings of serve, parsed and checked, with what they
// are read into.
type serveRun struct {
	serveSettings
	rateLimit  rate.Limit
	actionRate rate.Limit
	keyLimits  map[int]intake.Limit
	ignored    []string  // the order API settings ORDER_STORE ignores
	logField   zap.Field // the settings, as the start's log line shows them
}

// parseServe reads and checks the settings of serve from args and getenv,
// its -h text written to stdout. It returns nil and no error after -h.
func parseServe(args []string, getenv func(string) string, stdout io.Writer) (*serveRun, error) {
	c := serveRun{serveSettings: serveSettings{common: common{Kinds: tasks.Kinds()}}}
	set := config.NewSet("producer serve", getenv)
	set.SetOutput(stdout)
	declareServe(set, &c.serveSettings)
	if err := set.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	if len(set.Args()) > 0 {
		return nil, fmt.Errorf("serve: unexpected arguments %q (serve takes flags only; see -h)", set.Args())
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	c.rateLimit, _ = parseRate(c.Rate)         // checked by Parse
	c.actionRate, _ = parseRate(c.ActionRate)  // checked by Parse
	c.keyLimits, _ = parseKeyRates(c.KeyRates) // checked by Parse
	for _, n := range slices.Sorted(maps.Keys(c.keyLimits)) {
		if n > len(c.APIKeys) {
			return nil, fmt.Errorf("serve: INTAKE_KEY_RATES (-key-rates): no key #%d: INTAKE_API_KEYS has %d", n, len(c.APIKeys))
		}
	}
	var err error
	if c.ignored, err = c.OrderStore.Check(); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	c.logField = set.LogField()
	return &c, nil
}

// check returns an error for settings that each pass Parse but not
// together: timeouts out of order, keys given with -insecure-no-auth, or
// none without it.
func (c *serveSettings) check() error {
	switch {
	case c.RequestTimeout >= c.WriteTimeout:
		return fmt.Errorf("serve: INTAKE_REQUEST_TIMEOUT (%v) must be below INTAKE_WRITE_TIMEOUT (%v), or a slow Redis would cut answers off", c.RequestTimeout, c.WriteTimeout)
	case c.InsecureNoAuth && len(c.AdminKeys) > 0:
		return errors.New("serve: -insecure-no-auth given together with INTAKE_ADMIN_KEYS (-admin-keys): drop one or the other")
	case c.InsecureNoAuth && len(c.APIKeys) > 0:
		return errors.New("serve: -insecure-no-auth given together with INTAKE_API_KEYS (-api-keys): drop one or the other")
	case !c.InsecureNoAuth && len(c.APIKeys) == 0:
		return errors.New("serve: no API keys: set INTAKE_API_KEYS (-api-keys), or pass -insecure-no-auth to serve without authentication")
	case c.InsecureNoAuth && len(c.KeyRates) > 0:
		return errors.New("serve: INTAKE_KEY_RATES (-key-rates) given with -insecure-no-auth: without keys every caller shares the one bucket of INTAKE_RATE and INTAKE_BURST")
	}
	return nil
}

// logStart makes root go-redis's log too, logs the start with the
// settings, and returns the intake's logger.
func (c *serveRun) logStart(root *zap.Logger) *zap.Logger {
	logging.Redis.Set(root) // go-redis's own lines (see logging.CaptureRedis)
	log := root.Named("intake")
	log.Info("starting", c.logField)
	if len(c.ignored) > 0 {
		log.Warn("order API settings ignored: ORDER_STORE is not http", zap.Strings("settings", c.ignored))
	}
	return log
}

// newProducer returns the producer of the settings, its enqueues traced
// by tr. The caller closes it.
func (c *serveRun) newProducer(rdb redis.UniversalClient, tr *telemetry.Tracing) (*producer.Producer, error) {
	pcfg := c.producerConfig()
	pcfg.TracerProvider = tr.Provider()
	p, err := producer.New(rdb, pcfg)
	if err != nil {
		return nil, fmt.Errorf("serve: KEY_PREFIX (-key-prefix), WAIT_REPLICAS or WAIT_TIMEOUT: %w", err)
	}
	return p, nil
}

// newIntake returns the intake's handler of the settings, enqueueing
// through p and reading store.
func (c *serveRun) newIntake(rdb redis.UniversalClient, p *producer.Producer, store orders.Store, tr *telemetry.Tracing, log *zap.Logger) (*intake.Server, error) {
	handler, err := intake.New(rdb, p, store, intake.Config{
		APIKeys:        c.APIKeys,
		AdminKeys:      c.AdminKeys,
		InsecureNoAuth: c.InsecureNoAuth,
		MaxBody:        int64(c.MaxBody),
		RequestTimeout: c.RequestTimeout,
		Rate:           c.rateLimit,
		Burst:          c.Burst,
		ActionRate:     c.actionRate,
		ActionBurst:    c.ActionBurst,
		KeyLimits:      c.keyLimits,
		GapWait:        c.GapWait,
		BlockedAfter:   c.BlockedAfter,
		Logger:         log,
		TracerProvider: tr.Provider(),
	})
	if errors.Is(err, httpauth.ErrConfig) {
		return nil, fmt.Errorf("serve: INTAKE_API_KEYS (-api-keys): %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return handler, nil
}

// checkRedis warns, within 3 s, when Redis does not answer yet or
// WAIT_REPLICAS cannot be met now; serve starts anyway.
func (c *serveRun) checkRedis(ctx context.Context, rdb redis.UniversalClient, p *producer.Producer, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		log.Warn("redis not reachable yet; serving anyway", zap.String("redis", string(c.Redis.Topology)), zap.Strings("redis_addrs", c.Redis.Addrs()), zap.Error(err))
	} else if err := p.CheckReplicas(ctx); err != nil {
		// A replica may be rejoining; a setting above the deployment's
		// replicas answers every enqueue 503 until it is lowered.
		log.Warn("WAIT_REPLICAS cannot be met now: every enqueue is answered 503 until it can", zap.Int("wait_replicas", c.WaitReplicas), zap.Error(err))
	}
}

// listenAndServe listens on INTAKE_ADDR and serves handler there until ctx
// is done (see httpserve.Serve).
func (c *serveRun) listenAndServe(ctx context.Context, handler http.Handler, log *zap.Logger) error {
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("serve: listen on %s (INTAKE_ADDR): %w", c.Addr, err)
	}
	everywhere := httpserve.EveryInterface(ln.Addr())
	log.Info("listening", zap.String("addr", ln.Addr().String()), zap.Bool("every_interface", everywhere), zap.Bool("auth", !c.InsecureNoAuth))
	if c.InsecureNoAuth {
		log.Warn("authentication is off (-insecure-no-auth): anyone who reaches the port may enqueue order changes, read orders and run the operator actions (retry, skip, hold, resume)",
			zap.Bool("every_interface", everywhere))
	}
	return httpserve.Serve(ctx, ln, handler, httpserve.Config{
		ReadTimeout:     c.ReadTimeout,
		WriteTimeout:    c.WriteTimeout,
		IdleTimeout:     c.IdleTimeout,
		ShutdownTimeout: c.ShutdownTimeout,
	}, log)
}
