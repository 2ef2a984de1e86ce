package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestDashboard(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	d := startDashboard(t, testEnv(db))

	t.Run("refused without credentials", func(t *testing.T) {
		for _, path := range []string{"/", "/api/queues", "/queues/" + queue, "/metrics", "/orders", "/blocked-orders", "/blocked-orders.json"} {
			r := d.get(t, path, noAuth)
			assert.Equal(t, http.StatusUnauthorized, r.status, path)
			assert.Equal(t, []string{`Basic realm="orderworker dashboard", charset="UTF-8"`, `Bearer realm="orderworker dashboard"`},
				r.header.Values("WWW-Authenticate"), path)
		}
		assert.Equal(t, http.StatusUnauthorized, d.get(t, "/api/queues", basicAuth(testUser, "wrong")).status)
		assert.Equal(t, http.StatusUnauthorized, d.get(t, "/api/queues", bearerAuth("wrong-token-0123456789")).status)
	})

	t.Run("ui", func(t *testing.T) {
		r := d.get(t, "/", basicAuth(testUser, testPassword))
		require.Equal(t, http.StatusOK, r.status)
		assert.Contains(t, r.body, "<title>Asynq - Monitoring</title>")
		assert.Equal(t, "DENY", r.header.Get("X-Frame-Options"))
		assertPageCSP(t, r)
		// A deep link is served the app too.
		r = d.get(t, "/queues/"+queue+"?status=pending", basicAuth(testUser, testPassword))
		assert.Equal(t, http.StatusOK, r.status)
		assertPageCSP(t, r)
	})

	t.Run("api lists the queue", func(t *testing.T) {
		for _, a := range []auth{basicAuth(testUser, testPassword), bearerAuth(testToken)} {
			r := d.get(t, "/api/queues", a)
			require.Equal(t, http.StatusOK, r.status, r.body)
			var body struct {
				Queues []struct {
					Queue   string `json:"queue"`
					Size    int    `json:"size"`
					Pending int    `json:"pending"`
				} `json:"queues"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.body), &body))
			require.Len(t, body.Queues, 1)
			assert.Equal(t, queue, body.Queues[0].Queue)
			assert.Equal(t, 2, body.Queues[0].Pending)
		}
	})

	t.Run("payload formatter", func(t *testing.T) {
		r := d.get(t, "/api/queues/"+queue+"/pending_tasks", basicAuth(testUser, testPassword))
		require.Equal(t, http.StatusOK, r.status, r.body)
		var body struct {
			Tasks []struct {
				ID      string `json:"id"`
				Type    string `json:"type"`
				Payload string `json:"payload"`
			} `json:"tasks"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.body), &body))
		require.Len(t, body.Tasks, 2)
		payloads := map[string]string{}
		for _, task := range body.Tasks {
			payloads[task.ID] = task.Payload
		}
		assert.Equal(t, "order:modify  order_no=SO1001\n"+
			"event_id=evt-1001\n"+
			"{\n"+
			"  \"event_id\": \"evt-1001\",\n"+
			"  \"order_no\": \"SO1001\",\n"+
			"  \"changes\": {\n"+
			"    \"address\": \"1 Main St\",\n"+
			"    \"remark\": \"leave at door\"\n"+
			"  }\n"+
			"}", payloads["evt-1001"])
	})

	t.Run("read only", func(t *testing.T) {
		r := d.do(t, http.MethodPost, "/api/queues/"+queue+":pause", basicAuth(testUser, testPassword))
		assert.Equal(t, http.StatusMethodNotAllowed, r.status, r.body)
		r = d.do(t, http.MethodDelete, "/api/queues/"+queue+"/pending_tasks/evt-1001", basicAuth(testUser, testPassword))
		assert.Equal(t, http.StatusMethodNotAllowed, r.status, r.body)
		assert.Equal(t, 2, pending(t, d))
	})

	t.Run("metrics", func(t *testing.T) {
		r := d.get(t, "/metrics", bearerAuth(testToken))
		require.Equal(t, http.StatusOK, r.status, r.body)
		assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="order_modify",state="pending"} 2`)
		assert.Contains(t, r.body, `asynq_queue_size{queue="order_modify"} 2`)
		assert.Contains(t, r.body, "go_goroutines ")
		assert.Contains(t, r.body, "process_resident_memory_bytes ")
		assert.Contains(t, r.body, "promhttp_metric_handler_requests_total")
		assert.Equal(t, http.StatusOK, d.get(t, "/metrics", basicAuth(testUser, testPassword)).status)
	})

	t.Run("probes need no credentials", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			r := d.get(t, path, noAuth)
			assert.Equal(t, http.StatusOK, r.status, path)
			assert.Equal(t, "ok\n", r.body, path)
			assert.Equal(t, "no-store", r.header.Get("Cache-Control"), path)
		}
	})

	t.Run("access log", func(t *testing.T) {
		logs := d.logs.String()
		requireNoSecrets(t, logs)
		assert.Contains(t, logs, `"method":"GET","path":"/api/queues","route":"/","status":401`)
		assert.Contains(t, logs, `"status":200`)
		assert.Contains(t, logs, `"principal":"ops"`)
		assert.Contains(t, logs, `"principal":"dashboard-token#1"`)
		assert.Contains(t, logs, `"redis-url":"`+db.URL()+`"`)
		assert.Contains(t, logs, `"password":"<redacted>"`)
	})
}

// assertPageCSP checks that asynqmon's page r has a Content-Security-Policy
// that allows exactly its inline scripts, by hash, and no eval.
func assertPageCSP(t *testing.T, r response) {
	t.Helper()
	csp := r.header.Get("Content-Security-Policy")
	require.NotEmpty(t, csp)
	scripts := inlineScript.FindAllStringSubmatch(r.body, -1)
	require.Len(t, scripts, 2, "asynqmon v0.7.2's page has two inline scripts")
	want := "script-src 'self'"
	for _, m := range scripts {
		sum := sha256.Sum256([]byte(m[1]))
		want += " 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	assert.Contains(t, csp, "default-src 'none'; "+want+"; ")
	assert.Contains(t, csp, "frame-ancestors 'none'")
	assert.NotContains(t, csp, "unsafe-eval")
}

// pending returns the size of the order_modify queue's pending list.
func pending(t *testing.T, d *dashboard) int {
	t.Helper()
	return pendingAt(t, d, "/api/queues/"+queue)
}

func TestReadWrite(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	crossSite := func(r *http.Request) {
		r.Header.Set("Origin", "https://evil.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	}
	r := d.do(t, http.MethodDelete, "/api/queues/"+queue+"/pending_tasks/evt-1001", basic, crossSite)
	assert.Equal(t, http.StatusForbidden, r.status, "a cross-site write is refused")
	assert.Equal(t, 2, pending(t, d))

	r = d.do(t, http.MethodDelete, "/api/queues/"+queue+"/pending_tasks/evt-1001", basic)
	assert.Equal(t, http.StatusNoContent, r.status, r.body)
	assert.Equal(t, 1, pending(t, d))
}

// TestCraftedTaskIDs checks, on a writable dashboard under a root path,
// that a task ID outside the contract is shown escaped and that writes
// carrying one, in the path or in a batch body, are refused and change
// nothing; ordinary writes still work. (TestBrowserCraftedTaskID clicks.)
func TestCraftedTaskIDs(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	_, err := asynq.NewClientFromRedisClient(db.Client).EnqueueContext(t.Context(),
		asynq.NewTask("order:modify", orderPayload("e9", "SO9")), asynq.Queue(queue), asynq.TaskID(craftedID))
	require.NoError(t, err)
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false", "DASHBOARD_ROOT", "/asynq"))
	basic := basicAuth(testUser, testPassword)
	api := "/asynq/api/queues/" + queue

	r := d.get(t, api+"/pending_tasks", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `"id":"~..%2Fpending_tasks:delete_all"`)
	assert.NotContains(t, r.body, `"id":"../`)

	body := func(s string) func(*http.Request) {
		return func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader(s)) }
	}
	for _, w := range []struct {
		method, path string
		extra        []func(*http.Request)
	}{
		{http.MethodDelete, api + "/pending_tasks/~..%2Fpending_tasks:delete_all", nil},
		{http.MethodDelete, api + "/pending_tasks/..%2Fpending_tasks:delete_all", nil},
		{http.MethodPost, api + "/pending_tasks/..%2Fpending_tasks:delete_all:archive", nil},
		{http.MethodPost, api + "/pending_tasks:batch_delete", []func(*http.Request){body(`{"task_ids":["evt-1001","../pending_tasks:delete_all"]}`)}},
		{http.MethodPost, api + "/pending_tasks:batch_archive", []func(*http.Request){body(`{"task_ids":["~..%2Fpending_tasks:delete_all"]}`)}},
	} {
		r := d.do(t, w.method, w.path, basic, w.extra...)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s", w.method, w.path, r.body)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
		assert.Contains(t, r.body, `"code":"invalid_task_id"`)
		assert.Equal(t, 3, pendingAt(t, d, api), "%s %s changed the queue", w.method, w.path)
	}

	r = d.do(t, http.MethodDelete, api+"/pending_tasks/evt-1001", basic)
	assert.Equal(t, http.StatusNoContent, r.status, r.body)
	r = d.do(t, http.MethodPost, api+"/pending_tasks:batch_archive", basic, body(`{"task_ids":["evt-1002"]}`))
	assert.Equal(t, http.StatusOK, r.status, r.body)
	assert.Equal(t, 1, pendingAt(t, d, api), "only the crafted task is left")
}

