package main

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// TestQueueGaugesSurviveGhosts plants what review N2 planted, as the
// intake's Redis user: a ghost a year ahead in order_modify's scheduled
// set, one in its retry set, one in its pending list, and a queue of
// asynq's set of queues outside the deployment with a ghost of its own.
// asynq's collector then lost every queue's gauges; the dashboard, as its
// read-only Redis user, still serves every queue's.
func TestQueueGaugesSurviveGhosts(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db) // evt-1001 and evt-1002 pending in order_modify
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...).Client
	ctx := t.Context()
	year := float64(time.Now().Add(365 * 24 * time.Hour).Unix())
	require.NoError(t, intake.ZAdd(ctx, asynqredis.ScheduledKey(queue), redis.Z{Score: year, Member: "ghost-1"}).Err())
	require.NoError(t, intake.ZAdd(ctx, asynqredis.RetryKey(queue), redis.Z{Score: year, Member: "ghost-2"}).Err())
	require.NoError(t, intake.LPush(ctx, asynqredis.PendingKey(queue), "ghost-3").Err())
	require.NoError(t, intake.SAdd(ctx, asynqredis.AllQueues, "order_zz").Err())
	require.NoError(t, intake.LPush(ctx, asynqredis.PendingKey("order_zz"), "z-1").Err())
	t.Cleanup(func() {
		_ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue("order_zz", true)
		db.Client.Del(context.Background(), asynqredis.PendingKey("order_zz"))
		db.Client.SRem(context.Background(), asynqredis.AllQueues, "order_zz")
	})
	_, err = asynq.NewInspectorFromRedisClient(db.Client).GetQueueInfo(queue)
	require.Error(t, err, "asynq's Inspector fails on the ghosts: the test plants what breaks its collector")

	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix))
	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	for _, want := range []string{
		`asynq_tasks_enqueued_total{queue="order_modify",state="pending"} 3`,
		`asynq_tasks_enqueued_total{queue="order_modify",state="scheduled"} 1`,
		`asynq_tasks_enqueued_total{queue="order_modify",state="retry"} 1`,
		`asynq_queue_size{queue="order_modify"} 5`,
		`orderworker_queue_gauges_up{queue="order_modify"} 1`,
		`orderworker_queue_ghosts_sampled{queue="order_modify"} 3`,
	} {
		assert.Contains(t, r.body, want)
	}
	for _, q := range (tasks.Shards{}).AllQueues(tasks.Kinds()) {
		assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="`+q+`",state="pending"} `, q)
		assert.Contains(t, r.body, `asynq_queue_latency_seconds{queue="`+q+`"} `, q)
		assert.Contains(t, r.body, `asynq_queue_memory_usage_approx_bytes{queue="`+q+`"} `, q)
		assert.Contains(t, r.body, `orderworker_queue_gauges_up{queue="`+q+`"} 1`, q)
	}
	assert.NotContains(t, r.body, "order_zz", "a queue outside the deployment adds no series")
	requireNoRefusal(t, d.logs.String())
}

// TestQueueGaugesOneQueueFails breaks one queue's read (a key of the
// wrong type where its pending list is, which only a Redis user with more
// rights than the intake's can write): that queue's gauges are absent and
// its up gauge is 0, and the other queue's are served.
func TestQueueGaugesOneQueueFails(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	ctx := t.Context()
	require.NoError(t, db.Client.Set(ctx, asynqredis.PendingKey(tasks.QueueExchange), "not a list", 0).Err())
	t.Cleanup(func() { db.Client.Del(context.Background(), asynqredis.PendingKey(tasks.QueueExchange)) })

	d := startDashboard(t, testEnv(db))
	r := d.get(t, "/metrics", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `asynq_tasks_enqueued_total{queue="order_modify",state="pending"} 2`)
	assert.Contains(t, r.body, `orderworker_queue_gauges_up{queue="order_modify"} 1`)
	assert.Contains(t, r.body, `orderworker_queue_gauges_up{queue="order_exchange"} 0`)
	assert.NotContains(t, r.body, `asynq_queue_size{queue="order_exchange"}`)
	assert.Contains(t, d.logs.String(), "could not read a queue for the metrics")
}

// kindQueue is the label expression the autoscalers select the queues
// by (deploy/kubernetes/overlays/keda/scaledobject.yaml and the HPA's
// adapter rule; deploy/kubernetes/check holds them to it).
var kindQueue = regexp.MustCompile(`^order_[^:]+(:[0-9]+)?$`)

// scalerPending is what the autoscalers' query reads from a scrape: the
// pending gauge summed over every queue kindQueue matches, as
// sum(asynq_tasks_enqueued_total{queue=~"…",state="pending"}) does.
func scalerPending(t *testing.T, body string) int {
	t.Helper()
	line := regexp.MustCompile(`(?m)^asynq_tasks_enqueued_total\{queue="([^"]+)",state="pending"\} (\d+)$`)
	sum, seen := 0, 0
	for _, m := range line.FindAllStringSubmatch(body, -1) {
		if !kindQueue.MatchString(m[1]) {
			continue
		}
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		sum += n
		seen++
	}
	require.Positive(t, seen, "the scrape has no pending gauge of a kind's queue")
	return sum
}

// TestPendingCountsRunnableOrders floods one order with 200 changes
// through the producer, with no worker running, and reads the dashboard's
// scrape as the autoscalers do: only the order's head is pending (one
// order that can run: one change a worker may take), and the 199 behind it
// are parked in the queue's retry set, out of the scaling metric, which the
// backlog gauges count: one order backlogged, 199 changes parked, 199 the
// deepest. A change of a second order adds one to the metric and nothing
// to the backlog (a head alone waits behind nothing).
func TestPendingCountsRunnableOrders(t *testing.T) {
	db := redistest.New(t)
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(db.Client)
		for _, k := range tasks.Kinds() {
			_ = insp.DeleteQueue(k.Queue, true)
		}
	})
	const flood = 200
	for i := range flood {
		_, err := p.EnqueueModify(t.Context(), "SO-FLOOD", tasks.Changes{Remark: new(fmt.Sprintf("change %d", i))})
		require.NoError(t, err)
	}
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix))
	scrape := func() string {
		t.Helper()
		r := d.get(t, "/metrics", bearerAuth(testMetricsToken))
		require.Equal(t, http.StatusOK, r.status, r.body)
		return r.body
	}
	body := scrape()
	assert.Equal(t, 1, scalerPending(t, body), "a flood of one order is one order that can run")
	assert.Contains(t, body, `asynq_tasks_enqueued_total{queue="order_modify",state="pending"} 1`)
	assert.Contains(t, body, `asynq_tasks_enqueued_total{queue="order_modify",state="retry"} 199`, "the changes behind the head are parked")
	for _, want := range []string{"orderworker_backlog_up 1", "orderworker_orders_backlogged 1", "orderworker_changes_parked 199", "orderworker_backlog_deepest 199"} {
		assert.Contains(t, body, want+"\n")
	}

	_, err = p.EnqueueModify(t.Context(), "SO-OTHER", tasks.Changes{Remark: new("one change")})
	require.NoError(t, err)
	body = scrape()
	assert.Equal(t, 2, scalerPending(t, body), "a second order adds one order that can run")
	assert.Contains(t, body, `asynq_tasks_enqueued_total{queue="order_modify",state="retry"} 199`)
	for _, want := range []string{"orderworker_orders_backlogged 1", "orderworker_changes_parked 199", "orderworker_backlog_deepest 199"} {
		assert.Contains(t, body, want+"\n")
	}
	requireNoRefusal(t, d.logs.String())
}
