package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/logtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

const (
	testKey1 = "serve-key-one-0123456789"
	testKey2 = "serve-key-two-0123456789"
)

// logSink is serve's stdout: it keeps everything written, and each JSON
// log line for waitFor.
type logSink struct {
	*logtest.Sink
	mu sync.Mutex
	// seen is, for each msg, the index after the line waitFor last
	// returned for it.
	seen map[string]int
}

func newLogSink() *logSink { return &logSink{Sink: logtest.New(), seen: map[string]int{}} }

// waitFor returns the first log line whose msg is msg, among every line
// written (whatever other lines came before or after it) and after the
// line that the last waitFor for msg returned.
func (s *logSink) waitFor(t *testing.T, msg string) map[string]any {
	t.Helper()
	s.mu.Lock()
	from := s.seen[msg]
	s.mu.Unlock()
	line, i := s.Wait(t, 10*time.Second, "log line "+strconv.Quote(msg), from, func(l logtest.Line) bool { return l["msg"] == msg })
	s.mu.Lock()
	s.seen[msg] = i + 1
	s.mu.Unlock()
	return line
}

// started is a running "producer serve".
type started struct {
	addr   string
	logs   *logSink
	cancel context.CancelFunc
	done   chan error
}

// startServe runs "producer serve" with env and args until the test ends,
// and waits until it listens.
func startServe(t *testing.T, env map[string]string, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{logs: newLogSink(), cancel: cancel, done: make(chan error, 1)}
	go func() {
		s.done <- run(ctx, append([]string{"serve"}, args...), func(k string) string { return env[k] }, s.logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Logf("serve returned: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not return")
		}
	})
	s.addr = s.logs.waitFor(t, "listening")["addr"].(string)
	return s
}

func baseEnv(db *redistest.DB) map[string]string {
	return map[string]string{
		"REDIS_URL":       db.URL(),
		"KEY_PREFIX":      db.Prefix,
		"INTAKE_ADDR":     "127.0.0.1:0",
		"INTAKE_API_KEYS": testKey1 + ", " + testKey2,
		"LOG_LEVEL":       "debug",
	}
}

// TestServeGracefulShutdown cancels serve's context (SIGTERM in main) while a
// request is in flight, and checks that the request still gets its answer
// and that serve returns only after.
func TestServeGracefulShutdown(t *testing.T) {
	db := redistest.New(t)
	s := startServe(t, baseEnv(db))

	conn, err := net.Dial("tcp", s.addr)
	require.NoError(t, err)
	defer conn.Close()
	body := `{"changes":{"remark":"late"}}`
	req, err := http.NewRequest(http.MethodPost, "http://"+s.addr+"/v1/orders/SO1/modify", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey2)
	req.Header.Set("Idempotency-Key", "evt-inflight")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	req.ContentLength = int64(len(body))

	// Send the headers only. The server answers 100 Continue when the
	// handler starts reading the body: from then on the request is in
	// flight.
	var head bytes.Buffer
	require.NoError(t, req.Header.Write(&head))
	_, err = fmt.Fprintf(conn, "POST /v1/orders/SO1/modify HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n", s.addr, len(body), head.String())
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", status)
	blank, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "\r\n", blank)

	s.cancel()
	s.logs.waitFor(t, "shutting down")
	// Shutdown closes the listener first, then waits for the requests in
	// flight: once new connections are refused, it is waiting for ours.
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", s.addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 5*time.Millisecond, "the listener stays open")
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		t.Fatalf("serve returned with a request in flight: %v", err)
	default:
	}

	_, err = io.WriteString(conn, body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
	var res map[string]any
	require.NoError(t, json.Unmarshal(b, &res))
	delete(res, "seq")
	assert.Equal(t, map[string]any{"task_id": "evt-inflight", "queue": "order_modify", "event_id": "evt-inflight"}, res)

	select {
	case err := <-s.done:
		require.NoError(t, err)
		s.done <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after the request finished")
	}
	s.logs.waitFor(t, "stopped")
	_, err = asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "evt-inflight")
	require.NoError(t, err)
}

