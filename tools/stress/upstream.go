package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/orderworker/orderworker/internal/orders/httpstore"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/redis/go-redis/v9"
)

// The order stores of -store.
const (
	storeRedis = "redis"
	storeHTTP  = "http"
)

// The OAuth2 client of the workers at the upstream's token endpoint. The
// endpoint issues a token to anyone and the order API checks none: both
// listen on loopback only, for this run.
const (
	upstreamClientID     = "orderworker-stress"
	upstreamClientSecret = "stress-client-secret"
	upstreamToken        = "stress-access-token"
)

// upstream is the order API of -store http: the reference server
// (orderapitest) over a Redis store on a redis-server of its own, which
// no failover, restart or nemesis of the run touches, served in this
// process on loopback with an OAuth2 token endpoint beside it. Its log
// is what the history checker reads at the end.
type upstream struct {
	redis  *redisproc.Process
	rdb    *redis.Client
	store  *redisstore.Store // the orders, behind the API: what the checks read
	api    *orderapitest.Handler
	client *httpstore.Store // the suite's own client of the API, for the seeds
	srv    *http.Server
	url    string
	served chan error
	dir    string
	// proxies are the worker slots' links to the API, by slot, when the
	// network nemeses run (nemesis.go breaks them with the Redis links);
	// nil otherwise.
	proxies []*faultproxy.Proxy
}

// startUpstream starts the upstream, with a fault proxy before it for
// each of slots worker slots when proxied; close stops it, keeping its
// Redis's log in dir.
func startUpstream(dir string, slots int, proxied bool) (*upstream, error) {
	proc, err := redisproc.Start()
	if err != nil {
		return nil, fmt.Errorf("the order API's redis: %w", err)
	}
	u := &upstream{redis: proc, rdb: redis.NewClient(&redis.Options{Addr: proc.Addr()}), served: make(chan error, 1), dir: dir}
	if u.store, err = redisstore.New(u.rdb, redisstore.Config{Prefix: prefix}); err != nil {
		_ = u.close()
		return nil, err
	}
	u.api = orderapitest.NewHandler(u.store)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = u.close()
		return nil, fmt.Errorf("the order API's listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", http.StripPrefix("/api", u.api))
	mux.HandleFunc("POST /oauth/token", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": upstreamToken, "token_type": "Bearer", "expires_in": 3600})
	})
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	u.url = "http://" + ln.Addr().String()
	go func() { u.served <- u.srv.Serve(ln) }()
	if proxied {
		for range slots {
			p, err := faultproxy.New(ln.Addr().String())
			if err != nil {
				_ = u.close()
				return nil, fmt.Errorf("the order API's proxy: %w", err)
			}
			u.proxies = append(u.proxies, p)
		}
	}
	if u.client, err = httpstore.New(u.url+"/api", staticToken(upstreamToken), httpstore.Config{}); err != nil {
		_ = u.close()
		return nil, err
	}
	return u, nil
}

// env is the order store settings of slot's workers: the upstream, or
// slot's proxy before it.
func (u *upstream) env(slot int) []string {
	base := u.url
	if u.proxies != nil {
		base = "http://" + u.proxies[slot].Addr()
	}
	return []string{
		"ORDER_STORE=http",
		"ORDER_API_URL=" + base + "/api",
		"TOKEN_URL=" + base + "/oauth/token",
		"TOKEN_CLIENT_ID=" + upstreamClientID,
		"TOKEN_CLIENT_SECRET=" + upstreamClientSecret,
	}
}

func (u *upstream) describe() string {
	return fmt.Sprintf("the reference order API (orderapitest) on %s, over a Redis store on its own redis-server on %s that no nemesis touches", u.url, u.redis.Addr())
}

// close stops the server (waiting for it) and the upstream's Redis. It
// returns the server's error, if it failed.
func (u *upstream) close() (err error) {
	for _, p := range u.proxies {
		_ = p.Close()
	}
	if u.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = u.srv.Shutdown(ctx)
		cancel()
		_ = u.srv.Close()
		if serr := <-u.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = fmt.Errorf("the order API: %w", serr)
		}
	}
	if u.client != nil {
		u.client.CloseIdleConnections()
	}
	_ = u.rdb.Close()
	_ = os.CopyFS(filepath.Join(u.dir, "order-api-redis"), os.DirFS(u.redis.Dir()))
	u.redis.Stop()
	return err
}

// staticToken is the suite's own token for the API, which checks none.
type staticToken string

func (s staticToken) Get(context.Context) (string, error)    { return string(s), nil }
func (staticToken) Invalidate(context.Context, string) error { return nil }
