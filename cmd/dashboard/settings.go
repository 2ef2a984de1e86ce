package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tasks"
)

// realm names the dashboard in the browser's login prompt and in
// WWW-Authenticate challenges.
const realm = "orderworker dashboard"

// settings is the dashboard's configuration, read by loadSettings.
//
// Choices behind the defaults:
//
//   - ReadOnly defaults to true. The dashboard is mostly looked at; its
//     write actions (delete, archive, run now, pause a queue) act on real
//     order changes, and deleting a pending order:modify loses a customer's
//     change for good. Operators who need them start a dashboard with
//     DASHBOARD_READ_ONLY=false, on purpose.
//   - There is no default credential, and the dashboard refuses to start
//     without one unless -insecure-no-auth is given. That switch is a flag
//     only, with no environment variable, so that turning authentication off
//     is visible on the command line and never inherited from a stray
//     variable; it may not be combined with credentials.
//   - MetricsAuth defaults to true: /metrics sits behind authentication,
//     since the dashboard's port is often the one exposed to people, and
//     queue names and sizes are business data. Prometheus scrapes with a
//     token of DASHBOARD_METRICS_TOKENS (scrape config
//     `authorization: {credentials_file: ...}`), which opens /metrics and
//     nothing else: a DASHBOARD_TOKENS token is a full login (every task's
//     payload, and with writes on every action), too much for a monitoring
//     system to hold. The UI's credentials open /metrics too. Set
//     DASHBOARD_METRICS_AUTH=false where only the scraper can reach the
//     port. /healthz and /readyz are never authenticated: probes carry no
//     credentials, and the answers reveal nothing.
//   - The principals say which kind of credential acted, in the access log
//     and in the notes of the operator actions: the basic-auth user's
//     name, "dashboard-token#N" for the N-th DASHBOARD_TOKENS token (not
//     "key#N", the intake's enqueue keys), "metrics#N" for the N-th
//     DASHBOARD_METRICS_TOKENS token.
type settings struct {
	Addr           string
	Root           string
	Redis          *redisconn.Options
	User           string
	Password       string
	Tokens         []string
	MetricsTokens  []string
	InsecureNoAuth bool
	ReadOnly       bool
	ActionRate     string
	ActionBurst    int
	MetricsAuth    bool
	PrometheusURL  string
	KeyPrefix      string
	Shards         tasks.Shards
	// Kinds are the task kinds the dashboard reads types, queues and
	// labels against (its queues, order views and actions): the workers'.
	// It is no setting; nil means tasks.Kinds(), the contract's.
	Kinds           tasks.Table
	GapWait         time.Duration
	BlockedAfter    time.Duration
	OrderStore      orderstore.Settings // the worker's: the order page reads the orders where it writes them
	ReadTimeout     time.Duration
	WriteTimeout    time.Duration
	IdleTimeout     time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string

	// auth is built from User, Password and Tokens; nil with InsecureNoAuth.
	auth httpauth.Scheme
	// metricsAuth is built from MetricsTokens; nil without them. It opens
	// /metrics only.
	metricsAuth httpauth.Scheme
	// authKind names the accepted schemes for the startup log.
	authKind string
}

