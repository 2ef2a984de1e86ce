package intake

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestGetOrderAndHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	require.NoError(t, e.store.Put(t.Context(), orders.Order{
		No: "SO1", Address: "1 Main St", Remark: "r", Items: []tasks.Item{{SKU: "A", Qty: 2}},
	}))

	r := e.do(t, http.MethodGet, "/v1/orders/SO1", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var o orders.Order
	r.decode(t, &o)
	assert.Equal(t, "SO1", o.No)
	assert.Equal(t, orders.StatusActive, o.Status)
	assert.Equal(t, "1 Main St", o.Address)
	assert.Equal(t, []tasks.Item{{SKU: "A", Qty: 2}}, o.Items)
	assert.Equal(t, int64(1), o.Version)

	r = e.do(t, http.MethodGet, "/v1/orders/SO1/history", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var h orderview.History
	r.decode(t, &h)
	assert.Equal(t, "SO1", h.OrderNo)
	require.Len(t, h.Entries, 1)
	assert.Equal(t, orders.TypePut, h.Entries[0].Type)
	assert.Empty(t, h.Skipped)
	assert.Contains(t, string(r.body), `"skipped":[]`, "an empty list, not null")

	for _, path := range []string{"/v1/orders/SO2", "/v1/orders/SO2/history"} {
		r = e.do(t, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", path, r.body)
		assert.Equal(t, codeNotFound, r.errorBody(t).Error.Code)
	}
	for _, path := range []string{"/v1/orders/S%20O", "/v1/orders/" + strings.Repeat("9", 65) + "/history"} {
		r = e.do(t, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", path, r.body)
		body := r.errorBody(t)
		assert.Equal(t, codeInvalidParameter, body.Error.Code)
		assert.Equal(t, "order_no", body.Error.Field)
	}
}

// TestGetOrderStatus reads, over a real socket, the status of an order with
// a change applied, one archived, the next one retrying and one parked
// behind it, as a worker left it; then that of a number nothing is known
// of, and of a malformed one.
func TestGetOrderStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.GapWait = 45 * time.Second })
	s := orderviewtest.Build(t, e.rdb, e.db.Prefix, "SO1001")

	r := e.do(t, http.MethodGet, "/v1/orders/SO1001/status", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var st orderview.Status
	r.decode(t, &st)
	assert.Equal(t, "SO1001", st.OrderNo)
	require.NotNil(t, st.Order)
	assert.Equal(t, "2 New Rd, "+s.Applied, st.Order.Address)
	assert.Equal(t, s.Seq[s.Archived], st.Sequence.Done)
	require.Len(t, st.Sequence.Waiting, 2)
	assert.Equal(t, s.Retried, st.Sequence.Waiting[0].TaskID)
	states := map[string]string{}
	for _, tk := range st.Tasks {
		states[tk.TaskID] = tk.State + " " + tk.Source
	}
	assert.Equal(t, map[string]string{s.Applied: "completed history", s.Archived: "archived log",
		s.Retried: "retry position", s.Parked: "retry position"}, states)
	assert.NotEmpty(t, st.Summary)
	// The wire names of the schema, and no order member when absent.
	for _, member := range []string{`"sequence":{"exists":true,"done":`, `"waiting":[{"seq":`, `"next":true`,
		`"task_state":"retry"`, `"kind":"note"`, `"history_total":2`, `"lock":{"held":false}`} {
		assert.Contains(t, string(r.body), member)
	}

	r = e.do(t, http.MethodGet, "/v1/orders/SO-NONE/status", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var none orderview.Status
	r.decode(t, &none)
	assert.Nil(t, none.Order)
	assert.NotContains(t, string(r.body), `"order":`)
	assert.Contains(t, string(r.body), `"tasks":[]`)
	assert.Contains(t, none.Summary[0], "Nothing is known of SO-NONE")

	r = e.do(t, http.MethodGet, "/v1/orders/S.O/status", "", nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, "order_no", r.errorBody(t).Error.Field)
	r = e.do(t, http.MethodGet, "/v1/orders/SO1001/status", "", map[string]string{"Authorization": ""})
	require.Equal(t, http.StatusUnauthorized, r.status, "%s", r.body)
}

// TestGetOrderStatusOfAForgedBacklog answers at once for a sequence that
// claims 20,000,000 waiting changes: one page, and the count of the rest.
// "At once" is the work Redis does for the request, counted on a server of
// the test's own (a clock would fail on a loaded machine): a page's, not
// the backlog's.
func TestGetOrderStatusOfAForgedBacklog(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Dedicated(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	const prefix = "forged:"
	e := newEnvOn(t, rdb, prefix, nil)
	fields := []any{"n", "20000000", "d", "0"}
	for i := 1; i <= 60; i++ {
		fields = append(fields, "p:"+strconv.Itoa(i), "1700000000000 m ev-"+strconv.Itoa(i))
	}
	require.NoError(t, e.rdb.HSet(t.Context(), prefix+"lock:{SO50}:seq", fields...).Err())
	var r response
	calls := redistest.CallsDuring(t, rdb, func() { r = e.do(t, http.MethodGet, "/v1/orders/SO50/status", "", nil) })
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.LessOrEqual(t, calls.Total(), int64(2*orderview.DefaultMaxPositions), "a page's commands at most: %v", calls)
	var st orderview.Status
	r.decode(t, &st)
	assert.Len(t, st.Sequence.Waiting, orderview.DefaultMaxPositions)
	assert.Equal(t, int64(20000000-orderview.DefaultMaxPositions), st.Sequence.More)
	assert.Contains(t, st.Summary[1], "20,000,000 accepted change(s)")
}

// TestUnavailable points the server at a port nothing listens on: every
// route that needs Redis answers 503 with Retry-After, while requests that
// are wrong anyway still get their 4xx and /healthz its 200.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnvOn(t, closedRedis(t), "ow:", func(c *Config) { c.RetryAfter = 1500 * time.Millisecond })
	tests := []struct {
		method, path, body string
	}{
		{http.MethodGet, "/v1/orders/SO1", ""},
		{http.MethodGet, "/v1/orders/SO1/history", ""},
		{http.MethodGet, "/v1/orders/SO1/status", ""},
		{http.MethodGet, "/v1/blocked-orders", ""},
		{http.MethodGet, "/v1/tasks/evt-1", ""},
		{http.MethodGet, "/readyz", ""},
	}
	// Every kind's enqueue route, with the kind's example: valid, so only
	// Redis is missing.
	for _, k := range tasks.Kinds() {
		tests = append(tests, struct{ method, path, body string }{http.MethodPost, kindPath(k, "SO1"), kindBody(t, k)})
	}
	for _, tt := range tests {
		t.Run(tt.method+tt.path, func(t *testing.T) {
			r := e.do(t, tt.method, tt.path, tt.body, map[string]string{HeaderIdempotencyKey: "evt-1"})
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
			assert.Equal(t, "2", r.header.Get("Retry-After"))
			assert.Equal(t, codeUnavailable, r.errorBody(t).Error.Code)
		})
	}

	r := e.do(t, http.MethodGet, "/healthz", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.post(t, "/v1/orders/SO1/modify", "evt-1", `{"changes":{}}`)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)

	// The cause is logged, at warn.
	entries := e.logs.FilterField(zap.Int("status", http.StatusServiceUnavailable)).All()
	require.NotEmpty(t, entries)
	for _, en := range entries {
		assert.Equal(t, zapcore.WarnLevel, en.Level)
		assert.NotEmpty(t, en.ContextMap()["error"])
	}
}

// TestRedisDownAndBack stops a server of the test's own and starts it again.
func TestRedisDownAndBack(t *testing.T) {
	t.Parallel()
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnvOn(t, rdb, "ow:", nil)

	r := e.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.JSONEq(t, `{"status":"ready"}`, string(r.body))

	p.Kill()
	// /readyz keeps its answer for a second.
	require.Eventually(t, func() bool {
		r = e.do(t, http.MethodGet, "/readyz", "", nil)
		return r.status == http.StatusServiceUnavailable
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, "5", r.header.Get("Retry-After"))
	r = e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)

	require.NoError(t, p.Start())
	require.Eventually(t, func() bool {
		r = e.do(t, http.MethodGet, "/readyz", "", nil)
		return r.status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond)
	r = e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
}

func TestNotFoundAndMethodNotAllowed(t *testing.T) {
	t.Parallel()
	e := newEnvOn(t, closedRedis(t), "ow:", nil)

	r := e.do(t, http.MethodGet, "/v2/orders/SO1", "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	assert.Equal(t, codeNotFound, r.errorBody(t).Error.Code)

	r = e.do(t, http.MethodGet, "/v1/orders/SO1/modify", "", nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s", r.body)
	assert.Equal(t, "POST", r.header.Get("Allow"))
	assert.Equal(t, codeMethodNotAllowed, r.errorBody(t).Error.Code)

	r = e.do(t, http.MethodDelete, "/v1/orders/SO1", "", nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s", r.body)
	assert.Equal(t, "GET, HEAD", r.header.Get("Allow"))

	r = e.do(t, http.MethodHead, "/healthz", "", nil)
	require.Equal(t, http.StatusOK, r.status)
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	e := newEnvOn(t, closedRedis(t), "ow:", nil)

	r := e.do(t, http.MethodGet, "/healthz", "", map[string]string{HeaderRequestID: "req-42"})
	assert.Equal(t, "req-42", r.header.Get(HeaderRequestID))

	// A generated one is a UUID, and the error body carries it.
	r = e.do(t, http.MethodGet, "/v1/orders/SO.1", "", nil)
	id := r.header.Get(HeaderRequestID)
	_, err := uuid.Parse(id)
	require.NoError(t, err, id)
	assert.Equal(t, id, r.errorBody(t).Error.RequestID)

	// One that is unsafe to log is replaced.
	for _, bad := range []string{"a b", strings.Repeat("x", 129), "é"} {
		r = e.do(t, http.MethodGet, "/healthz", "", map[string]string{HeaderRequestID: bad})
		_, err := uuid.Parse(r.header.Get(HeaderRequestID))
		require.NoError(t, err, bad)
	}

	// The access log has it, with the route.
	entries := e.logs.FilterMessage("request").FilterField(zap.String("request_id", "req-42")).All()
	require.Len(t, entries, 1)
	fields := entries[0].ContextMap()
	assert.Equal(t, "GET /healthz", fields["route"])
	assert.Equal(t, int64(http.StatusOK), fields["status"])
	assert.Equal(t, zapcore.DebugLevel, entries[0].Level)
}

// The history is read in pages: limit and cursor, and the next_cursor of
// one page reads the next.
func TestHistoryPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 5 {
		require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO7", Address: fmt.Sprintf("%d Main St", i),
			Items: []tasks.Item{{SKU: "A", Qty: 1}}}))
	}
	var versions []int64
	path := "/v1/orders/SO7/history?limit=2"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		r := e.do(t, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var h orderview.History
		r.decode(t, &h)
		require.LessOrEqual(t, len(h.Entries), 2)
		for _, en := range h.Entries {
			versions = append(versions, en.Version)
		}
		if h.NextCursor == "" {
			break
		}
		path = "/v1/orders/SO7/history?limit=2&cursor=" + url.QueryEscape(h.NextCursor)
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5}, versions)
	// A cursor past the newest entry but within range is an empty last page.
	for _, past := range []string{"6", "9007199254740991"} {
		r := e.do(t, http.MethodGet, "/v1/orders/SO7/history?cursor="+past, "", nil)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", past, r.body)
		var h orderview.History
		r.decode(t, &h)
		require.Empty(t, h.Entries, past)
		require.Empty(t, h.NextCursor, past)
	}
	for _, bad := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=1001", "limit"}, {"limit=x", "limit"},
		{"cursor=abc", "cursor"}, {"cursor=-3", "cursor"},
		{"cursor=100000000000000000", "cursor"}, {"cursor=9007199254740992", "cursor"},
	} {
		r := e.do(t, http.MethodGet, "/v1/orders/SO7/history?"+bad.query, "", nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad.query, r.body)
		require.Equal(t, bad.field, r.errorBody(t).Error.Field)
	}
}

