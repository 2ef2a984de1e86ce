package main

import (
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
	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// The tests in this file run the dashboard as a Redis user with the
// production rules of its mode (package acl, `producer acl dashboard` and
// `dashboard-write`).

// asDashboard returns db as a new Redis user with process p's rules for
// db's prefix.
func asDashboard(t *testing.T, db *redistest.DB, p acl.Process) *redistest.DB {
	t.Helper()
	rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	return db.AsUser(t, rules...)
}

// requireNoRefusal fails when the dashboard's log says that Redis refused
// it something.
func requireNoRefusal(t *testing.T, logs string) {
	t.Helper()
	for _, refused := range []string{"NOPERM", "no permissions", "can't access"} {
		require.NotContains(t, logs, refused)
	}
}

// TestReadOnlyDashboardAsItsACLUser serves every GET route of asynqmon's
// API (read from its source), the order page and the metrics, on tasks in
// every state, as the read-only dashboard's user: asynq's Inspector reads
// through scripts, and prunes the server lists as it reads them.
func TestReadOnlyDashboardAsItsACLUser(t *testing.T) {
	db := redistest.New(t)
	sc := orderviewtest.Build(t, db.Client, db.Prefix, "SO77")
	enqueueOrders(t, db) // evt-1001 and evt-1002 pending; deletes the queue at the end
	_, err := asynq.NewClientFromRedisClient(db.Client).EnqueueContext(t.Context(), asynq.NewTask("order:modify", orderPayload("evt-later", "SO1003")),
		asynq.Queue(queue), asynq.TaskID("evt-later"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	ro := asDashboard(t, db, acl.Dashboard)
	d := startDashboard(t, testEnv(ro, "KEY_PREFIX", db.Prefix))
	basic := basicAuth(testUser, testPassword)
	get := func(path string) response {
		t.Helper()
		r := d.get(t, path, basic)
		assert.Less(t, r.status, 500, "%s: %s", path, r.body)
		return r
	}
	n := 0
	for _, rt := range asynqmonRoutes(t) {
		if rt.method != http.MethodGet || rt.path == "/metrics" { // /api/metrics asks Prometheus, not Redis
			continue
		}
		path := strings.NewReplacer("{qname}", queue, "{task_id}", "evt-1001", "{gname}", "g1", "{entry_id}", "e1").Replace(rt.path)
		r := get("/api" + path)
		assert.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
		n++
	}
	require.Greater(t, n, 15, "asynqmon's GET routes")
	for _, id := range []string{sc.Applied, sc.Archived, sc.Retried, sc.Parked, "evt-later"} {
		r := get("/api/queues/" + queue + "/tasks/" + id)
		assert.Equal(t, http.StatusOK, r.status, "task %s: %s", id, r.body)
	}
	r := get("/orders/" + sc.OrderNo)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, sc.Retried)
	r = d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+queue+`",state="pending"} 2`)
	requireNoRefusal(t, d.logs.String())
	require.NotContains(t, d.logs.String(), ro.Password())
}

// TestWritableDashboardNeedsTheWriteUser turns the UI's writes on: as the
// read-only dashboard's user each one is refused by Redis and changes
// nothing, so the user alone keeps a read-only dashboard read-only; as the
// writing dashboard's user they act.
func TestWritableDashboardNeedsTheWriteUser(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	basic := basicAuth(testUser, testPassword)
	writes := []struct {
		method, path string
		after        bool // acts on what the write before did
	}{
		{http.MethodPost, "/api/queues/" + queue + "/pending_tasks/evt-1001:archive", false},
		{http.MethodPost, "/api/queues/" + queue + "/archived_tasks/evt-1001:run", true},
		{http.MethodDelete, "/api/queues/" + queue + "/pending_tasks/evt-1002", false},
		{http.MethodPost, "/api/queues/" + queue + ":pause", false},
		{http.MethodPost, "/api/queues/" + queue + ":resume", true},
		{http.MethodPost, "/api/queues/" + queue + "/active_tasks/evt-1001:cancel", false},
	}

	ro := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "DASHBOARD_READ_ONLY", "false", "KEY_PREFIX", db.Prefix))
	for _, w := range writes {
		r := ro.do(t, w.method, w.path, basic)
		assert.GreaterOrEqual(t, r.status, 400, "%s %s as the read-only user: %s", w.method, w.path, r.body)
		if !w.after {
			assert.True(t, strings.Contains(r.body, "NOPERM") || strings.Contains(r.body, "can't access"), "Redis refused it: %s", r.body)
		}
	}
	info, err := insp.GetQueueInfo(queue)
	require.NoError(t, err)
	assert.Equal(t, 2, info.Pending, "nothing archived or deleted")
	assert.Zero(t, info.Archived)
	assert.False(t, info.Paused)

	rw := startDashboard(t, testEnv(asDashboard(t, db, acl.DashboardWrite), "DASHBOARD_READ_ONLY", "false", "KEY_PREFIX", db.Prefix))
	for i, w := range writes {
		r := rw.do(t, w.method, w.path, basic)
		require.Equal(t, http.StatusNoContent, r.status, "%s %s as the writing user: %s", w.method, w.path, r.body)
		if i == 0 {
			info, err := insp.GetTaskInfo(queue, "evt-1001")
			require.NoError(t, err)
			assert.Equal(t, asynq.TaskStateArchived, info.State)
		}
	}
	info, err = insp.GetQueueInfo(queue)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Pending, "evt-1001 archived and run again, evt-1002 deleted")
	assert.False(t, info.Paused)
	requireNoRefusal(t, rw.logs.String())
}

