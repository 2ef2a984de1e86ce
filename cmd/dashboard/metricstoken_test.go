package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// TestMetricsTokenOpensOnlyMetrics runs a writable dashboard, as the
// writing dashboard's Redis user, and tries the metrics token (review N6)
// over a real socket on every route of asynqmon's API (read from its
// source, every method), its pages, the order and blocked-orders pages and
// the operator actions: each is refused, and nothing changes. /metrics
// takes it, recorded as metrics#1, and still takes the UI's credentials.
func TestMetricsTokenOpensOnlyMetrics(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.DashboardWrite), "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false"))
	scraper := bearerAuth(testMetricsToken)
	// The tries come from an address of their own, whose refusals the
	// throttle counts; the checks after them from the default one.
	from := clientFrom(t, "127.0.0.5")
	before := pending(t, d)

	refused := func(method, path string, extra ...func(*http.Request)) {
		t.Helper()
		r := d.doWith(t, from, method, path, scraper, extra...)
		// 401, or 429 once the refusals have used the client's tries.
		assert.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, r.status, "%s %s: %s", method, path, r.body)
		assert.NotContains(t, r.body, "SO1001", "%s %s", method, path)
	}
	n := 0
	for _, rt := range asynqmonRoutes(t) {
		path := strings.NewReplacer("{qname}", queue, "{task_id}", "evt-1001", "{gname}", "g1", "{entry_id}", "e1").Replace(rt.path)
		refused(rt.method, "/api"+path)
		n++
	}
	require.Greater(t, n, 30, "asynqmon's routes")
	for _, p := range []string{"/", "/queues/" + queue, "/orders", "/orders/SO1001", "/blocked-orders", "/blocked-orders.json", "/blocked-orders.js"} {
		refused(http.MethodGet, p)
	}
	for _, a := range []string{"hold", "retry", "skip", "resume"} {
		refused(http.MethodPost, "/orders/SO1001/actions/"+a, withReason("done with the scrape token"))
	}

	// Nothing changed: the tasks are there, the order is not held.
	assert.Equal(t, before, pending(t, d))
	r := d.get(t, "/orders/SO1001", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.NotContains(t, r.body, "done with the scrape token")

	r = d.doWith(t, from, http.MethodGet, "/metrics", scraper)
	require.Equal(t, http.StatusOK, r.status, "the metrics' throttle is not the UI's: %s", r.body)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+queue+`",state="pending"} `+strconv.Itoa(before))
	assert.Equal(t, http.StatusOK, d.get(t, "/metrics", bearerAuth(testToken)).status)
	assert.Equal(t, http.StatusOK, d.get(t, "/metrics", basicAuth(testUser, testPassword)).status)
	assert.Equal(t, http.StatusUnauthorized, d.get(t, "/metrics", bearerAuth("met-wrong-0123456789abcdef")).status)
	logs := d.logs.String()
	assert.Contains(t, logs, `"path":"/metrics","route":"GET /metrics","status":200`)
	assert.Contains(t, logs, `"principal":"metrics#1"`)
	requireNoSecrets(t, logs)
}
