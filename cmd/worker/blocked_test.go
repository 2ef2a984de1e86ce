package main

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// A worker process SIGKILLed while its task holds an order leaves the
// order blocked by a holder that is gone: once asynq's lease of the task
// has ended, the blocked list names it lock_stale, with the task, its
// queue and when its lease ended, and the change behind it waits. No other
// worker runs, so nothing takes the task back meanwhile.
func TestKilledHolderShowsInTheBlockedList(t *testing.T) {
	t.Parallel()
	bin := buildWorker(t)
	db := redistest.New(t)
	db.RequireProcess(t, "worker processes share the Redis")
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	const no = "SO-GONE"
	require.NoError(t, store.Put(t.Context(), orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

	doomed := startWorker(t, bin, "REDIS_URL="+db.URL(), "KEY_PREFIX="+db.Prefix, "OPS_ADDR=off", "LOG_FORMAT=console",
		"WORKER_SIMULATE_WORK=10m")
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	_, err = p.EnqueueModify(t.Context(), no, tasks.Changes{Address: new("first")}, producer.WithEventID("ev-gone"))
	require.NoError(t, err)
	lockKey := db.Prefix + "lock:{" + no + "}"
	require.Eventually(t, func() bool { return db.Client.Exists(t.Context(), lockKey).Val() == 1 },
		30*time.Second, 5*time.Millisecond, "the task never took its lock")
	_, err = p.EnqueueModify(t.Context(), no, tasks.Changes{Address: new("second")}, producer.WithEventID("ev-behind"))
	require.NoError(t, err)
	require.NoError(t, doomed.Process.Kill())
	_ = doomed.Wait()
	killed := time.Now()

	views, err := orderview.New(db.Client, store, orderview.Config{KeyPrefix: db.Prefix, BlockedAfter: time.Second})
	require.NoError(t, err)
	var got orderview.BlockedOrder
	// asynq's lease of an active task ends 30 s after its worker's last
	// heartbeat: the list sees the holder gone only then.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		page, err := views.Blocked(t.Context(), orderview.BlockedQuery{})
		if !assert.NoError(c, err) {
			return
		}
		for _, b := range page.Orders {
			if b.OrderNo == no {
				got = b
			}
		}
		assert.Equal(c, orderview.ReasonLockStale, got.Reason, "%+v", got)
	}, 90*time.Second, 500*time.Millisecond)
	require.NotNil(t, got.Lock)
	assert.Equal(t, "ev-gone", got.Lock.TaskID)
	assert.Equal(t, tasks.QueueModify, got.Lock.Queue)
	assert.Equal(t, "active", got.Lock.TaskState)
	assert.False(t, got.Lock.LeaseEndedAt.IsZero())
	assert.EqualValues(t, 2, got.Waiting, "the head and the change behind it")
	assert.Positive(t, got.AgeMS)
	assert.NotEmpty(t, got.Explanation)
	t.Logf("listed as lock_stale %v after the kill: %s", time.Since(killed).Round(time.Second), got.Explanation)
}