// TestBlockedGaugesAsItsACLUser scrapes the blocked-order gauges and reads
// the blocked-orders page's data as the read-only dashboard's user: an
// order whose next change keeps failing is counted as failing, every other
// reason is 0, and no label names an order; the page lists the order with
// its last error and links.
func TestBlockedGaugesAsItsACLUser(t *testing.T) {
	db := redistest.New(t)
	sc := orderviewtest.Build(t, db.Client, db.Prefix, "SO77")
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true) })
	ro := asDashboard(t, db, acl.Dashboard)
	d := startDashboard(t, testEnv(ro, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))

	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `orderworker_orders_blocked{reason="failing"} 1`)
	for _, reason := range []string{"gap", "lock_stale", "creation", "scheduled", "held", "waiting"} {
		assert.Contains(t, r.body, `orderworker_orders_blocked{reason="`+reason+`"} 0`)
	}
	assert.Regexp(t, `orderworker_oldest_blocked_order_age_seconds [0-9.e+-]+\n`, r.body)
	assert.NotContains(t, r.body, "SO77", "no label names an order")

	r = d.get(t, "/blocked-orders", basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, r.body)
	v := getBlocked(t, d, "/blocked-orders.json")
	require.Len(t, v.Orders, 1, "%+v", v)
	b := v.Orders[0]
	assert.Equal(t, "SO77", b.OrderNo)
	assert.Equal(t, "failing", b.Reason)
	assert.Equal(t, "/orders/SO77", b.OrderURL)
	assert.Equal(t, "/queues/order_modify/tasks/"+sc.Retried, b.TaskURL)
	assert.Equal(t, "/queues/order_modify?status=retry", b.StateURL)
	require.NotNil(t, b.Failing)
	assert.Equal(t, orderviewtest.FailRetried, b.Failing.LastError)
	assert.Equal(t, 1, b.Failing.Retried)
	assert.Contains(t, b.Explanation, "Its next change, task "+sc.Retried+", failed 1 time(s)")
	assert.EqualValues(t, 2, b.Waiting, "the failing change and the one parked behind it")
	requireNoRefusal(t, d.logs.String())
}

