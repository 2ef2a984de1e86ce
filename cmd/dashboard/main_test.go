package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// Credentials the tests configure.
const (
	testUser     = "ops"
	testPassword = "pw-for-tests-7f3a"
	testToken    = "tok-0123456789abcdef-tests"
	// testMetricsToken is the tests' DASHBOARD_METRICS_TOKENS: it opens
	// /metrics only.
	testMetricsToken = "met-0123456789abcdef-scrape"
	queue            = "order_modify"
)

// logSink collects the dashboard's log lines and reports the address of
// the "listening" line, so that tests wait on a signal, not on time.
type logSink struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	ready   chan string
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		var entry struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal(s.partial[:i], &entry) == nil && entry.Msg == "listening" {
			select {
			case s.ready <- entry.Addr:
			default:
			}
		}
		s.partial = s.partial[i+1:]
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// dashboard is a running run() on a free loopback port.
type dashboard struct {
	base   string // http://127.0.0.1:port
	logs   *logSink
	client *http.Client
}

// startDashboard runs the dashboard with env and extra args until the test
// ends, and fails the test if run does not return nil then.
func startDashboard(t *testing.T, env map[string]string, args ...string) *dashboard {
	t.Helper()
	logs := &logSink{ready: make(chan string, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	argv := append([]string{"dashboard", "-addr", "127.0.0.1:0", "-log-level", "debug"}, args...)
	go func() { done <- run(ctx, argv, func(k string) string { return env[k] }, logs) }()

	d := &dashboard{logs: logs, client: &http.Client{
		Transport:     &http.Transport{},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	t.Cleanup(func() {
		d.client.CloseIdleConnections()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("run did not return after cancel")
		}
		if t.Failed() {
			t.Logf("dashboard logs:\n%s", logs.String())
		}
	})
	select {
	case addr := <-logs.ready:
		d.base = "http://" + addr
	case err := <-done:
		t.Fatalf("run returned before listening: %v\n%s", err, logs.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("dashboard not listening after 15s:\n%s", logs.String())
	}
	return d
}

// auth is how a request authenticates.
type auth func(*http.Request)

func noAuth(*http.Request) {}

func basicAuth(user, pass string) auth {
	return func(r *http.Request) { r.SetBasicAuth(user, pass) }
}

func bearerAuth(token string) auth {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }
}

type response struct {
	status int
	header http.Header
	body   string
}

func (d *dashboard) do(t *testing.T, method, path string, a auth, extra ...func(*http.Request)) response {
	t.Helper()
	return d.doWith(t, d.client, method, path, a, extra...)
}

// doWith is do over the client c, such as one of clientFrom.
func (d *dashboard) doWith(t *testing.T, c *http.Client, method, path string, a auth, extra ...func(*http.Request)) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, d.base+path, nil)
	require.NoError(t, err)
	a(req)
	for _, f := range extra {
		f(req)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp.StatusCode, resp.Header, string(body)}
}

func (d *dashboard) get(t *testing.T, path string, a auth) response {
	t.Helper()
	return d.do(t, http.MethodGet, path, a)
}

// testEnv is a complete environment for a dashboard on db.
func testEnv(db *redistest.DB, kv ...string) map[string]string {
	env := map[string]string{
		"REDIS_URL":                db.URL(),
		"DASHBOARD_USER":           testUser,
		"DASHBOARD_PASSWORD":       testPassword,
		"DASHBOARD_TOKENS":         testToken,
		"DASHBOARD_METRICS_TOKENS": testMetricsToken,
	}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

// orderPayload is an order:modify payload as the tasks package writes it.
func orderPayload(eventID, orderNo string) []byte {
	return []byte(`{"event_id":"` + eventID + `","order_no":"` + orderNo + `","changes":{"address":"1 Main St","remark":"leave at door"}}`)
}

// enqueueOrders puts two order:modify tasks in the order_modify queue and
// deletes the queue when the test ends (asynq's keys have no test prefix).
func enqueueOrders(t *testing.T, db *redistest.DB) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(db.Client)
	for _, o := range []struct{ event, order string }{{"evt-1001", "SO1001"}, {"evt-1002", "SO1002"}} {
		_, err := client.EnqueueContext(t.Context(), asynq.NewTask("order:modify", orderPayload(o.event, o.order)),
			asynq.Queue(queue), asynq.TaskID(o.event))
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true)
	})
}

// requireNoSecrets fails if the logs contain a configured credential.
func requireNoSecrets(t *testing.T, logs string) {
	t.Helper()
	for _, s := range []string{testPassword, testToken, testMetricsToken} {
		require.NotContains(t, logs, s, "a credential reached the logs")
	}
	require.False(t, strings.Contains(strings.ToLower(logs), "authorization"), "an Authorization header reached the logs")
}