// TestServeEndToEnd enqueues and reads through the real binary's wiring,
// and checks that the keys never reach the logs.
func TestServeEndToEnd(t *testing.T) {
	db := redistest.New(t)
	s := startServe(t, baseEnv(db), "-max-body", "4096")
	base := "http://" + s.addr

	do := func(method, path, key, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		req.Header.Set("Idempotency-Key", "evt-e2e")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := do(http.MethodPost, "/v1/orders/SO1/exchange", testKey1, `{"items":[{"sku":"A","qty":1}]}`)
	require.Equal(t, http.StatusAccepted, code, body)
	code, body = do(http.MethodGet, "/v1/tasks/evt-e2e", testKey2, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"queue":"order_exchange"`)
	code, _ = do(http.MethodGet, "/v1/orders/SO1", "wrong-key-0123456789abcdef", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = do(http.MethodPost, "/v1/orders/SO1/modify", testKey1, `{"changes":{"remark":"`+strings.Repeat("x", 4096)+`"}}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, code)
	code, _ = do(http.MethodGet, "/readyz", "", "")
	require.Equal(t, http.StatusOK, code)
	http.DefaultClient.CloseIdleConnections()

	s.cancel()
	s.logs.waitFor(t, "stopped")
	logs := s.logs.String()
	assert.Contains(t, logs, `"api-keys":"<redacted>"`)
	assert.Contains(t, logs, `"principal":"key#2"`)
	for _, secret := range []string{testKey1, testKey2, "wrong-key-0123456789abcdef"} {
		assert.NotContains(t, logs, secret)
	}
}

// TestServeRateLimit checks the rate settings through the real wiring: a
// key past INTAKE_BURST gets 429 with Retry-After, and INTAKE_KEY_RATES
// overrides per key. The rate is so low that no token comes back while
// the test runs, so the real clock does.
func TestServeRateLimit(t *testing.T) {
	db := redistest.New(t)
	env := baseEnv(db)
	env["INTAKE_RATE"], env["INTAKE_BURST"], env["INTAKE_KEY_RATES"] = "0.01", "1", "2=off"
	s := startServe(t, env)

	post := func(key, eventID string) (int, http.Header) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+s.addr+"/v1/orders/SO1/modify",
			strings.NewReader(`{"changes":{"remark":"x"}}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", eventID)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode, resp.Header
	}
	status, _ := post(testKey1, "evt-1")
	require.Equal(t, http.StatusAccepted, status)
	status, header := post(testKey1, "evt-2")
	require.Equal(t, http.StatusTooManyRequests, status)
	// A token comes back in 100 s, less the time since the first request.
	retryAfter, err := strconv.Atoi(header.Get("Retry-After"))
	require.NoError(t, err)
	assert.InDelta(t, 100, retryAfter, 10)
	for i := range 3 {
		status, _ = post(testKey2, fmt.Sprintf("evt-k2-%d", i))
		require.Equal(t, http.StatusAccepted, status, "key#2 has no limit")
	}
	http.DefaultClient.CloseIdleConnections()
	_, err = asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "evt-2")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
}

func TestServeInsecureNoAuth(t *testing.T) {
	db := redistest.New(t)
	env := baseEnv(db)
	delete(env, "INTAKE_API_KEYS")
	s := startServe(t, env, "-insecure-no-auth")
	s.logs.waitFor(t, "authentication is off (-insecure-no-auth): anyone who reaches the port may enqueue order changes, read orders and run the operator actions (retry, skip, hold, resume)")

	resp, err := http.Get("http://" + s.addr + "/v1/orders/SO1")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	http.DefaultClient.CloseIdleConnections()
}

func TestServeRejectsBadSettings(t *testing.T) {
	const short = "tooshort"
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no keys", map[string]string{"INTAKE_API_KEYS": ""}, nil, "no API keys"},
		{"keys and insecure", nil, []string{"-insecure-no-auth"}, "-insecure-no-auth given together"},
		{"short key", map[string]string{"INTAKE_API_KEYS": testKey1 + "," + short}, nil, "INTAKE_API_KEYS (-api-keys): intake: APIKeys: httpauth: bad configuration: bearer key #2 is shorter"},
		{"body over the payload limit", map[string]string{"INTAKE_MAX_BODY": "1048576"}, nil, "INTAKE_MAX_BODY"},
		{"zero body", nil, []string{"-max-body", "0"}, "must be positive"},
		{"request timeout over write timeout", map[string]string{"INTAKE_REQUEST_TIMEOUT": "30s"}, nil, "must be below INTAKE_WRITE_TIMEOUT"},
		{"bad prefix", map[string]string{"KEY_PREFIX": "a{b}"}, nil, "KEY_PREFIX"},
		{"bad log level", map[string]string{"LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"arguments", nil, []string{"extra"}, "unexpected arguments"},
		{"zero rate", map[string]string{"INTAKE_RATE": "0"}, nil, "INTAKE_RATE=\"0\" (env; flag -rate): want a positive number of enqueues a second, or off"},
		{"negative rate", nil, []string{"-rate", "-5"}, "want a positive number"},
		{"rate not a number", map[string]string{"INTAKE_RATE": "fast"}, nil, "INTAKE_RATE"},
		{"zero burst", map[string]string{"INTAKE_BURST": "0"}, nil, "INTAKE_BURST=\"0\" (env; flag -burst): must be positive"},
		{"key rate without position", map[string]string{"INTAKE_KEY_RATES": "50"}, nil, "want N=RATE, N=RATE:BURST or N=off"},
		{"key rate of position 0", map[string]string{"INTAKE_KEY_RATES": "0=50"}, nil, "want N=RATE"},
		{"key rate of zero", map[string]string{"INTAKE_KEY_RATES": "1=0"}, nil, "key #1: want a positive number"},
		{"key burst of zero", map[string]string{"INTAKE_KEY_RATES": "1=5:0"}, nil, "key #1: the burst after ':' must be a positive integer"},
		{"key rate twice", map[string]string{"INTAKE_KEY_RATES": "1=5, 1=off"}, nil, "key #1 given twice"},
		{"key rate of no key", map[string]string{"INTAKE_KEY_RATES": "2=5"}, nil, "INTAKE_KEY_RATES (-key-rates): no key #2: INTAKE_API_KEYS has 1"},
		{"key rates without keys", map[string]string{"INTAKE_API_KEYS": "", "INTAKE_KEY_RATES": "1=5"}, []string{"-insecure-no-auth"}, "INTAKE_KEY_RATES (-key-rates) given with -insecure-no-auth"},
		{"address in use", nil, nil, "INTAKE_ADDR"},
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{
				"REDIS_URL":       "redis://127.0.0.1:1/0",
				"INTAKE_ADDR":     busy.Addr().String(),
				"INTAKE_API_KEYS": testKey1,
				"LOG_LEVEL":       "error",
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var out bytes.Buffer
			err := run(t.Context(), append([]string{"serve"}, tt.args...), func(k string) string { return env[k] }, &out)
			require.ErrorContains(t, err, tt.want)
			assert.NotContains(t, err.Error()+out.String(), short)
			assert.NotContains(t, err.Error()+out.String(), testKey1)
		})
	}
}

func TestServeHelp(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"serve", "-h"}, func(string) string { return "" }, &out))
	for _, env := range []string{"INTAKE_ADDR", "INTAKE_API_KEYS", "INTAKE_MAX_BODY", "INTAKE_READ_TIMEOUT", "INTAKE_WRITE_TIMEOUT",
		"INTAKE_IDLE_TIMEOUT", "INTAKE_REQUEST_TIMEOUT", "INTAKE_SHUTDOWN_TIMEOUT", "INTAKE_RATE", "INTAKE_BURST", "INTAKE_KEY_RATES", "REDIS_URL", "KEY_PREFIX", "LOG_LEVEL", "LOG_FORMAT", "-insecure-no-auth"} {
		assert.Contains(t, out.String(), env)
	}
}

// TestDocsListEveryServeSetting checks the intake's settings table in
// docs/operations.md against the settings `producer serve` declares;
// UPDATE_DOCS=1 rewrites the table.
func TestDocsListEveryServeSetting(t *testing.T) {
	s := config.NewSet("producer serve", nil)
	declareServe(s, &serveSettings{})
	require.NoError(t, s.CheckOrUpdateDoc("../../docs/operations.md", "intake-settings"))
}

// TestServeAnswersBeforeTheHandler checks what docs/operations.md and the
// OpenAPI description say net/http answers by itself, before the intake's handler
// runs, on the real server with its settings: a plain-text status, no JSON,
// no X-Request-Id, nothing enqueued. A stalled body, which the handler does
// see, gets the intake's 408 with a JSON error.
func TestServeAnswersBeforeTheHandler(t *testing.T) {
	db := redistest.New(t)
	s := startServe(t, baseEnv(db), "-read-timeout", "500ms")
	const post = "POST /v1/orders/SO1/modify HTTP/1.1\r\nHost: intake\r\nAuthorization: Bearer " + testKey1 +
		"\r\nIdempotency-Key: evt-raw\r\nContent-Type: application/json\r\n"
	const body = `{"changes":{"remark":"x"}}`
	cl := fmt.Sprintf("Content-Length: %d\r\n", len(body))
	tests := []struct {
		name    string
		request string
		status  int
	}{
		{"headers over 64 KiB", post + "X-Big: " + strings.Repeat("a", 70<<10) + "\r\n" + cl + "\r\n" + body, 431},
		{"bad % escape in the path", strings.Replace(post, "/SO1/", "/%zz/", 1) + cl + "\r\n" + body, 400},
		{"header name with a space", post + "X-Bad Name: 1\r\n" + cl + "\r\n" + body, 400},
		{"no Host", strings.Replace(post, "Host: intake\r\n", "", 1) + cl + "\r\n" + body, 400},
		{"two Content-Lengths", post + cl + "Content-Length: 3\r\n\r\n" + body, 400},
		{"malformed Content-Length", post + "Content-Length: x\r\n\r\n" + body, 400},
		{"Transfer-Encoding gzip", post + "Transfer-Encoding: gzip\r\n\r\n" + body, 501},
		{"Transfer-Encoding gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n" + body, 501},
		{"Transfer-Encoding twice", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + body, 501},
		{"Transfer-Encoding that does not parse", post + "Transfer-Encoding: chunked\x00\r\n\r\n" + body, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := rawRequest(t, s.addr, tt.request)
			require.Equal(t, tt.status, resp.StatusCode, "%s", b)
			assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
			assert.Empty(t, resp.Header.Get("X-Request-Id"), "net/http answered, not the intake")
		})
	}

	// Headers that stall get no answer: the connection is closed.
	conn, err := net.Dial("tcp", s.addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "POST /v1/orders/SO1/modify HTTP/1.1\r\nHost: intake\r\n")
	require.NoError(t, err)
	stalled, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		stalled.Body.Close()
	}
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)

	// A body that stalls is the intake's: 408, JSON, no addresses.
	resp, b := rawRequest(t, s.addr, post+"Content-Length: 100\r\n\r\n{")
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", b)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, b, `"code":"request_timeout"`)
	assert.NotContains(t, b, "127.0.0.1")

	insp := asynq.NewInspectorFromRedisClient(db.Client)
	queues, err := insp.Queues()
	require.NoError(t, err)
	for _, q := range queues {
		info, err := insp.GetQueueInfo(q)
		require.NoError(t, err)
		assert.Zero(t, info.Size, "nothing is enqueued in %s", q)
	}
}

// rawAnswer is an answer that rawRequest read whole.
type rawAnswer struct {
	StatusCode int
	Header     http.Header
}

// rawRequest writes request as it is on a new connection and reads the
// answer, within 10 s.
func rawRequest(t *testing.T, addr, request string) (rawAnswer, string) {
	t.Helper()
	var d net.Dialer
	conn, err := d.DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return rawAnswer{StatusCode: resp.StatusCode, Header: resp.Header}, string(b)
}

// With WAIT_REPLICAS above the replicas Redis has, serve says so at start
// and answers an enqueue 503 (the change is not confirmed), never 202.
func TestServeWaitReplicasUnmet(t *testing.T) {
	db := redistest.New(t) // no replica
	env := baseEnv(db)
	env["WAIT_REPLICAS"] = "1"
	env["WAIT_TIMEOUT"] = "20ms"
	s := startServe(t, env)
	require.Contains(t, s.logs.String(), "WAIT_REPLICAS cannot be met now")
	require.Contains(t, s.logs.String(), "0 of 1 replicas acknowledged within 20ms")

	req, err := http.NewRequest(http.MethodPost, "http://"+s.addr+"/v1/orders/SO1/modify", strings.NewReader(`{"changes":{"remark":"r"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey1)
	req.Header.Set("Idempotency-Key", "evt-unconfirmed")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
}

// The intake listens on the loopback unless told otherwise: an open port
// is a decision, not a default.
func TestServeListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	var c serveSettings
	set := config.NewSet("producer serve", func(string) string { return "" })
	declareServe(set, &c)
	require.NoError(t, set.Parse(nil))
	host, _, err := net.SplitHostPort(c.Addr)
	require.NoError(t, err)
	ip, err := netip.ParseAddr(host)
	require.NoError(t, err, c.Addr)
	assert.True(t, ip.IsLoopback(), c.Addr)
}