// GET /v1/blocked-orders, served as the intake's Redis user, lists an order
// whose sequence that user overwrote with a string as unreadable, and the
// other blocked orders as before: one bad key never fails the list.
func TestGetBlockedOrdersWithAWronglyTypedSequence(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...)
	e := newEnvOn(t, intake.Client, db.Prefix, func(c *Config) { c.BlockedAfter = time.Millisecond })
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(tasks.QueueModify, true) })
	orderviewtest.Later(t, db.Client, db.Prefix, "SO21", "SO22")
	orderviewtest.WrongTypeSeq(t, intake.Client, db.Prefix, "SO21")

	r := e.do(t, http.MethodGet, "/v1/blocked-orders", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var page orderview.BlockedPage
	r.decode(t, &page)
	require.Len(t, page.Orders, 2, "%s", r.body)
	assert.Equal(t, "SO22", page.Orders[0].OrderNo)
	assert.Equal(t, orderview.ReasonScheduled, page.Orders[0].Reason)
	assert.Equal(t, "SO21", page.Orders[1].OrderNo)
	assert.Equal(t, orderview.ReasonUnreadable, page.Orders[1].Reason)
	assert.Contains(t, page.Orders[1].Explanation, "WRONGTYPE")
	assert.Equal(t, 1, page.Counts[orderview.ReasonUnreadable])
}

