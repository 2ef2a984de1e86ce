// Package orderstore chooses and builds the order store of every binary
// from its settings: ORDER_STORE picks the Redis store (under KEY_PREFIX) or
// the HTTP store (the upstream order API, with the access token shared
// through a token cache on the same Redis for the workers, in the process
// for the others). The worker writes through the
// store it opens, and the intake, the CLI's order commands and the demo read
// (and put) through theirs, so with the same settings they all see the same
// orders.
//
// It lives under cmd/ because it knows the settings' flag and environment
// names; the stores themselves are packages redisstore and httpstore.
package orderstore

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/httpstore"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/token"
	"github.com/orderworker/orderworker/worker/orders"
)

// The stores ORDER_STORE names.
const (
	// Redis is the Redis store, under KEY_PREFIX: the default.
	Redis = "redis"
	// HTTP is the upstream order API at ORDER_API_URL.
	HTTP = "http"
)

// Settings are the order store's settings, one field per setting. Declare
// registers them; the zero value is not meant to be used unparsed.
type Settings struct {
	Store              string
	DedupeRetention    time.Duration
	HistoryMax         int
	HistoryMaxAge      time.Duration
	OrderAPIURL        string
	OrderAPIAllowHTTP  bool
	OrderAPITimeout    time.Duration
	TokenURL           string
	TokenAllowHTTP     bool
	TokenClientID      string
	TokenClientSecret  string
	TokenScopes        []string
	TokenRefreshBefore time.Duration
	TokenWaitTimeout   time.Duration
}

// Declare registers the order store's settings on s.
func Declare(s *config.Set, c *Settings) {
	s.String(&c.Store, "order-store", "ORDER_STORE", Redis, "where the orders are kept, for the worker, the intake, the CLI and the dashboard alike: redis (under KEY_PREFIX) or http (the upstream order API at ORDER_API_URL, see docs/upstream-order-api.md)").Check(config.OneOf(Redis, HTTP))
	s.Duration(&c.DedupeRetention, "dedupe-retention", "DEDUPE_RETENTION", redisstore.DefaultDedupeRetention, "Redis store: how long an applied event is remembered to answer a repeat (kept one to two times this); past it, its order's sequence still refuses a repeat that has a position").Check(config.Positive[time.Duration])
	s.Int(&c.HistoryMax, "history-max", "HISTORY_MAX", redisstore.DefaultHistoryMax, "Redis store: history entries kept per order; each write past it drops the oldest").Check(config.Positive[int])
	s.Duration(&c.HistoryMaxAge, "history-max-age", "HISTORY_MAX_AGE", 0, "Redis store: also drop history entries older than this on each write to the order; 0 for no age limit").Check(config.NonNegative[time.Duration])
	s.String(&c.OrderAPIURL, "order-api-url", "ORDER_API_URL", "", "base URL of the upstream order API, e.g. https://orders.example.com/v1; required with ORDER_STORE=http").Check(config.URL("http", "https"))
	s.Bool(&c.OrderAPIAllowHTTP, "order-api-allow-insecure-http", "ORDER_API_ALLOW_INSECURE_HTTP", false, "let ORDER_API_URL be http:// to a host that is not loopback, sending the access token and the orders in clear text; without it ORDER_API_URL must be https://, or http:// to localhost or a loopback address")
	s.Duration(&c.OrderAPITimeout, "order-api-timeout", "ORDER_API_TIMEOUT", httpstore.DefaultTimeout, "timeout of one request to the order API; a task whose write timed out is retried").Check(config.Positive[time.Duration])
	s.String(&c.TokenURL, "token-url", "TOKEN_URL", "", "OAuth2 token endpoint (client credentials grant) for the order API's access token; required with ORDER_STORE=http").Check(config.URL("http", "https"))
	s.Bool(&c.TokenAllowHTTP, "token-allow-insecure-http", "TOKEN_ALLOW_INSECURE_HTTP", false, "let TOKEN_URL be http:// to a host that is not loopback, sending the client secret in clear text; without it TOKEN_URL must be https://, or http:// to localhost or a loopback address")
	s.String(&c.TokenClientID, "token-client-id", "TOKEN_CLIENT_ID", "", "OAuth2 client ID; required with ORDER_STORE=http")
	s.String(&c.TokenClientSecret, "token-client-secret", "TOKEN_CLIENT_SECRET", "", "OAuth2 client secret").Secret()
	s.StringList(&c.TokenScopes, "token-scopes", "TOKEN_SCOPES", nil, "OAuth2 scopes to request, comma-separated")
	s.Duration(&c.TokenRefreshBefore, "token-refresh-before", "TOKEN_REFRESH_BEFORE", token.DefaultRefreshBefore, "remaining lifetime at which one replica refreshes the shared token in the background").Check(config.Positive[time.Duration])
	s.Duration(&c.TokenWaitTimeout, "token-wait-timeout", "TOKEN_WAIT_TIMEOUT", token.DefaultWaitTimeout, "how long a request to the order API waits for a token when none is cached before it fails (a task is then retried)").Check(config.Positive[time.Duration])
}