// pendingAt returns the pending count of the queue at api, the queue's API
// path.
func pendingAt(t *testing.T, d *dashboard, api string) int {
	t.Helper()
	r := d.get(t, api, bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	var body struct {
		Current struct {
			Pending int `json:"pending"`
		} `json:"current"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &body))
	return body.Current.Pending
}

// TestSeveralAuthorizationHeaders checks, over a real socket, that a
// request with more than one Authorization header gets 401, whichever of
// them is valid, on the UI, its API (a write too) and /metrics. Each is a
// failed login: each second header comes from its own client address, so
// that the throttle (loginFailBurst) lets them all be answered.
func TestSeveralAuthorizationHeaders(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false"))
	good := func(r *http.Request) { r.SetBasicAuth(testUser, testPassword) }
	for i, extra := range []string{"Bearer " + testToken, "Bearer wrong-token-0123456789", "Basic b3BzOndyb25n"} {
		add := func(r *http.Request) { r.Header.Add("Authorization", extra) }
		c := clientFrom(t, "127.0.1."+strconv.Itoa(i+1))
		for _, req := range []struct{ method, path string }{
			{http.MethodGet, "/"},
			{http.MethodGet, "/api/queues"},
			{http.MethodGet, "/metrics"},
			{http.MethodDelete, "/api/queues/" + queue + "/pending_tasks/evt-1001"},
		} {
			r := d.doWith(t, c, req.method, req.path, good, add)
			assert.Equal(t, http.StatusUnauthorized, r.status, "%s %s with second header #%d", req.method, req.path, i)
		}
	}
	assert.Equal(t, 2, pending(t, d), "nothing was deleted")
	assert.Equal(t, http.StatusOK, d.get(t, "/api/queues", basicAuth(testUser, testPassword)).status, "one header is fine")
	requireNoSecrets(t, d.logs.String())
}

func TestRootPath(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	d := startDashboard(t, testEnv(db, "DASHBOARD_ROOT", "/ops/asynq/"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/", noAuth)
	assert.Equal(t, http.StatusFound, r.status)
	assert.Equal(t, "/ops/asynq/", r.header.Get("Location"))

	r = d.get(t, "/ops/asynq/", basic)
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.body, `window.FLAG_ROOT_PATH="\/ops\/asynq"`)
	assertPageCSP(t, r)
	assert.Equal(t, http.StatusOK, d.get(t, "/ops/asynq", basic).status)
	assert.Contains(t, d.get(t, "/ops/asynq/api/queues", basic).body, `"queue":"order_modify"`)
	assert.Equal(t, http.StatusUnauthorized, d.get(t, "/ops/asynq/api/queues", noAuth).status)
	assert.Equal(t, http.StatusNotFound, d.get(t, "/api/queues", basic).status)
	assert.Equal(t, http.StatusOK, d.get(t, "/metrics", basic).status)
}

func TestMetricsWithoutAuth(t *testing.T) {
	db := redistest.New(t)
	d := startDashboard(t, testEnv(db, "DASHBOARD_METRICS_AUTH", "false", "DASHBOARD_METRICS_TOKENS", ""))
	assert.Equal(t, http.StatusOK, d.get(t, "/metrics", noAuth).status)
	assert.Equal(t, http.StatusUnauthorized, d.get(t, "/api/queues", noAuth).status)
}

func TestInsecureNoAuth(t *testing.T) {
	db := redistest.New(t)
	d := startDashboard(t, map[string]string{"REDIS_URL": db.URL()}, "-insecure-no-auth")
	assert.Equal(t, http.StatusOK, d.get(t, "/api/queues", noAuth).status)
	assert.Equal(t, http.StatusOK, d.get(t, "/metrics", noAuth).status)
	assert.Contains(t, d.logs.String(), "authentication is off")
	assert.Contains(t, d.logs.String(), "run the operator actions")
}

// The dashboard listens on the loopback unless told otherwise.
func TestListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	s := config.NewSet("dashboard", func(string) string { return "" })
	var cfg settings
	declare(s, &cfg)
	require.NoError(t, s.Parse(nil))
	host, _, err := net.SplitHostPort(cfg.Addr)
	require.NoError(t, err)
	ip, err := netip.ParseAddr(host)
	require.NoError(t, err, cfg.Addr)
	assert.True(t, ip.IsLoopback(), cfg.Addr)
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	// A port that was free a moment ago: nothing answers there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	d := startDashboard(t, map[string]string{
		"REDIS_URL":          "redis://:redis-secret-pw@" + addr + "/0?dial_timeout=200ms&max_retries=-1",
		"DASHBOARD_USER":     testUser,
		"DASHBOARD_PASSWORD": testPassword,
	})
	assert.Equal(t, http.StatusOK, d.get(t, "/healthz", noAuth).status)
	r := d.get(t, "/readyz", noAuth)
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "redis unreachable\n", r.body)
	logs := d.logs.String()
	assert.Contains(t, logs, "redis not reachable yet")
	assert.NotContains(t, logs, "redis-secret-pw")
}

func TestSettingsErrors(t *testing.T) {
	t.Parallel()
	creds := []string{"DASHBOARD_USER", testUser, "DASHBOARD_PASSWORD", testPassword}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{name: "no credentials", want: "no credentials: set DASHBOARD_USER and DASHBOARD_PASSWORD (-user, -password), or DASHBOARD_TOKENS (-tokens), or pass -insecure-no-auth"},
		{name: "user without password", env: []string{"DASHBOARD_USER", "ops"}, want: "DASHBOARD_USER (-user) and DASHBOARD_PASSWORD (-password) must be set together"},
		{name: "password without user", env: []string{"DASHBOARD_PASSWORD", "pw"}, want: "must be set together"},
		{name: "insecure with credentials", env: creds, args: []string{"-insecure-no-auth"}, want: "-insecure-no-auth given together with credentials"},
		{name: "insecure is flag only", env: []string{"INSECURE_NO_AUTH", "true", "DASHBOARD_INSECURE_NO_AUTH", "true"}, want: "no credentials"},
		{name: "short token", env: []string{"DASHBOARD_TOKENS", "tok-0123456789abcdef,short"}, want: "DASHBOARD_TOKENS (-tokens): httpauth: bad configuration: bearer key #2 is shorter than 16 bytes"},
		{name: "short password", env: []string{"DASHBOARD_USER", "ops", "DASHBOARD_PASSWORD", "hunter2-ab1"}, want: "DASHBOARD_PASSWORD (-password) is too weak: it has fewer than 12 characters"},
		{name: "one-character password", env: []string{"DASHBOARD_USER", "ops", "DASHBOARD_PASSWORD", "x"}, want: "is too weak: it has fewer than 12 characters"},
		{name: "repetitive password", env: []string{"DASHBOARD_USER", "ops", "DASHBOARD_PASSWORD", "abababababababab"}, want: "is too weak: it has fewer than 5 different characters"},
		{name: "short password as a flag", args: []string{"-user", "ops", "-password", "pässwörd-1"}, want: "is too weak"},
		{name: "colon in user", env: []string{"DASHBOARD_USER", "a:b", "DASHBOARD_PASSWORD", "x"}, want: "DASHBOARD_USER/DASHBOARD_PASSWORD: httpauth: bad configuration: basic-auth user may not contain a colon"},
		{name: "bad timeout", env: append([]string{"DASHBOARD_WRITE_TIMEOUT", "abc"}, creds...), want: `DASHBOARD_WRITE_TIMEOUT="abc" (env; flag -write-timeout): not a duration`},
		{name: "zero timeout", env: creds, args: []string{"-shutdown-timeout", "0s"}, want: `-shutdown-timeout="0s" (flag; env DASHBOARD_SHUTDOWN_TIMEOUT): must be positive`},
		{name: "relative root", env: append([]string{"DASHBOARD_ROOT", "asynq"}, creds...), want: `DASHBOARD_ROOT="asynq" (env; flag -root): must start with /`},
		{name: "reserved root", env: append([]string{"DASHBOARD_ROOT", "/metrics"}, creds...), want: "must not be /metrics"},
		{name: "unclean root", env: append([]string{"DASHBOARD_ROOT", "/a//b"}, creds...), want: "must be a clean path"},
		{name: "bad redis url", env: append([]string{"REDIS_URL", "redis://:hunter2@host:port/0"}, creds...), want: `REDIS_URL="<unparseable URL>" (env; flag -redis-url): not a valid URL`},
		{name: "bad prometheus url", env: append([]string{"DASHBOARD_PROMETHEUS_URL", "prometheus:9090"}, creds...), want: "DASHBOARD_PROMETHEUS_URL"},
		{name: "bad log level", env: append([]string{"LOG_LEVEL", "verbose"}, creds...), want: `LOG_LEVEL="verbose" (env; flag -log-level): logging: unknown level`},
		{name: "metrics tokens alone", env: []string{"DASHBOARD_METRICS_TOKENS", testMetricsToken}, want: "no credentials: set"},
		{name: "metrics token also a login", env: append([]string{"DASHBOARD_TOKENS", testToken, "DASHBOARD_METRICS_TOKENS", "met-other-0123456789," + testToken}, creds...),
			want: "DASHBOARD_METRICS_TOKENS (-metrics-tokens): token #2 is also in DASHBOARD_TOKENS"},
		{name: "metrics tokens without metrics auth", env: append([]string{"DASHBOARD_METRICS_TOKENS", testMetricsToken, "DASHBOARD_METRICS_AUTH", "false"}, creds...),
			want: "DASHBOARD_METRICS_TOKENS (-metrics-tokens) set with DASHBOARD_METRICS_AUTH=false"},
		{name: "short metrics token", env: append([]string{"DASHBOARD_METRICS_TOKENS", "short"}, creds...), want: "DASHBOARD_METRICS_TOKENS (-metrics-tokens): httpauth: bad configuration: bearer key #1 is shorter"},
		{name: "insecure with metrics tokens", env: []string{"DASHBOARD_METRICS_TOKENS", testMetricsToken}, args: []string{"-insecure-no-auth"}, want: "-insecure-no-auth given together with credentials"},
		{name: "stray argument", env: creds, args: []string{"serve"}, want: `unexpected arguments ["serve"]`},
		{name: "unknown flag", env: creds, args: []string{"-port", "1"}, want: "flag provided but not defined: -port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for i := 0; i+1 < len(tt.env); i += 2 {
				env[tt.env[i]] = tt.env[i+1]
			}
			var out bytes.Buffer
			err := run(t.Context(), append([]string{"dashboard"}, tt.args...), func(k string) string { return env[k] }, &out)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), testPassword)
			assert.NotContains(t, err.Error(), "hunter2")
			for i := 0; i+1 < len(tt.env); i += 2 {
				if tt.env[i] == "DASHBOARD_PASSWORD" && len(tt.env[i+1]) > 1 {
					assert.NotContains(t, err.Error(), tt.env[i+1], "the password is in the error")
				}
			}
			if strings.Contains(tt.want, "too weak") {
				assert.ErrorIs(t, err, ErrWeakPassword)
			}
			assert.Empty(t, out.String(), "nothing is logged before the settings are good")
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{"DASHBOARD_PASSWORD": testPassword, "DASHBOARD_TOKENS": testToken}
	require.NoError(t, run(t.Context(), []string{"dashboard", "-h"}, func(k string) string { return env[k] }, &out))
	assert.Contains(t, out.String(), "Usage: dashboard [flags]")
	assert.Contains(t, out.String(), "-insecure-no-auth\n")
	assert.NotContains(t, out.String(), testPassword)
	assert.NotContains(t, out.String(), testToken)
}

// TestSettingsTable prints the settings table for the README and checks
// that every setting the dashboard reads is in it.
func TestSettingsTable(t *testing.T) {
	t.Parallel()
	s := config.NewSet("dashboard", func(string) string { return "" })
	declare(s, &settings{})
	md := s.Markdown()
	t.Logf("settings:\n%s", md)
	for _, name := range []string{"DASHBOARD_ADDR", "DASHBOARD_ROOT", "REDIS_URL", "DASHBOARD_USER", "DASHBOARD_PASSWORD",
		"DASHBOARD_TOKENS", "`-insecure-no-auth`", "DASHBOARD_READ_ONLY", "DASHBOARD_METRICS_AUTH", "LOG_LEVEL", "LOG_FORMAT"} {
		assert.Contains(t, md, name)
	}
	assert.Contains(t, md, "| `-read-only` | `DASHBOARD_READ_ONLY` | `true` |")
	assert.Contains(t, md, "| `-password` | `DASHBOARD_PASSWORD` | (secret) |")

	require.NoError(t, s.CheckOrUpdateDoc("README.md", "settings"))
}

// TestShutdown checks that run returns nil promptly when its context ends.
func TestShutdown(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	logs := &logSink{ready: make(chan string, 1)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	env := testEnv(db)
	go func() {
		done <- run(ctx, []string{"dashboard", "-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, logs)
	}()
	select {
	case <-logs.ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	cancel()
	require.NoError(t, <-done)
	assert.True(t, strings.Contains(logs.String(), `"msg":"stopped"`), logs.String())
}
