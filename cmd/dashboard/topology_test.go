package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The tests in this file run the dashboard on a real Redis Cluster and a
// real Sentinel group, given nothing but REDIS_URL and KEY_PREFIX: /readyz,
// asynqmon's queue list and Redis info page, the queue metrics, and the
// order page.

// The dashboard runs as an ACL user with the read-only dashboard's rules
// (package acl, what `producer acl dashboard` prints): everything it shows
// read, nothing dangerous but INFO and the cluster view.
const (
	aclUser     = "ow-dashboard"
	aclPassword = "dashboard-acl-secret-0123"
)

func aclRules(t *testing.T, prefix string) []string {
	t.Helper()
	rules, err := acl.Rules(acl.Dashboard, acl.Options{KeyPrefix: prefix})
	require.NoError(t, err)
	return append([]string{"reset", "on", ">" + aclPassword}, rules...)
}

// dashboardOn enqueues two tasks through adminURL, and an order change
// under prefix, and runs the dashboard on url.
func dashboardOn(t *testing.T, adminURL, url, prefix string, cluster bool) {
	t.Helper()
	o, err := redisconn.Parse(adminURL)
	require.NoError(t, err)
	rdb := o.NewClient()
	defer rdb.Close()
	enqueueOn(t, rdb)
	defer func() { _ = asynq.NewInspectorFromRedisClient(rdb).DeleteQueue(queue, true) }()
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO3001", Address: "1 Main St", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))
	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.EnqueueModify(t.Context(), "SO3001", tasks.Changes{Remark: new("ring twice")}, producer.WithEventID("crm-3001"))
	require.NoError(t, err)

	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix, "DASHBOARD_USER": testUser, "DASHBOARD_PASSWORD": testPassword, "DASHBOARD_TOKENS": testToken}
	d := startDashboard(t, env)
	admin := basicAuth(testUser, testPassword)

	r := d.get(t, "/readyz", noAuth)
	require.Equal(t, http.StatusOK, r.status, r.body)

	r = d.get(t, "/api/queues", admin)
	require.Equal(t, http.StatusOK, r.status, r.body)
	var qs struct {
		Queues []struct {
			Queue   string `json:"queue"`
			Pending int    `json:"pending"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &qs))
	require.Len(t, qs.Queues, 1, r.body)
	assert.Equal(t, queue, qs.Queues[0].Queue)
	assert.Equal(t, 3, qs.Queues[0].Pending, "two tasks and the order change")

	r = d.get(t, "/api/redis_info", admin)
	require.Equal(t, http.StatusOK, r.status, r.body)
	var info struct {
		Cluster bool `json:"cluster"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &info))
	assert.Equal(t, cluster, info.Cluster, "asynqmon's Redis info page knows the topology")

	r = d.get(t, "/orders/SO3001", admin)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, "SO3001 is active, version 1")
	assert.Contains(t, r.body, `href="/queues/order_modify/tasks/crm-3001">crm-3001</a>`)
	assert.Contains(t, r.body, "its turn: asynq runs it as soon as a worker is free")

	r = d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+queue+`",state="pending"} 3`)
	requireNoSecrets(t, d.logs.String())
	require.NotContains(t, d.logs.String(), aclPassword)
	requireNoRefusal(t, d.logs.String())
}

// enqueueOn puts two order:modify tasks in the order_modify queue through
// rdb.
func enqueueOn(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(rdb)
	for _, o := range []struct{ event, order string }{{"evt-1001", "SO1001"}, {"evt-1002", "SO1002"}} {
		_, err := client.EnqueueContext(t.Context(), asynq.NewTask("order:modify", orderPayload(o.event, o.order)),
			asynq.Queue(queue), asynq.TaskID(o.event))
		require.NoError(t, err)
	}
}

func TestDashboardOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	require.NoError(t, db.Cluster.SetUser(t.Context(), aclUser, aclRules(t, db.Prefix)...))
	dashboardOn(t, db.URL(), strings.Replace(db.URL(), "redis://", "redis://"+aclUser+":"+aclPassword+"@", 1), db.Prefix, true)
}

func TestDashboardOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	require.NoError(t, db.Group.SetUser(t.Context(), aclUser, aclRules(t, db.Prefix)...))
	dashboardOn(t, db.URL(), db.URL()+"&username="+aclUser+"&password="+aclPassword, db.Prefix, false)
}
