package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// TestHTTPStoreAfterALaggedFailover plays a Sentinel failover after
// replication lag, with the HTTP store: the old master handed out
// positions and fences, and its workers applied them upstream, that the
// promoted replica never received; and the promoted replica's clock is a
// minute behind. The changes accepted after the switch get those positions
// again and fences below the upstream's. None may be archived as passed or
// wait for the clock: each is applied at once, above what the upstream has,
// in the order of acceptance.
func TestHTTPStoreAfterALaggedFailover(t *testing.T) {
	db := redistest.New(t)
	api := newOrderAPI(t, db)
	ctx := t.Context()
	const no = "SO-LAG"
	require.NoError(t, api.oracle.Put(ctx, orders.Order{No: no, Address: "a0", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

	env := map[string]string{
		"REDIS_URL":           asProcess(t, db, acl.Worker, true).URL(),
		"KEY_PREFIX":          db.Prefix,
		"OPS_ADDR":            "off",
		"ORDER_STORE":         "http",
		"ORDER_API_URL":       api.APIURL(),
		"TOKEN_URL":           api.TokenURL(),
		"TOKEN_CLIENT_ID":     upstreamtest.ClientID,
		"TOKEN_CLIENT_SECRET": upstreamtest.ClientSecret,
	}
	var logs lockedBuffer
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runLogTo(runCtx, nil, func(k string) string { return env[k] }, &logs) }()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	modify := func(i int) producer.Result {
		t.Helper()
		res, err := p.EnqueueModify(ctx, no, tasks.Changes{Address: new("a" + strconv.Itoa(i))},
			producer.WithEventID(fmt.Sprintf("lag-%d", i)), producer.WithMaxRetry(0))
		require.NoError(t, err)
		return res
	}
	applied := func(addr string) {
		t.Helper()
		require.Eventually(t, func() bool {
			o, err := api.oracle.Get(ctx, no)
			return err == nil && o.Address == addr
			// Well below GAP_WAIT (30 s): a change parked behind one
			// that never passes its turn on fails the test.
		}, 20*time.Second, 5*time.Millisecond, "the order never reached address %s", addr)
	}

	first := modify(1)
	applied("a1")
	// The store write comes before the turn passes on: wait for that too,
	// or the replica's copy has the first change's turn not passed, with
	// its task completed (a state no single master replicates), and the
	// changes after the switch wait GAP_WAIT for it.
	seqKey, fenceKey, lockKey := db.Prefix+"lock:{"+no+"}:seq", db.Prefix+"lock:{"+no+"}:fence", db.Prefix+"lock:{"+no+"}"
	require.Eventually(t, func() bool {
		d, err := db.Client.HGet(ctx, seqKey, "d").Int64()
		return err == nil && d == first.Seq
	}, 10*time.Second, 5*time.Millisecond, "the first change's turn never passed on")
	// What the replica has when the link is cut: the order's sequence and
	// its newest fence as they are now.
	replicaSeq, err := db.Client.Dump(ctx, seqKey).Result()
	require.NoError(t, err)
	replicaFence, err := db.Client.Get(ctx, fenceKey).Result()
	require.NoError(t, err)
	// The lag: the old master accepts three more, and its workers apply
	// them upstream, with fences from a clock a minute ahead of the
	// replica's.
	var before []producer.Result
	for i := 2; i <= 4; i++ {
		before = append(before, modify(i))
	}
	applied("a4")
	// The old master's workers are done: every task of the lag ended, the
	// lock is free.
	require.Eventually(t, func() bool {
		for _, r := range before {
			info, err := insp.GetTaskInfo(r.Queue, r.TaskID)
			if err == nil && (info.State == asynq.TaskStateActive || info.State == asynq.TaskStatePending || info.State == asynq.TaskStateRetry) {
				return false
			}
		}
		return db.Client.Exists(ctx, lockKey).Val() == 0
	}, 10*time.Second, 5*time.Millisecond, "the lag's tasks did not end")
	oracleKey := db.Prefix + "upstream:order:{" + no + "}"
	aheadFence := time.Now().Add(time.Minute).UnixMicro()
	require.NoError(t, db.Client.HSet(ctx, oracleKey, "fence", aheadFence).Err())

	// The switch: the promoted replica has the old sequence and fence,
	// and no lock.
	require.NoError(t, db.Client.RestoreReplace(ctx, seqKey, 0, replicaSeq).Err())
	require.NoError(t, db.Client.Set(ctx, fenceKey, replicaFence, 0).Err())
	require.NoError(t, db.Client.Del(ctx, lockKey).Err())

	var after []producer.Result
	for i := 5; i <= 7; i++ {
		after = append(after, modify(i))
	}
	require.Equal(t, before[0].Seq, after[0].Seq, "the promoted replica hands the lag's positions out again")
	applied("a7")
	for _, r := range after {
		// The last change's task is marked completed just after its
		// write: wait for it.
		var info *asynq.TaskInfo
		require.Eventually(t, func() bool {
			var err error
			info, err = insp.GetTaskInfo(r.Queue, r.TaskID)
			return err == nil && info.State != asynq.TaskStateActive && info.State != asynq.TaskStatePending
		}, 10*time.Second, 5*time.Millisecond, "%s never ended", r.TaskID)
		assert.Equal(t, asynq.TaskStateCompleted, info.State, "%s: %s", r.TaskID, info.LastErr)
		assert.Zero(t, info.Retried, "%s was applied in its first run, without waiting for the clock", r.TaskID)
	}
	h, err := orders.AllHistory(ctx, api.oracle, no)
	require.NoError(t, err)
	var events []string
	var seq, fence int64
	for _, e := range h[1:] {
		events = append(events, e.EventID)
		assert.Greater(t, e.Seq, seq, "positions grow in the upstream: %+v", e)
		assert.GreaterOrEqual(t, e.Fence, fence, "fences never go down: %+v", e)
		seq, fence = e.Seq, e.Fence
	}
	assert.Equal(t, []string{"lag-1", "lag-2", "lag-3", "lag-4", "lag-5", "lag-6", "lag-7"}, events)
	assert.Greater(t, h[5].Fence, aheadFence)
	assert.Contains(t, logs.String(), "store ahead of the key's Redis; caught up")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
