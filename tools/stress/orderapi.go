package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
)

// The stores of -store.
const (
	storeRedis = "redis"
	storeHTTP  = "http"
)

// orderAPI is the upstream order API of -store http: the reference server
// (internal/testkit/orderapitest) on loopback, with a Redis store on a
// redis-server of its own behind it, which no switch of the chaos phase
// touches: the upstream outlives every failover of the workers' Redis, as
// an order service does. A client-credentials token endpoint beside it
// issues the one token the workers share. With the network nemeses, each
// worker slot reaches it through a fault proxy of its own.
type orderAPI struct {
	srv     *redisproc.Process
	rdb     *redis.Client
	store   *redisstore.Store
	ln      net.Listener
	http    *http.Server
	served  chan error
	token   string
	proxies []*faultproxy.Proxy // by worker slot; nil without the nemeses

	mu      sync.Mutex
	refused map[string]int // the API's 4xx answers to writes, by error code
}

// The workers' client credentials at the token endpoint.
const (
	apiClientID     = "orderworker-stress"
	apiClientSecret = "stress-client-secret-not-a-real-one"
)

// startOrderAPI starts the upstream, with a proxy for each of slots worker
// slots when proxied.
func startOrderAPI(slots int, proxied bool) (a *orderAPI, err error) {
	a = &orderAPI{served: make(chan error, 1), refused: map[string]int{}}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.srv, err = redisproc.Start("--appendonly", "yes", "--appendfsync", "always"); err != nil {
		return nil, fmt.Errorf("order API: its Redis: %w", err)
	}
	a.rdb = redis.NewClient(&redis.Options{Addr: a.srv.Addr()})
	if a.store, err = redisstore.New(a.rdb, redisstore.Config{Prefix: prefix}); err != nil {
		return nil, fmt.Errorf("order API: %w", err)
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	a.token = "at-" + hex.EncodeToString(b[:])
	api := orderapitest.NewHandler(a.store)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", a.issue)
	mux.Handle("/api/", http.StripPrefix("/api", a.auth(a.count(api))))
	if a.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("order API: %w", err)
	}
	a.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { a.served <- a.http.Serve(a.ln) }()
	if proxied {
		for range slots {
			p, err := faultproxy.New(a.ln.Addr().String())
			if err != nil {
				return nil, fmt.Errorf("order API: proxy: %w", err)
			}
			a.proxies = append(a.proxies, p)
		}
	}
	return a, nil
}

// addr is where slot's workers reach the upstream: its proxy, or the
// server.
func (a *orderAPI) addr(slot int) string {
	if a.proxies != nil {
		return a.proxies[slot].Addr()
	}
	return a.ln.Addr().String()
}

// env is the order store's environment of slot's workers.
func (a *orderAPI) env(slot int) []string {
	base := "http://" + a.addr(slot)
	return []string{
		"ORDER_STORE=http",
		"ORDER_API_URL=" + base + "/api",
		"TOKEN_URL=" + base + "/oauth/token",
		"TOKEN_CLIENT_ID=" + apiClientID,
		"TOKEN_CLIENT_SECRET=" + apiClientSecret,
	}
}

// issue is the token endpoint (client credentials grant).
func (a *orderAPI) issue(w http.ResponseWriter, r *http.Request) {
	id, secret, ok := r.BasicAuth()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case !ok || id != apiClientID || secret != apiClientSecret:
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
		return
	case r.FormValue("grant_type") != "client_credentials":
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"unsupported_grant_type"}`))
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": a.token, "token_type": "Bearer", "expires_in": 3600})
}

// auth refuses a request without the token.
func (a *orderAPI) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+a.token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"no valid token"}}`))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// count counts the codes of the writes the API refuses (a stale fence, a
// position passed): the evidence that the fencing was put to work.
func (a *orderAPI) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			next.ServeHTTP(w, r)
			return
		}
		rec := &codeRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status >= 400 && rec.status < 500 {
			var body struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(rec.body.Bytes(), &body)
			a.mu.Lock()
			a.refused[cmp.Or(body.Error.Code, strconv.Itoa(rec.status))]++
			a.mu.Unlock()
		}
	})
}

// refusals returns the refused writes by code.
func (a *orderAPI) refusals() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.refused)
}

// codeRecorder keeps an answer's status and the start of its body.
type codeRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *codeRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *codeRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.body.Len() < 4096 {
		r.body.Write(b[:min(len(b), 4096-r.body.Len())])
	}
	return r.ResponseWriter.Write(b)
}

func (a *orderAPI) close() {
	for _, p := range a.proxies {
		_ = p.Close()
	}
	if a.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = a.http.Shutdown(ctx)
		cancel()
		if err := <-a.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("order API:", err)
		}
	}
	if a.rdb != nil {
		_ = a.rdb.Close()
	}
	if a.srv != nil {
		a.srv.Stop()
	}
}
