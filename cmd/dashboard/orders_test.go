package main

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// seedWaiting puts order no in the store under db's prefix and accepts a
// modify of it (event id), which waits as nothing runs it. It deletes the
// queues when the test ends.
func seedWaiting(t *testing.T, db *redistest.DB, no, id string) int64 {
	t.Helper()
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: no, Address: "1 Main St <b>", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	r, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new("ring twice")}, producer.WithEventID(id))
	require.NoError(t, err)
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(db.Client)
		for _, k := range tasks.Kinds() {
			_ = insp.DeleteQueue(k.Queue, true)
		}
	})
	return r.Seq
}

// TestOrderPage checks the order page over HTTP on a read-only dashboard:
// behind the same authentication as asynqmon, a search that leads to the
// order, links into asynqmon, no write buttons, escaped text, a strict
// content security policy, and 400 for what is not an order number.
func TestOrderPage(t *testing.T) {
	db := redistest.New(t)
	seq := seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix))
	basic := basicAuth(testUser, testPassword)

	for _, path := range []string{"/orders", "/orders/SO1001", "/orders/order.js"} {
		r := d.get(t, path, noAuth)
		assert.Equal(t, http.StatusUnauthorized, r.status, path)
	}

	r := d.get(t, "/orders", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<form method="get" action="/orders" role="search">`)
	assert.Contains(t, r.body, "its ID column shows only the part of an ID before the first")

	r = d.get(t, "/orders?no=SO1001", basic)
	assert.Equal(t, http.StatusSeeOther, r.status)
	assert.Equal(t, "/orders/SO1001", r.header.Get("Location"))

	r = d.get(t, "/orders/SO1001", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	assert.Equal(t, orderCSP, r.header.Get("Content-Security-Policy"))
	assert.Equal(t, "DENY", r.header.Get("X-Frame-Options"))
	assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
	assert.Contains(t, r.body, `<h2 id="order-no">SO1001</h2>`)
	assert.Contains(t, r.body, "1 Main St &lt;b&gt;", "the order's text is escaped")
	assert.Contains(t, r.body, `<a class="mono" href="/queues/order_modify/tasks/crm-7f3a9c">crm-7f3a9c</a>`)
	assert.Contains(t, r.body, `href="/queues/order_modify?status=pending"`)
	assert.Contains(t, r.body, "its turn: asynq runs it as soon as a worker is free")
	assert.Contains(t, r.body, `<td class="num">`+strconv.FormatInt(seq, 10)+`</td>`)
	assert.NotContains(t, r.body, "<button type=\"button\"", "no write buttons when read-only")
	assert.Contains(t, r.body, `<span class="muted">read-only</span>`)

	r = d.get(t, "/orders/order.js", basic)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "text/javascript; charset=utf-8", r.header.Get("Content-Type"))
	assert.Contains(t, r.body, `fetch(window.location.origin + b.dataset.url`)

	for _, path := range []string{"/orders/S.O", "/orders?no=S%20O", "/orders/a/b"} {
		r = d.get(t, path, basic)
		assert.Equal(t, http.StatusBadRequest, r.status, path)
		assert.Contains(t, r.body, "Not an order number", path)
	}
	r = d.do(t, http.MethodPost, "/orders/SO1001", basic)
	assert.Equal(t, http.StatusMethodNotAllowed, r.status)
	assert.Equal(t, "GET, HEAD", r.header.Get("Allow"))

	// Nothing is known of another number: a page that says so.
	r = d.get(t, "/orders/SO-NONE", basic)
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.body, "Nothing is known of SO-NONE")
	requireNoSecrets(t, d.logs.String())
}

// TestOrderPageLeadsWithTheHold: the order page's "What is happening" of a
// held order starts with the hold: who, since when, why, and what resumes
// it.
func TestOrderPageLeadsWithTheHold(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond).UTC()
	seedHeld(t, db, "SO1001", "ops@example.com", "check the address", at)
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix))

	r := d.get(t, "/orders/SO1001", basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, r.body)
	_, rest, ok := strings.Cut(r.body, `<ul class="summary"><li>`)
	require.True(t, ok, r.body)
	lead, _, _ := strings.Cut(rest, "</li>")
	assert.True(t, strings.HasPrefix(lead, "On hold: held by ops@example.com since "+at.Format(time.RFC3339)+" (check the address)."), lead)
	assert.Contains(t, lead, "Resume it with producer order resume SO1001")
	assert.Contains(t, lead, "Resume on this page when the dashboard&#39;s writes are on")
}

// TestOrderPageWritable checks, on a writable dashboard under a root path,
// that the order page's links and write buttons carry the root, that a
// button's request is asynqmon's API request with its guards (a cross-site
// one is refused), and that it acts.
func TestOrderPageWritable(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false", "DASHBOARD_ROOT", "/asynq"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/asynq/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `href="/asynq/queues/order_modify/tasks/crm-7f3a9c"`)
	assert.Contains(t, r.body, `<link rel="stylesheet" href="/asynq/orders/order.css">`)
	archive := "/asynq/api/queues/order_modify/pending_tasks/crm-7f3a9c:archive"
	assert.Contains(t, r.body, `data-method="POST" data-url="`+archive+`"`)
	assert.Contains(t, r.body, `data-method="DELETE" data-url="/asynq/api/queues/order_modify/pending_tasks/crm-7f3a9c"`)
	assert.Equal(t, http.StatusNotFound, d.get(t, "/orders/SO1001", basic).status, "only under the root")

	crossSite := func(r *http.Request) {
		r.Header.Set("Origin", "https://evil.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	}
	r = d.do(t, http.MethodPost, archive, basic, crossSite)
	assert.Equal(t, http.StatusForbidden, r.status, "a cross-site write is refused")
	r = d.do(t, http.MethodPost, archive, basic)
	require.Equal(t, http.StatusNoContent, r.status, r.body)

	r = d.get(t, "/asynq/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `href="/asynq/queues/order_modify?status=archived">archived</a>`)
	assert.Contains(t, r.body, `data-url="/asynq/api/queues/order_modify/archived_tasks/crm-7f3a9c:run"`)
}

// TestOrderPageRedisDown answers 503 with a page when Redis is unreachable,
// and logs why.
func TestOrderPageRedisDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	d := startDashboard(t, map[string]string{
		"REDIS_URL":          "redis://" + addr + "/0?dial_timeout=200ms&max_retries=-1",
		"DASHBOARD_USER":     testUser,
		"DASHBOARD_PASSWORD": testPassword,
	})
	r := d.get(t, "/orders/SO1001", basicAuth(testUser, testPassword))
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Contains(t, r.body, "Could not read the order")
	assert.Contains(t, d.logs.String(), "order page: status read failed")
	assert.Contains(t, d.logs.String(), `"error_code":"unavailable"`)
}

// With ORDER_STORE=http the order page reads the order from the order API,
// where the worker writes it, not from Redis. The dashboard runs as a user
// with its rules for the order API: no right on the workers' shared token
// and no order key; it reads with a token of its own, kept in memory.
func TestOrderPageReadsTheHTTPStore(t *testing.T) {
	db := redistest.New(t)
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	up := upstreamtest.New(t, orderapitest.NewHandler(oracle))
	require.NoError(t, oracle.Put(t.Context(), orders.Order{No: "SO7", Address: "7 Upstream Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	rules, err := acl.Rules(acl.Dashboard, acl.Options{KeyPrefix: db.Prefix, OrderAPI: true})
	require.NoError(t, err)
	d := startDashboard(t, testEnv(db.AsUser(t, rules...), "KEY_PREFIX", db.Prefix, "ORDER_STORE", "http",
		"ORDER_API_URL", up.APIURL(), "TOKEN_URL", up.TokenURL(),
		"TOKEN_CLIENT_ID", upstreamtest.ClientID, "TOKEN_CLIENT_SECRET", upstreamtest.ClientSecret))

	r := d.get(t, "/orders/SO7", basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, "7 Upstream Rd")
	assert.NotEmpty(t, up.Requests(), "the dashboard asked the order API")
	n, err := db.Client.Exists(t.Context(), db.Prefix+"token:{upstream}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the dashboard's token is not in Redis")
	assert.NotContains(t, d.logs.String(), upstreamtest.ClientSecret)
	requireNoRefusal(t, d.logs.String())
}

// With QUEUE_SHARDS, asynqmon lists the shard queues by itself, the
// dashboard's metrics export each, the order page links the task in its
// order's shard, and asynqmon's API acts on a shard queue's task (the colon
// in the name passes its router and the task ID guard).
func TestOrderPageWithShards(t *testing.T) {
	db := redistest.New(t)
	shards := tasks.Shards{Count: 3}
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1001", Address: "1 Main St", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, Shards: shards})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	res, err := p.EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("ring twice")}, producer.WithEventID("crm-7f3a9c"))
	require.NoError(t, err)
	require.Equal(t, "order_modify:2", res.Queue)
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(db.Client)
		for _, q := range shards.AllQueues(tasks.Kinds()) {
			_ = insp.DeleteQueue(q, true)
		}
	})
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "QUEUE_SHARDS", "3", "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/api/queues", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `"queue":"order_modify:2"`)
	r = d.get(t, "/metrics", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="order_modify:2",state="pending"} 1`)

	r = d.get(t, "/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<a class="mono" href="/queues/order_modify:2/tasks/crm-7f3a9c">crm-7f3a9c</a>`)
	archive := "/api/queues/order_modify:2/pending_tasks/crm-7f3a9c:archive"
	assert.Contains(t, r.body, `data-method="POST" data-url="`+archive+`"`)
	r = d.do(t, http.MethodPost, archive, basic)
	require.Equal(t, http.StatusNoContent, r.status, r.body)
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo("order_modify:2", "crm-7f3a9c")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateArchived, info.State)
}