// declare declares the dashboard's settings on s, filling in cfg.
func declare(s *config.Set, cfg *settings) {
	s.String(&cfg.Addr, "addr", "DASHBOARD_ADDR", "127.0.0.1:8090", "listen address, host:port; the default listens on this host's loopback only: :8090 (or 0.0.0.0:8090) listens on every interface, as a container needs").Check(config.NotEmpty)
	s.String(&cfg.Root, "root", "DASHBOARD_ROOT", "/", "URL path the UI and its API are served under, such as /asynq").Check(checkRoot)
	s.Redis(&cfg.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL, "Redis holding the asynq queues: "+config.RedisURLForms)
	s.String(&cfg.User, "user", "DASHBOARD_USER", "", "basic-auth user name; set together with the password")
	s.String(&cfg.Password, "password", "DASHBOARD_PASSWORD", "", "basic-auth password: at least 12 characters, of at least 5 different ones").Secret()
	s.StringList(&cfg.Tokens, "tokens", "DASHBOARD_TOKENS", nil, "comma-separated bearer tokens of the UI, each at least 16 characters (several allow rotation); each is a full login, recorded as dashboard-token#N").Secret()
	s.StringList(&cfg.MetricsTokens, "metrics-tokens", "DASHBOARD_METRICS_TOKENS", nil, "comma-separated bearer tokens that open /metrics and nothing else, each at least 16 characters, recorded as metrics#N: give Prometheus one of these (the UI's credentials open /metrics too)").Secret()
	s.Bool(&cfg.InsecureNoAuth, "insecure-no-auth", "", false, "serve without authentication (flag only; for local development)")
	s.Bool(&cfg.ReadOnly, "read-only", "DASHBOARD_READ_ONLY", true, "hide and refuse the UI's write actions (delete, archive, run, pause)")
	s.String(&cfg.ActionRate, "action-rate", "DASHBOARD_ACTION_RATE", "1", "with DASHBOARD_READ_ONLY=false: operator actions (retry, skip, hold, resume) a second each dashboard user may take, sustained, past a burst of DASHBOARD_ACTION_BURST; past it 429 with Retry-After, and nothing is done; off for no limit (0 is refused)").Check(checkActionRate)
	s.Int(&cfg.ActionBurst, "action-burst", "DASHBOARD_ACTION_BURST", orderops.DefaultBurst, "operator actions a dashboard user may take at once above DASHBOARD_ACTION_RATE").Check(config.Positive[int])
	s.Bool(&cfg.MetricsAuth, "metrics-auth", "DASHBOARD_METRICS_AUTH", true, "require the dashboard's credentials on /metrics")
	s.String(&cfg.PrometheusURL, "prometheus-url", "DASHBOARD_PROMETHEUS_URL", "", "Prometheus server whose asynq series the UI charts (optional)").Check(config.URL("http", "https"))
	s.String(&cfg.KeyPrefix, "key-prefix", "KEY_PREFIX", orderkeys.DefaultPrefix, "prefix of orderworker's Redis keys, read by the order page; the same as the worker's").Check(checkKeyPrefix)
	s.Shards(&cfg.Shards, "queue-shards", "QUEUE_SHARDS", "the workers' queue shards, where the order page looks for an order's tasks: "+config.ShardsForms+"; the same as the workers'")
	s.Duration(&cfg.GapWait, "gap-wait", "GAP_WAIT", orderview.DefaultGapWait, "the workers' gap wait, whose time left the order page shows for a position without its task; the same as the worker's").Check(config.Positive)
	s.Duration(&cfg.BlockedAfter, "blocked-after", "BLOCKED_AFTER", orderview.DefaultBlockedAfter, "how long an order's next change may wait before the blocked-orders page and the metrics (orderworker_orders_blocked) count the order as blocked").Check(config.Positive)
	orderstore.Declare(s, &cfg.OrderStore)
	s.Duration(&cfg.ReadTimeout, "read-timeout", "DASHBOARD_READ_TIMEOUT", 10*time.Second, "longest time to read a request, headers included").Check(config.Positive)
	s.Duration(&cfg.WriteTimeout, "write-timeout", "DASHBOARD_WRITE_TIMEOUT", 30*time.Second, "longest time to answer a request").Check(config.Positive)
	s.Duration(&cfg.IdleTimeout, "idle-timeout", "DASHBOARD_IDLE_TIMEOUT", 2*time.Minute, "how long an idle keep-alive connection stays open").Check(config.Positive)
	s.Duration(&cfg.ShutdownTimeout, "shutdown-timeout", "DASHBOARD_SHUTDOWN_TIMEOUT", 10*time.Second, "how long to let requests finish on SIGTERM").Check(config.Positive)
	s.String(&cfg.LogLevel, "log-level", "LOG_LEVEL", "info", "log level: "+logging.Levels).Check(logging.CheckLevel)
	s.String(&cfg.LogFormat, "log-format", "LOG_FORMAT", logging.FormatJSON, "log format: json or console").Check(logging.CheckFormat)
}

// parseActionRate reads DASHBOARD_ACTION_RATE: a positive number of
// actions a second, or "off" for no limit (0 is refused, not read as off).
func parseActionRate(raw string) (rate.Limit, error) {
	raw = strings.TrimSpace(raw)
	if strings.EqualFold(raw, "off") {
		return orderops.Unlimited, nil
	}
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, errors.New("want a positive number of actions a second, or off for no limit")
	}
	return rate.Limit(f), nil
}

func checkActionRate(raw string) error {
	_, err := parseActionRate(raw)
	return err
}

func checkKeyPrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return errors.New("must not contain a brace (it would break the keys' hash tags)")
	}
	return nil
}

// The weakest DASHBOARD_PASSWORD the dashboard starts with: at least
// minPasswordLength characters, of at least minPasswordDistinct different
// ones. Failed logins are throttled too
// (see loginThrottle), but a short or guessable password still falls to a
// patient guesser, or to many addresses.
const (
	minPasswordLength   = 12
	minPasswordDistinct = 5
)

// ErrWeakPassword is matched by the error of a DASHBOARD_PASSWORD that is
// too weak.
var ErrWeakPassword = errors.New("DASHBOARD_PASSWORD (-password) is too weak")

// checkPassword refuses a weak password, with an error matching
// ErrWeakPassword that never contains it.
func checkPassword(password string) error {
	distinct := map[rune]bool{}
	for _, r := range password {
		distinct[r] = true
	}
	switch {
	case utf8.RuneCountInString(password) < minPasswordLength:
		return fmt.Errorf("%w: it has fewer than %d characters; generate one, for example with `openssl rand -base64 18`", ErrWeakPassword, minPasswordLength)
	case len(distinct) < minPasswordDistinct:
		return fmt.Errorf("%w: it has fewer than %d different characters; generate one, for example with `openssl rand -base64 18`", ErrWeakPassword, minPasswordDistinct)
	}
	return nil
}