// GET /v1/blocked-orders, over a real socket, lists an order whose next
// change fails, with its error and attempts; it pages and filters by
// reason, and refuses a bad query with the API's errors. The order
// numbered "blocked" stays readable at /v1/orders/blocked.
func TestGetBlockedOrders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BlockedAfter = time.Millisecond })
	s := orderviewtest.Build(t, e.rdb, e.db.Prefix, "SO1001")

	r := e.do(t, http.MethodGet, "/v1/blocked-orders", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var page orderview.BlockedPage
	r.decode(t, &page)
	require.Len(t, page.Orders, 1, "%s", r.body)
	b := page.Orders[0]
	assert.Equal(t, "SO1001", b.OrderNo)
	assert.Equal(t, orderview.ReasonFailing, b.Reason)
	require.NotNil(t, b.Failing)
	assert.Equal(t, s.Retried, b.Failing.TaskID)
	assert.Contains(t, b.Failing.LastError, orderviewtest.FailRetried)
	assert.Equal(t, 1, b.Failing.Retried)
	assert.Positive(t, b.AgeMS)
	assert.EqualValues(t, 1, page.BlockedAfterMS)
	assert.Equal(t, 1, page.Counts[orderview.ReasonFailing])

	r = e.do(t, http.MethodGet, "/v1/blocked-orders?reason=gap&limit=5", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"orders":[]`, "an empty list, not null")

	for _, q := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=1001", "limit"}, {"limit=x", "limit"}, {"reason=bored", "reason"}, {"cursor=nope", "cursor"},
	} {
		r = e.do(t, http.MethodGet, "/v1/blocked-orders?"+q.query, "", nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", q.query, r.body)
		assert.Equal(t, q.field, r.errorBody(t).Error.Field)
	}

	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "blocked", Address: "1 Main St", Items: []tasks.Item{{SKU: "A", Qty: 1}}}))
	r = e.do(t, http.MethodGet, "/v1/orders/blocked", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var o orders.Order
	r.decode(t, &o)
	assert.Equal(t, "blocked", o.No)
}

// GET /v1/orders/{no}/history and /status, served as the intake-admin
// user, read the entries that user (and the dashboard-write user) pushed
// into an order's notes list as notes, whatever they claim to be, and one
// that does not decode as an unreadable note: one bad note never fails the
// read (security review 2026-12-07, N4).
func TestForgedNotesReadAsNotes(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	as := func(p acl.Process) *redistest.DB {
		rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
		require.NoError(t, err)
		return db.AsUser(t, rules...)
	}
	admin := as(acl.IntakeAdmin)
	e := newEnvOn(t, admin.Client, db.Prefix, nil)
	worker, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, worker.Put(t.Context(), orders.Order{No: "SO20", Address: "20 Main St", Items: []tasks.Item{{SKU: "A", Qty: 1}}}))
	orderviewtest.ForgeNotes(t, admin.Client, db.Prefix, "SO20", 1)
	require.NoError(t, as(acl.DashboardWrite).Client.RPush(t.Context(), db.Prefix+"order:{SO20}:notes", "{").Err())

	r := e.do(t, http.MethodGet, "/v1/orders/SO20/history", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var h orderview.History
	r.decode(t, &h)
	var got []string
	for _, en := range h.Entries {
		got = append(got, en.Type+" "+en.Worker+" "+en.EventID+"|"+en.Detail)
	}
	assert.Equal(t, []string{
		"order:put  |put: active",
		"order:note " + orderviewtest.ForgedWorker + " |not written as a note (kind 'm'): a",
		"order:note admin#2 |hold by admin#2: customer asked to reroute",
		"order:note " + orderviewtest.ForgedWorker + " |not written as a note (order:modify): changed address to 1 Attacker Rd",
		`order:note  |unreadable note (1 byte): "{"`,
		`order:note  |unreadable note (1 byte): "{"`,
	}, got)

	r = e.do(t, http.MethodGet, "/v1/orders/SO20/status", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `unreadable note (1 byte)`)
	assert.NotContains(t, string(r.body), `"type":"order:modify"`)
	assert.NotContains(t, string(r.body), "crm-refund", "a note names no event, so no task")
}

// TestReadsBoundedByRequestTimeout points the server at a Redis that takes
// connections and never answers, with a Redis client that would wait 10 s
// for a reply: every read, the task's included (asynq's Inspector takes no
// context), is answered 503 once RequestTimeout has passed, not when the
// client gives up.
func TestReadsBoundedByRequestTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		ContextTimeoutEnabled: true}) // as redisconn makes every client
	t.Cleanup(func() { _ = rdb.Close() })
	const timeout = 300 * time.Millisecond
	e := newEnvOn(t, rdb, "ow:", func(c *Config) { c.RequestTimeout = timeout })
	for _, path := range []string{"/v1/orders/SO1", "/v1/tasks/evt-1", "/v1/tasks/evt-1?queue=order_modify"} {
		t.Run(path, func(t *testing.T) {
			start := time.Now()
			r := e.do(t, http.MethodGet, path, "", nil)
			took := time.Since(start)
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
			assert.Equal(t, codeUnavailable, r.errorBody(t).Error.Code)
			assert.Less(t, took, timeout+3*time.Second, "answered after INTAKE_REQUEST_TIMEOUT, not the Redis client's read timeout")
		})
	}
}
