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
	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/intake"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
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
	InsecureNoAuth  bool
	MaxBody         int
	ReadTimeout     time.Duration
	WriteTimeout    time.Duration
	IdleTimeout     time.Duration
	RequestTimeout  time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string
}

// declareServe declares the settings of serve on s.
func declareServe(s *config.Set, c *serveSettings) {
	s.String(&c.Addr, "addr", "INTAKE_ADDR", ":8080", "listen address, host:port").Check(config.NotEmpty)
	s.StringList(&c.APIKeys, "api-keys", "INTAKE_API_KEYS", nil, "comma-separated bearer API keys, each at least 16 characters; several allow rotation").Secret()
	s.Bool(&c.InsecureNoAuth, "insecure-no-auth", "", false, "serve without authentication (flag only; for local development)")
	s.Int(&c.MaxBody, "max-body", "INTAKE_MAX_BODY", intake.DefaultMaxBody, "largest request body in bytes; larger ones get 413").Check(config.Positive[int], atMostPayload)
	s.Duration(&c.ReadTimeout, "read-timeout", "INTAKE_READ_TIMEOUT", httpserve.DefaultReadTimeout, "longest time to read a request, headers and body").Check(config.Positive[time.Duration])
	s.Duration(&c.WriteTimeout, "write-timeout", "INTAKE_WRITE_TIMEOUT", httpserve.DefaultWriteTimeout, "longest time from the end of the request headers to the end of the answer").Check(config.Positive[time.Duration])
	s.Duration(&c.IdleTimeout, "idle-timeout", "INTAKE_IDLE_TIMEOUT", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection stays open").Check(config.Positive[time.Duration])
	s.Duration(&c.RequestTimeout, "request-timeout", "INTAKE_REQUEST_TIMEOUT", intake.DefaultRequestTimeout, "longest Redis work of one request before it is answered 503; below the write timeout").Check(config.Positive[time.Duration])
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "INTAKE_SHUTDOWN_TIMEOUT", httpserve.DefaultShutdownTimeout, "how long SIGTERM lets requests in flight finish").Check(config.Positive[time.Duration])
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
	var c serveSettings
	set := config.NewSet("producer serve", getenv)
	set.SetOutput(stdout)
	declareServe(set, &c)
	if err := set.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case len(set.Args()) > 0:
		return fmt.Errorf("serve: unexpected arguments %q (serve takes flags only; see -h)", set.Args())
	case c.RequestTimeout >= c.WriteTimeout:
		return fmt.Errorf("serve: INTAKE_REQUEST_TIMEOUT (%v) must be below INTAKE_WRITE_TIMEOUT (%v), or a slow Redis would cut answers off", c.RequestTimeout, c.WriteTimeout)
	case c.InsecureNoAuth && len(c.APIKeys) > 0:
		return errors.New("serve: -insecure-no-auth given together with INTAKE_API_KEYS (-api-keys): drop one or the other")
	case !c.InsecureNoAuth && len(c.APIKeys) == 0:
		return errors.New("serve: no API keys: set INTAKE_API_KEYS (-api-keys), or pass -insecure-no-auth to serve without authentication")
	}
	ignored, err := c.OrderStore.Check()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	root, err := logging.New(c.LogLevel, c.LogFormat, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = root.Sync() }()
	logging.Redis.Set(root) // go-redis's own lines (see logging.CaptureRedis)
	log := root.Named("intake")
	log.Info("starting", set.LogField())
	if len(ignored) > 0 {
		log.Warn("order API settings ignored: ORDER_STORE is not http", zap.Strings("settings", ignored))
	}

	rdb := c.Redis.NewClient()
	defer func() {
		if err := rdb.Close(); err != nil {
			log.Warn("close redis", zap.Error(err))
		}
	}()
	p, err := producer.New(rdb, c.producerConfig())
	if err != nil {
		return fmt.Errorf("serve: KEY_PREFIX (-key-prefix), WAIT_REPLICAS or WAIT_TIMEOUT: %w", err)
	}
	defer p.Close()
	store, err := orderstore.Open(rdb, c.Prefix, &c.OrderStore, orderstore.Hooks{}, root)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer store.Close()
	handler, err := intake.New(rdb, p, store.Store, intake.Config{
		APIKeys:        c.APIKeys,
		InsecureNoAuth: c.InsecureNoAuth,
		MaxBody:        int64(c.MaxBody),
		RequestTimeout: c.RequestTimeout,
		GapWait:        c.GapWait,
		Logger:         log,
	})
	if errors.Is(err, httpauth.ErrConfig) {
		return fmt.Errorf("serve: INTAKE_API_KEYS (-api-keys): %w", err)
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		log.Warn("redis not reachable yet; serving anyway", zap.String("redis", string(c.Redis.Topology)), zap.Strings("redis_addrs", c.Redis.Addrs()), zap.Error(err))
	} else if err := p.CheckReplicas(pingCtx); err != nil {
		// A replica may be rejoining; a setting above the deployment's
		// replicas answers every enqueue 503 until it is lowered.
		log.Warn("WAIT_REPLICAS cannot be met now: every enqueue is answered 503 until it can", zap.Int("wait_replicas", c.WaitReplicas), zap.Error(err))
	}
	cancel()

	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("serve: listen on %s (INTAKE_ADDR): %w", c.Addr, err)
	}
	log.Info("listening", zap.String("addr", ln.Addr().String()), zap.Bool("auth", !c.InsecureNoAuth))
	if c.InsecureNoAuth {
		log.Warn("authentication is off (-insecure-no-auth): anyone who reaches the port may enqueue order changes")
	}
	return httpserve.Serve(ctx, ln, handler, httpserve.Config{
		ReadTimeout:     c.ReadTimeout,
		WriteTimeout:    c.WriteTimeout,
		IdleTimeout:     c.IdleTimeout,
		ShutdownTimeout: c.ShutdownTimeout,
	}, log)
}
