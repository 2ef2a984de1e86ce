package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// TestShardsOnCluster runs the worker binary's run with QUEUE_SHARDS=3 on
// the local 3-master Cluster, as docs/scaling.md's sizing advises: the 3 shard
// queues of each type sit on the 3 masters (checked with CLUSTER KEYSLOT),
// orders on every master and in every shard get a run of changes each
// through a producer with the same setting, every change applies in its
// order's sequence, every shard is served, and the worker's metrics show
// the shards.
func TestShardsOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	const setting = "3"
	shards, err := tasks.ParseShards(setting)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	for _, k := range tasks.Kinds() {
		var masters []string
		for _, q := range k.ShardQueues(3) {
			key := "asynq:{" + q + "}:pending"
			slot, err := db.Client.ClusterKeySlot(ctx, key).Result()
			require.NoError(t, err)
			require.EqualValues(t, redisproc.Slot(key), slot, "%s: the server's slot is the one MasterOf uses", key)
			masters = append(masters, db.Cluster.MasterOf(key))
			t.Logf("%s: slot %d on %s", q, slot, db.Cluster.MasterOf(key))
		}
		slices.Sort(masters)
		require.Len(t, slices.Compact(masters), 3, "%s's shards on 3 masters", k.Type)
	}

	// Orders on every master (their keys) and in every shard (their
	// tasks): the first of SH0, SH1, ... of each (master, shard) pair.
	var nos []string
	seen := map[string]bool{}
	for i := 0; len(nos) < 9 && i < 10_000; i++ {
		no := "SH" + strconv.Itoa(i)
		pair := db.Cluster.MasterOf("{"+no+"}") + "/" + strconv.Itoa(tasks.ShardOf(no, 3))
		if !seen[pair] {
			seen[pair] = true
			nos = append(nos, no)
		}
	}
	require.Len(t, nos, 9)

	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	for _, no := range nos {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	defer func() {
		for _, q := range shards.AllQueues(tasks.Kinds()) {
			_ = insp.DeleteQueue(q, true)
		}
	}()

	ops := freeAddr(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": ops, "QUEUE_SHARDS": setting}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs lockedBuffer
	go func() {
		done <- runLogTo(runCtx, []string{"-concurrency", "8"}, func(k string) string { return env[k] }, &logs)
	}()
	defer func() {
		stop()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("run did not return after cancel")
		}
	}()

	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, Shards: shards})
	require.NoError(t, err)
	defer p.Close()
	const each = 8
	for i := range each {
		for _, no := range nos {
			res, err := p.EnqueueModify(ctx, no, tasks.Changes{Address: new(fmt.Sprintf("%s #%d", no, i))})
			require.NoError(t, err)
			require.Equal(t, tasks.Modify.QueueFor(no, 3), res.Queue)
		}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, no := range nos {
			o, err := store.Get(ctx, no)
			if assert.NoError(c, err) {
				assert.Equal(c, fmt.Sprintf("%s #%d", no, each-1), o.Address, "last word last")
			}
		}
	}, time.Minute, 20*time.Millisecond)

	for _, no := range nos {
		hist, err := orders.AllHistory(ctx, store, no)
		require.NoError(t, err)
		require.Len(t, hist, each+1, "%s: the put and every change once", no)
		var last int64
		for _, h := range hist[1:] {
			require.Greater(t, h.Seq, last, "%s: %s applied out of its sequence", no, h.EventID)
			last = h.Seq
		}
	}
	for _, q := range tasks.Modify.ShardQueues(3) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			info, err := insp.GetQueueInfo(q)
			if assert.NoError(c, err) {
				assert.Equal(c, 3*each, info.Completed, "%s served: 3 orders of %d changes", q, each)
				assert.Zero(c, info.Archived, q)
			}
		}, 10*time.Second, 20*time.Millisecond)
	}

	resp, err := http.Get("http://" + ops + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, q := range tasks.Modify.ShardQueues(3) {
		assert.Contains(t, string(b), `orderworker_task_duration_seconds_count{outcome="ok",queue="`+q+`",task_type="order:modify"}`)
	}
	assert.NotContains(t, string(b), `queue="order_modify"`, "the unsharded queue is not served")
	require.True(t, strings.Contains(logs.String(), `"order_modify:2":3`), "the start-up line lists the shard queues with their weights")
}