// Check checks the settings that depend on each other: the HTTP store needs
// its URLs and client ID. It also returns the order API settings that are
// set but unused (ORDER_STORE is not http), for a warning.
func (c *Settings) Check() (ignored []string, err error) {
	given := []struct {
		env string
		set bool
	}{
		{"ORDER_API_URL (-order-api-url)", c.OrderAPIURL != ""},
		{"TOKEN_URL (-token-url)", c.TokenURL != ""},
		{"TOKEN_CLIENT_ID (-token-client-id)", c.TokenClientID != ""},
	}
	var missing []string
	for _, g := range given {
		switch {
		case c.Store == HTTP && !g.set:
			missing = append(missing, g.env)
		case c.Store != HTTP && g.set:
			ignored = append(ignored, g.env)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("config: ORDER_STORE=%s needs %s", HTTP, strings.Join(missing, ", "))
	}
	return ignored, nil
}

// Hooks are optional callbacks of the HTTP store's token cache (see
// token.Config), for metrics. The Redis store has no use for them.
type Hooks struct {
	// OnRefresh is token.Config.OnRefresh.
	OnRefresh func(d time.Duration, err error)
	// OnWait is token.Config.OnWait.
	OnWait func(d time.Duration)
	// TracerProvider is httpstore.Config.TracerProvider: nil, tracing off.
	TracerProvider trace.TracerProvider
	// SharedToken is true for the workers: the HTTP store's access token
	// is then shared by every worker through Redis (token.Cache, under the
	// workers' ACL rule). Otherwise (the intake, the dashboard, the command
	// line, which only read through the order API) each process keeps a
	// token of its own in memory (token.Local), and its Redis user needs,
	// and has, no right on the workers' token.
	SharedToken bool
}

// Store is an order store that Open built. Close releases what it holds.
type Store struct {
	orders.Store
	close func()
}

// Close releases the store's idle connections and its token cache (for
// the HTTP store); the Redis store holds nothing. The store must not be
// used after. It returns nil.
func (s *Store) Close() error {
	s.close()
	return nil
}

// Open builds the order store that c names, on rdb under the key prefix
// prefix: the Redis store's keys, or the HTTP store, with the workers'
// shared token (at orderkeys.TokenKey(prefix)) when hooks.SharedToken says
// so, and a token of the process's own otherwise.
// It starts nothing in the background until the store is used. It returns
// an error for settings that fail [Settings.Check] or that a store refuses
// (a prefix with a brace, a bad URL, an ORDER_API_URL or TOKEN_URL of
// http:// to a host that is not loopback unless its ALLOW_INSECURE_HTTP
// setting is true); the error carries no secret.
func Open(rdb redis.UniversalClient, prefix string, c *Settings, hooks Hooks, log *zap.Logger) (*Store, error) {
	if _, err := c.Check(); err != nil {
		return nil, err
	}
	if c.Store != HTTP {
		s, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix, DedupeRetention: c.DedupeRetention,
			HistoryMax: c.HistoryMax, HistoryMaxAge: c.HistoryMaxAge})
		if err != nil {
			return nil, fmt.Errorf("order store: %w", err)
		}
		return &Store{Store: s, close: func() {}}, nil
	}
	src, err := token.ClientCredentials(token.ClientCredentialsConfig{
		TokenURL:          c.TokenURL,
		ClientID:          c.TokenClientID,
		ClientSecret:      c.TokenClientSecret,
		Scopes:            c.TokenScopes,
		AllowInsecureHTTP: c.TokenAllowHTTP,
	})
	if errors.Is(err, token.ErrInsecureURL) {
		return nil, fmt.Errorf("config: TOKEN_URL (-token-url): %w; use https, or set TOKEN_ALLOW_INSECURE_HTTP=true (-token-allow-insecure-http)", err)
	}
	if err != nil {
		return nil, err
	}
	var tokens interface {
		httpstore.TokenSource
		Close() error
	}
	if hooks.SharedToken {
		tokens, err = token.New(rdb, src, token.Config{
			Key:           orderkeys.TokenKey(prefix),
			RefreshBefore: c.TokenRefreshBefore,
			WaitTimeout:   c.TokenWaitTimeout,
			OnRefresh:     hooks.OnRefresh,
			OnWait:        hooks.OnWait,
		}, log)
	} else {
		tokens, err = token.NewLocal(src, token.LocalConfig{RefreshBefore: c.TokenRefreshBefore, WaitTimeout: c.TokenWaitTimeout})
	}
	if err != nil {
		return nil, err
	}
	s, err := httpstore.New(c.OrderAPIURL, tokens, httpstore.Config{Timeout: c.OrderAPITimeout, TracerProvider: hooks.TracerProvider,
		AllowInsecureHTTP: c.OrderAPIAllowHTTP})
	if errors.Is(err, httpstore.ErrInsecureURL) {
		err = fmt.Errorf("config: ORDER_API_URL (-order-api-url): %w; use https, or set ORDER_API_ALLOW_INSECURE_HTTP=true (-order-api-allow-insecure-http)", err)
	}
	if err != nil {
		return nil, errors.Join(err, tokens.Close()) // the cache has started nothing yet
	}
	return &Store{Store: s, close: func() {
		s.CloseIdleConnections()
		_ = tokens.Close() // always nil
	}}, nil
}

var (
	_ httpstore.TokenSource = (*token.Cache)(nil)
	_ httpstore.TokenSource = (*token.Local)(nil)
)