// TestBlockedGaugesPastGhosts puts 2,001 members that name no task
// (ghosts) in the retry set before a failing order's changes, as the
// intake's Redis user may: as the read-only dashboard's user, the order is
// still counted as failing, orderworker_blocked_read_ghosts says 2001 and
// orderworker_orders_blocked_truncated 0. With 20,000 more, past the
// read's bound of ten times BLOCKED_SCAN members, the read is truncated
// and the gauge says 1.
func TestBlockedGaugesPastGhosts(t *testing.T) {
	db := redistest.New(t)
	sc := orderviewtest.Build(t, db.Client, db.Prefix, "SO78")
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true) })
	intake := asDashboard(t, db, acl.Intake)
	ctx := t.Context()
	retry := asynqredis.RetryKey(queue)
	due, err := db.Client.ZScore(ctx, retry, sc.Retried).Result()
	require.NoError(t, err)
	ghosts := func(from, n int) {
		t.Helper()
		zs := make([]redis.Z, n)
		for i := range zs {
			zs[i] = redis.Z{Score: due - 3, Member: "fake-" + strconv.Itoa(from+i)}
		}
		require.NoError(t, intake.Client.ZAdd(ctx, retry, zs...).Err())
	}
	ghosts(0, 2001)
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))

	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `orderworker_orders_blocked{reason="failing"} 1`)
	assert.Contains(t, r.body, "orderworker_orders_blocked_truncated 0\n")
	assert.Contains(t, r.body, "orderworker_blocked_read_ghosts 2001\n")

	ghosts(2001, 20000)
	r = d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, "orderworker_orders_blocked_up 1\n")
	assert.Contains(t, r.body, "orderworker_orders_blocked_truncated 1\n")
	requireNoRefusal(t, d.logs.String())
}

// TestBlockedSurvivesAWronglyTypedSequence overwrites an order's sequence
// with a string, as the intake's Redis user may: as the read-only
// dashboard's user, the blocked-orders page and its data list that order
// as unreadable and the others as before, and /metrics answers 200 with
// asynq's queue gauges, the blocked gauges counting it as unreadable.
func TestBlockedSurvivesAWronglyTypedSequence(t *testing.T) {
	db := redistest.New(t)
	orderviewtest.Later(t, db.Client, db.Prefix, "SO21", "SO22")
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true) })
	orderviewtest.WrongTypeSeq(t, asDashboard(t, db, acl.Intake).Client, db.Prefix, "SO21")
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))

	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+queue+`",state="scheduled"} 2`)
	assert.Contains(t, r.body, `orderworker_orders_blocked{reason="unreadable"} 1`)
	assert.Contains(t, r.body, `orderworker_orders_blocked{reason="scheduled"} 1`)
	assert.Contains(t, r.body, "orderworker_orders_blocked_up 1\n")

	r = d.get(t, "/blocked-orders", basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, r.body)
	v := getBlocked(t, d, "/blocked-orders.json")
	require.Equal(t, []string{"SO22", "SO21"}, orderNos(v), "oldest first: an unreadable order has no age; %+v", v)
	assert.Equal(t, "scheduled", v.Orders[0].Reason)
	assert.Equal(t, "unreadable", v.Orders[1].Reason)
	assert.Contains(t, v.Orders[1].Explanation, "WRONGTYPE")
	requireNoRefusal(t, d.logs.String())
}

// TestMetricsSurviveAFailedBlockedRead breaks the read of the whole
// blocked-orders list (the index of held orders is a string): /metrics
// still answers 200 with asynq's queue gauges, says the read failed with
// orderworker_orders_blocked_up 0, and sends no blocked gauge (no zero
// that would clear an alert).
func TestMetricsSurviveAFailedBlockedRead(t *testing.T) {
	db := redistest.New(t)
	orderviewtest.Later(t, db.Client, db.Prefix, "SO21")
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true) })
	require.NoError(t, db.Client.Set(t.Context(), db.Prefix+"lock:held", "x", 0).Err())
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))

	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+queue+`",state="scheduled"} 1`)
	assert.Contains(t, r.body, "orderworker_orders_blocked_up 0\n")
	assert.NotContains(t, r.body, "orderworker_orders_blocked{")
	assert.NotContains(t, r.body, "orderworker_oldest_blocked_order_age_seconds ")
	assert.Contains(t, d.logs.String(), "could not read the blocked orders for the metrics")
}