// TestOrderPageEscapesBidi checks that bidirectional overrides and other
// control and format characters in an order's address, remark and SKU are
// shown escaped on the order page, as the CLI shows them, and never raw:
// "\u202e" would make the rest of the line read backwards.
func TestOrderPageEscapesBidi(t *testing.T) {
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{
		No:      "SO1001",
		Address: "1 Main St \u202egnp.exe",
		Remark:  "ring\u2066 twice\u2069\x1b[2J",
		Items:   []orders.Item{{SKU: "TEA\u202d-1", Qty: 2}, {SKU: "Straße-✓", Qty: 1}},
	}))
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix))

	r := d.get(t, "/orders/SO1001", basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<dd>1 Main St \u202egnp.exe</dd>`)
	assert.Contains(t, r.body, `<dd>ring\u2066 twice\u2069\x1b[2J</dd>`)
	assert.Contains(t, r.body, `TEA\u202d-1 × 2, Straße-✓ × 1`, "other letters and symbols stay as they are")
	for _, raw := range []string{"\u202e", "\u202d", "\u2066", "\u2069", "\x1b"} {
		assert.NotContains(t, r.body, raw, "%q is rendered raw", raw)
	}
}

// TestOrderPageOfALongBacklog shows the count of a backlog of 3,000
// changes and its first page, and answers at once for a forged sequence of
// 20,000,000. "At once" is the work Redis does for the page, counted on a
// server of the test's own (a clock would fail on a loaded machine): a
// page's, not the backlog's.
func TestOrderPageOfALongBacklog(t *testing.T) {
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	const prefix = "long:"
	forge := func(no string, waiting, records int) {
		fields := []any{"n", 1000 + waiting, "d", 1000}
		for i := 1; i <= records; i++ {
			fields = append(fields, "p:"+strconv.Itoa(1000+i), "1700000000000 m ev-"+strconv.Itoa(i))
		}
		require.NoError(t, rdb.HSet(t.Context(), prefix+"lock:{"+no+"}:seq", fields...).Err())
	}
	forge("SO-BIG", 3000, 3000)
	forge("SO50", 20000000, 0)
	d := startDashboard(t, map[string]string{
		"REDIS_URL": p.URL(), "KEY_PREFIX": prefix,
		"DASHBOARD_USER": testUser, "DASHBOARD_PASSWORD": testPassword, "DASHBOARD_TOKENS": testToken,
	})
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/orders/SO-BIG", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<span id="waiting-count">3,000</span> waiting`)
	assert.Contains(t, r.body, "The first 50 are listed, and 2,950 more positions wait.")
	assert.Contains(t, r.body, `<td class="num">1050</td>`)
	assert.NotContains(t, r.body, `<td class="num">1051</td>`)

	calls := redistest.CallsDuring(t, rdb, func() { r = d.get(t, "/orders/SO50", basic) })
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.LessOrEqual(t, calls.Total(), int64(2*orderview.DefaultMaxPositions), "a page's commands at most: %v", calls)
	assert.Contains(t, r.body, `<span id="waiting-count">20,000,000</span> waiting`)
	assert.Contains(t, r.body, "The first 0 are listed, and 20,000,000 more positions wait.")
}
