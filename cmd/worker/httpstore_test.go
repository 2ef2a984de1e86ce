package main

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/httpstore"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// orderAPI is an upstream for the worker: the fake upstream (upstreamtest)
// serving the reference order API over a Redis store, the oracle.
type orderAPI struct {
	*upstreamtest.Server
	oracle *redisstore.Store
}

// newOrderAPI starts the upstream; it answers 503 for the orders in down.
func newOrderAPI(t *testing.T, db *redistest.DB, down ...string) *orderAPI {
	t.Helper()
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	a := &orderAPI{Server: upstreamtest.New(t, orderapitest.NewHandler(oracle)), oracle: oracle}
	for _, no := range down {
		a.Down(no)
	}
	return a
}

// write returns the headers of the write request with Idempotency-Key
// eventID.
func (a *orderAPI) write(t *testing.T, eventID string) http.Header {
	t.Helper()
	var hdr http.Header
	// The reference server records a request once its handler has
	// answered, just after the write reached the oracle: a test that saw
	// the write in the oracle waits for the record.
	require.Eventually(t, func() bool {
		for _, r := range a.RequestsWith(httpstore.HeaderIdempotencyKey, eventID) {
			if r.Method == http.MethodPost {
				hdr = r.Header
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond, "the upstream saw no write with Idempotency-Key %s", eventID)
	return hdr
}

// lockedBuffer is a log sink that is safe to write from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunWithHTTPStore runs the worker with ORDER_STORE=http against a
// reference upstream: a modify and an exchange reach the upstream with the
// token, the event ID and the lock's fence; a write to the closed order is
// archived, one the upstream cannot take is retried; one token serves it
// all; and neither the secret nor the token is logged. The worker runs as
// a Redis user with its rules for ORDER_STORE=http.
func TestRunWithHTTPStore(t *testing.T) {
	db := redistest.New(t)
	api := newOrderAPI(t, db, "SO2")
	ctx := t.Context()
	require.NoError(t, api.oracle.Put(ctx, orders.Order{No: "SO1", Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

	ops := freeAddr(t)
	env := map[string]string{
		"REDIS_URL":           asProcess(t, db, acl.Worker, true).URL(),
		"KEY_PREFIX":          db.Prefix,
		"OPS_ADDR":            ops,
		"LOG_LEVEL":           "debug",
		"ORDER_STORE":         "http",
		"ORDER_API_URL":       api.APIURL(),
		"ORDER_API_TIMEOUT":   "5s",
		"TOKEN_URL":           api.TokenURL(),
		"TOKEN_CLIENT_ID":     upstreamtest.ClientID,
		"TOKEN_CLIENT_SECRET": upstreamtest.ClientSecret,
		"TOKEN_SCOPES":        "orders.read, orders.write",
	}
	var logs lockedBuffer
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runLogTo(runCtx, nil, func(k string) string { return env[k] }, &logs) }()

	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		_ = insp.DeleteQueue(tasks.QueueModify, true)
		_ = insp.DeleteQueue(tasks.QueueExchange, true)
	})
	enqueueModify := func(eventID, orderNo, address string) {
		t.Helper()
		task, err := tasks.NewTask(tasks.ModifyPayload{EventID: eventID, OrderNo: orderNo, Changes: tasks.Changes{Address: &address}})
		require.NoError(t, err)
		_, err = cli.Enqueue(task, asynq.Queue(tasks.QueueModify), asynq.TaskID(eventID), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}

	enqueueModify("ev-mod", "SO1", "new address")
	require.Eventually(t, func() bool {
		o, err := api.oracle.Get(ctx, "SO1")
		return err == nil && o.Address == "new address"
	}, 30*time.Second, 10*time.Millisecond, "the modify never reached the upstream")

	// A raw task's seq that no sequence handed out reaches the upstream
	// only as a position to check, never to store.
	poison, err := tasks.NewTask(tasks.ModifyPayload{EventID: "ev-poison", OrderNo: "SO1", Seq: 9000000000000000, Changes: tasks.Changes{Remark: new("poison")}})
	require.NoError(t, err)
	_, err = cli.Enqueue(poison, asynq.Queue(tasks.QueueModify), asynq.TaskID("ev-poison"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		o, err := api.oracle.Get(ctx, "SO1")
		return err == nil && o.Remark == "poison"
	}, 30*time.Second, 10*time.Millisecond, "the raw task never reached the upstream")
	hdr := api.write(t, "ev-poison")
	assert.Equal(t, "9000000000000000", hdr.Get(httpstore.HeaderSequenceCheck))
	assert.Empty(t, hdr.Get(httpstore.HeaderSequence))

	x, err := tasks.NewTask(tasks.ExchangePayload{EventID: "ev-x", OrderNo: "SO1", Items: []tasks.Item{{SKU: "B", Qty: 2}}, Reason: "wrong size"})
	require.NoError(t, err)
	_, err = cli.Enqueue(x, asynq.Queue(tasks.QueueExchange), asynq.TaskID("ev-x"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	newNo := tasks.ReplacementOrderNo("SO1", "ev-x")
	require.Eventually(t, func() bool {
		o, err := api.oracle.Get(ctx, newNo)
		return err == nil && o.ExchangedFrom == "SO1"
	}, 30*time.Second, 10*time.Millisecond, "the exchange never reached the upstream")

	// A modify of the exchanged order can never succeed: archived, with
	// the replacement named. One the upstream cannot take now is retried.
	enqueueModify("ev-closed", "SO1", "too late")
	require.NoError(t, api.oracle.Put(ctx, orders.Order{No: "SO2", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	enqueueModify("ev-down", "SO2", "later")
	require.Eventually(t, func() bool {
		c, err1 := insp.GetTaskInfo(tasks.QueueModify, "ev-closed")
		d, err2 := insp.GetTaskInfo(tasks.QueueModify, "ev-down")
		return err1 == nil && err2 == nil && c.State == asynq.TaskStateArchived && d.State == asynq.TaskStateRetry
	}, 30*time.Second, 10*time.Millisecond, "tasks were not archived and retried")
	closed, err := insp.GetTaskInfo(tasks.QueueModify, "ev-closed")
	require.NoError(t, err)
	assert.Contains(t, closed.LastErr, newNo, "the archived task names the replacement")
	retried, err := insp.GetTaskInfo(tasks.QueueModify, "ev-down")
	require.NoError(t, err)
	assert.Contains(t, retried.LastErr, "503")

	require.Eventually(t, func() bool {
		return strings.Contains(scrape(t, "http://"+ops+"/metrics"), `orderworker_token_refreshes_total{result="ok"} 1`)
	}, 10*time.Second, 10*time.Millisecond, "the token refresh hook is wired to the metrics")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}

	// One token, asked for with the configured scopes, served every request.
	require.EqualValues(t, 1, api.Issued.Load(), "token fetches")
	tok, scopes := api.Tokens()[0], api.Scopes()
	assert.Equal(t, []string{"orders.read orders.write"}, scopes)
	assert.Equal(t, 1, int(db.Client.Exists(ctx, db.Prefix+"token:{upstream}").Val()), "the token is shared under KEY_PREFIX")

	// Each write carried the token, its event ID and the fence that the
	// oracle recorded in the order's history.
	h, err := orders.AllHistory(ctx, api.oracle, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 4, "put, modify, raw modify, exchange")
	for _, e := range h[1:] {
		hdr := api.write(t, e.EventID)
		assert.Equal(t, "Bearer "+tok, hdr.Get("Authorization"), e.EventID)
		assert.Equal(t, e.EventID, hdr.Get(httpstore.HeaderIdempotencyKey))
		assert.Equal(t, strconv.FormatInt(e.Fence, 10), hdr.Get(httpstore.HeaderFencingToken), e.EventID)
		assert.Positive(t, e.Fence)
		assert.Equal(t, e.Worker, hdr.Get(httpstore.HeaderWorkerID))
		assert.NotEmpty(t, e.Worker)
	}
	assert.Equal(t, []string{"ev-mod", "ev-poison", "ev-x"}, []string{h[1].EventID, h[2].EventID, h[3].EventID})
	assert.Zero(t, h[2].Seq, "the upstream kept no position of the raw task")
	assert.Zero(t, db.Client.Exists(ctx, db.Prefix+"order:{SO1}").Val(), "no order written to the worker's Redis")

	out := logs.String()
	assert.Contains(t, out, `"order_store":"http"`, "the log was captured")
	requireAllowed(t, out)
	assert.Contains(t, out, "ev-closed")
	assert.NotContains(t, out, upstreamtest.ClientSecret)
	assert.NotContains(t, out, tok)
	assert.NotContains(t, out, strings.TrimPrefix(tok, "at-")[:16])
}

func TestRunRejectsHTTPStoreSettings(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"unknown store", map[string]string{"ORDER_STORE": "postgres"}, []string{"ORDER_STORE", "redis, http"}},
		{"http without settings", map[string]string{"ORDER_STORE": "http"}, []string{"ORDER_API_URL", "TOKEN_URL", "TOKEN_CLIENT_ID"}},
		{"http without client ID", map[string]string{"ORDER_STORE": "http", "ORDER_API_URL": "http://orders", "TOKEN_URL": "http://auth/token"}, []string{"needs TOKEN_CLIENT_ID"}},
		{"API URL not absolute", map[string]string{"ORDER_API_URL": "orders.example/v1"}, []string{"ORDER_API_URL", "absolute"}},
		{"token URL scheme", map[string]string{"TOKEN_URL": "ftp://auth/token"}, []string{"TOKEN_URL", "scheme"}},
		{"API URL with a password", map[string]string{"ORDER_STORE": "http", "ORDER_API_URL": "https://u:hunter2@orders", "TOKEN_URL": "https://auth/token", "TOKEN_CLIENT_ID": "id"}, []string{"credentials"}},
		{"token URL in clear text", map[string]string{"ORDER_STORE": "http", "ORDER_API_URL": "https://orders", "TOKEN_URL": "http://auth.example/token", "TOKEN_CLIENT_ID": "id"},
			[]string{"TOKEN_URL", "not loopback", "TOKEN_ALLOW_INSECURE_HTTP"}},
		{"zero API timeout", map[string]string{"ORDER_API_TIMEOUT": "0s"}, []string{"ORDER_API_TIMEOUT", "positive"}},
		{"zero token wait", map[string]string{"TOKEN_WAIT_TIMEOUT": "0s"}, []string{"TOKEN_WAIT_TIMEOUT", "positive"}},
		{"negative refresh before", map[string]string{"TOKEN_REFRESH_BEFORE": "-1s"}, []string{"TOKEN_REFRESH_BEFORE", "positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"OPS_ADDR": "off", "REDIS_URL": "redis://127.0.0.1:1/0", "TOKEN_CLIENT_SECRET": "hunter2"}
			for k, v := range tt.env {
				env[k] = v
			}
			err := run(t.Context(), nil, func(k string) string { return env[k] })
			require.Error(t, err)
			for _, want := range tt.want {
				assert.ErrorContains(t, err, want)
			}
			assert.NotContains(t, err.Error(), "hunter2", "no secret in errors")
		})
	}
}

// TestRunWarnsOfIgnoredAPISettings: order API settings without
// ORDER_STORE=http are a likely mistake, so the worker says so.
func TestRunWarnsOfIgnoredAPISettings(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{
		"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": "off", "LOG_LEVEL": "warn",
		"ORDER_API_URL": "http://orders.example", "TOKEN_CLIENT_SECRET": upstreamtest.ClientSecret,
	}
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // start and stop at once
	require.NoError(t, runLogTo(ctx, nil, func(k string) string { return env[k] }, &logs))
	assert.Contains(t, logs.String(), "order API settings ignored")
	assert.Contains(t, logs.String(), "ORDER_API_URL")
	assert.NotContains(t, logs.String(), upstreamtest.ClientSecret)
}