// reserved are the paths the dashboard serves outside its root.
var reserved = []string{"/metrics", "/healthz", "/readyz"}

func checkRoot(root string) error {
	switch {
	case !strings.HasPrefix(root, "/"):
		return errors.New("must start with /")
	case strings.ContainsAny(root, "?#%{} \t"):
		return errors.New("must be a plain path without ?, #, %, braces or spaces")
	case root != "/" && path.Clean(root) != strings.TrimSuffix(root, "/"):
		return errors.New("must be a clean path (no //, . or ..)")
	}
	for _, r := range reserved {
		if root == r || strings.HasPrefix(root, r+"/") {
			return fmt.Errorf("must not be %s, which the dashboard serves itself", r)
		}
	}
	return nil
}

// loadSettings reads the settings from args (without the program name) and
// getenv, writing the usage text to out for -h, and checks the settings
// that depend on each other. It returns config.ErrHelp after -h.
func loadSettings(args []string, getenv func(string) string, out io.Writer) (*settings, *config.Set, error) {
	cfg := &settings{}
	s := config.NewSet("dashboard", getenv)
	s.SetOutput(out)
	declare(s, cfg)
	if err := s.Parse(args); err != nil {
		return nil, nil, err
	}
	if len(s.Args()) > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q (the dashboard takes flags only; see -h)", s.Args())
	}
	cfg.Root = strings.TrimSuffix(cfg.Root, "/")
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if err := cfg.buildAuth(); err != nil {
		return nil, nil, err
	}
	return cfg, s, nil
}

// buildAuth checks the credentials and builds the scheme that checks them.
func (cfg *settings) buildAuth() error {
	hasBasic := cfg.User != "" || cfg.Password != ""
	hasTokens := len(cfg.Tokens) > 0
	switch {
	case cfg.InsecureNoAuth && (hasBasic || hasTokens || len(cfg.MetricsTokens) > 0):
		return errors.New("-insecure-no-auth given together with credentials (DASHBOARD_USER/DASHBOARD_PASSWORD, DASHBOARD_TOKENS or DASHBOARD_METRICS_TOKENS): drop one or the other")
	case cfg.InsecureNoAuth:
		cfg.authKind = "none"
		return nil
	case !hasBasic && !hasTokens:
		return errors.New("no credentials: set DASHBOARD_USER and DASHBOARD_PASSWORD (-user, -password), or DASHBOARD_TOKENS (-tokens), or pass -insecure-no-auth to serve without authentication (DASHBOARD_METRICS_TOKENS open /metrics only)")
	case hasBasic && (cfg.User == "" || cfg.Password == ""):
		return errors.New("DASHBOARD_USER (-user) and DASHBOARD_PASSWORD (-password) must be set together")
	}
	var kinds []string
	var all []httpauth.Scheme
	if hasBasic {
		b, err := httpauth.Basic(realm, cfg.User, cfg.Password)
		if err != nil {
			return fmt.Errorf("DASHBOARD_USER/DASHBOARD_PASSWORD: %w", err)
		}
		if err := checkPassword(cfg.Password); err != nil {
			return err
		}
		all = append(all, b)
		kinds = append(kinds, "basic")
	}
	if hasTokens {
		b, err := httpauth.NamedBearer(realm, "dashboard-token", cfg.Tokens)
		if err != nil {
			return fmt.Errorf("DASHBOARD_TOKENS (-tokens): %w", err)
		}
		all = append(all, b)
		kinds = append(kinds, "bearer")
	}
	cfg.auth = httpauth.Any(all...)
	cfg.authKind = strings.Join(kinds, "+")
	return cfg.buildMetricsAuth()
}

// buildMetricsAuth checks the metrics tokens and builds their scheme.
func (cfg *settings) buildMetricsAuth() error {
	if len(cfg.MetricsTokens) == 0 {
		return nil
	}
	if !cfg.MetricsAuth {
		return errors.New("DASHBOARD_METRICS_TOKENS (-metrics-tokens) set with DASHBOARD_METRICS_AUTH=false: /metrics takes no credentials then; drop one or the other")
	}
	ui := map[string]bool{}
	for _, t := range cfg.Tokens {
		ui[t] = true
	}
	for i, t := range cfg.MetricsTokens {
		if ui[t] {
			return fmt.Errorf("DASHBOARD_METRICS_TOKENS (-metrics-tokens): token #%d is also in DASHBOARD_TOKENS, where it is a full login; give the scraper a token of its own", i+1)
		}
	}
	b, err := httpauth.NamedBearer(realm, "metrics", cfg.MetricsTokens)
	if err != nil {
		return fmt.Errorf("DASHBOARD_METRICS_TOKENS (-metrics-tokens): %w", err)
	}
	cfg.metricsAuth = b
	cfg.authKind += ", metrics: bearer"
	return nil
}
