package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(removeBinaries{redistest.Main(m)}) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestRunAppliesTasksAndStopsOnCancel(t *testing.T) {
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

	ops := freeAddr(t)
	env := map[string]string{
		"REDIS_URL":  db.URL(),
		"KEY_PREFIX": db.Prefix,
		"OPS_ADDR":   ops,
		"LOG_LEVEL":  "warn",
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-concurrency", "4"}, func(k string) string { return env[k] }) }()

	addr := "new address"
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "ev-1", OrderNo: "SO1", Changes: tasks.Changes{Address: &addr}})
	require.NoError(t, err)
	cli := asynq.NewClientFromRedisClient(db.Client)
	_, err = cli.Enqueue(task, asynq.Queue(tasks.QueueModify), asynq.TaskID("ev-1"))
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		o, err := store.Get(t.Context(), "SO1")
		return err == nil && o.Address == addr
	}, 30*time.Second, 10*time.Millisecond)

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + ops + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	// The task's run shows in the metrics. The log line is written after
	// the store commit, so wait for the series rather than assume it.
	require.Eventually(t, func() bool {
		m := scrape(t, "http://"+ops+"/metrics")
		return strings.Contains(m, `orderworker_task_duration_seconds_count{outcome="ok",queue="order_modify",task_type="order:modify"} 1`) &&
			strings.Contains(m, `orderworker_lock_wait_seconds_count{task_type="order:modify"} 1`)
	}, 10*time.Second, 10*time.Millisecond)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	defer func() {
		_ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(tasks.QueueModify, true)
	}()
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestRunRejectsBadSettings(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad url", map[string]string{"REDIS_URL": "http://x"}, "REDIS_URL"},
		{"unknown queue weight", map[string]string{"WORKER_QUEUES": "order_modify=x"}, "WORKER_QUEUES"},
		{"unknown queue", map[string]string{"WORKER_QUEUES": "default=1"}, "unknown queue"},
		{"negative timeout", map[string]string{"SHUTDOWN_TIMEOUT": "-1s"}, "SHUTDOWN_TIMEOUT"},
		{"min over max", map[string]string{"MODIFY_WAIT_MIN": "2s", "MODIFY_WAIT_MAX": "1s"}, "modify wait"},
		{"unknown failure policy", map[string]string{"MODIFY_FAILURE": "stop"}, "MODIFY_FAILURE"},
		{"short metrics token", map[string]string{"METRICS_TOKENS": "0123456789abcdef,tooshort"}, "METRICS_TOKENS (-metrics-tokens): httpauth: bad configuration: bearer key #2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"OPS_ADDR": "off", "REDIS_URL": "redis://127.0.0.1:1/0"}
			for k, v := range tt.env {
				env[k] = v
			}
			err := run(t.Context(), nil, func(k string) string { return env[k] })
			require.Error(t, err)
			require.True(t, strings.Contains(err.Error(), tt.want), "%v", err)
			require.NotContains(t, err.Error(), "tooshort", "no secret in the error")
		})
	}
}

// TestFailurePolicyPerKind reads each kind's failure policy: halt by
// default, and MODIFY_FAILURE=continue overrides the modify kind's alone.
func TestFailurePolicyPerKind(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want map[string]string
	}{
		{"defaults", map[string]string{}, map[string]string{"modify": "halt", "exchange": "halt"}},
		{"modify continues", map[string]string{"MODIFY_FAILURE": "continue"}, map[string]string{"modify": "continue", "exchange": "halt"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c settings
			s := config.NewSet("worker", func(k string) string { return tt.env[k] })
			declare(s, &c)
			require.NoError(t, s.Parse(nil))
			got := map[string]string{}
			for name, f := range c.Failures {
				got[name] = *f
			}
			require.Equal(t, tt.want, got)
		})
	}
}

// TestDocsListEverySetting checks the worker's settings table in
// docs/operations.md against the settings it declares; UPDATE_DOCS=1
// rewrites the table.
func TestDocsListEverySetting(t *testing.T) {
	s := config.NewSet("worker", nil)
	declare(s, &settings{})
	require.NoError(t, s.CheckOrUpdateDoc("../../docs/operations.md", "worker-settings"))
}

// With METRICS_TOKENS, the ops server's /metrics wants one of the tokens as
// a bearer credential, over a real socket; the health endpoints stay open.
func TestMetricsTokens(t *testing.T) {
	db := redistest.New(t)
	const token1, token2 = "metrics-token-0123456789", "metrics-token-abcdefghij"
	ops := freeAddr(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": ops, "LOG_LEVEL": "warn",
		"METRICS_TOKENS": token1 + "," + token2}
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runLogTo(ctx, nil, func(k string) string { return env[k] }, &logs) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("run did not return after cancel")
		}
		require.NotContains(t, logs.String(), token1)
		require.NotContains(t, logs.String(), token2)
	}()
	defer http.DefaultClient.CloseIdleConnections()

	get := func(path, auth string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+ops+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(b)
	}
	waitReady(t, ops)
	for _, path := range []string{"/healthz", "/readyz"} {
		code, _, _ := get(path, "")
		require.Equal(t, http.StatusOK, code, "%s without credentials", path)
	}

	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Basic " + token1, "Bearer " + token1 + "x"} {
		code, h, body := get("/metrics", auth)
		require.Equal(t, http.StatusUnauthorized, code, "Authorization %q", auth)
		require.Equal(t, `Bearer realm="orderworker worker metrics"`, h.Get("WWW-Authenticate"))
		require.NotContains(t, body, "go_goroutines")
	}
	for _, tok := range []string{token1, token2} {
		code, _, body := get("/metrics", "Bearer "+tok)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "go_goroutines")
	}
}

// Without METRICS_TOKENS, /metrics is open, as before.
func TestMetricsOpenWithoutTokens(t *testing.T) {
	db := redistest.New(t)
	ops := freeAddr(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": ops, "LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("run did not return after cancel")
		}
	}()
	defer http.DefaultClient.CloseIdleConnections()
	waitReady(t, ops)
	require.Contains(t, scrape(t, "http://"+ops+"/metrics"), "go_goroutines")
}

// waitReady polls the ops server at addr until /readyz answers 200.
func waitReady(t *testing.T, addr string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 10*time.Millisecond, "/readyz at %s", addr)
}

// The ops port listens on the loopback unless told otherwise.
func TestOpsListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	s := config.NewSet("worker", func(string) string { return "" })
	var c settings
	declare(s, &c)
	require.NoError(t, s.Parse(nil))
	host, _, err := net.SplitHostPort(c.OpsAddr)
	require.NoError(t, err)
	ip, err := netip.ParseAddr(host)
	require.NoError(t, err, c.OpsAddr)
	require.True(t, ip.IsLoopback(), c.OpsAddr)
}
