package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// TestShardsAgreeWithTheWorker gives the CLI and the intake QUEUE_SHARDS=3,
// and a worker the same setting: each change lands in its order's shard of
// its type's queue, the worker applies every one (none archived as
// misplaced), and the order status finds the tasks there.
func TestShardsAgreeWithTheWorker(t *testing.T) {
	db := redistest.New(t)
	const setting = "3"
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "QUEUE_SHARDS": setting}
	cli := func(args ...string) string {
		t.Helper()
		var out strings.Builder
		require.NoError(t, run(t.Context(), args, func(k string) string { return env[k] }, &out), "%v", args)
		return out.String()
	}
	shards, err := tasks.ParseShards(setting)
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		for _, q := range shards.AllQueues(tasks.Kinds()) {
			_ = insp.DeleteQueue(q, true)
		}
	})

	// An order in each shard.
	nos := make([]string, 3)
	for i, found := 0, 0; found < 3; i++ {
		no := "SO" + strconv.Itoa(i)
		if s := tasks.ShardOf(no, 3); nos[s] == "" {
			nos[s], found = no, found+1
		}
	}
	for _, no := range nos {
		cli("order", "put", no, "-address", "1 Main St", "-item", "TEA=2")
		var res map[string]any
		require.NoError(t, json.Unmarshal([]byte(cli("modify", no, "-remark", "cli", "-event-id", "cli-"+no)), &res))
		assert.Equal(t, tasks.Modify.QueueFor(no, 3), res["queue"], "the CLI's queue of %s", no)
	}

	senv := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "QUEUE_SHARDS": setting,
		"INTAKE_ADDR": "127.0.0.1:0", "INTAKE_API_KEYS": testKey1}
	s := startServe(t, senv)
	defer http.DefaultClient.CloseIdleConnections()
	for _, no := range nos {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+s.addr+"/v1/orders/"+no+"/modify",
			strings.NewReader(`{"changes":{"remark":"intake"}}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testKey1)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "intake-"+no)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
		assert.Contains(t, string(b), `"queue":"`+tasks.Modify.QueueFor(no, 3)+`"`, "the intake's queue of %s", no)
	}

	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	w, err := worker.New(db.Client, store, worker.Config{KeyPrefix: db.Prefix, Shards: shards, TaskCheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	defer w.Shutdown()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, no := range nos {
			o, err := store.Get(t.Context(), no)
			if assert.NoError(c, err) {
				assert.Equal(c, "intake", o.Remark, "%s: both changes applied, in order", no)
			}
		}
	}, 30*time.Second, 20*time.Millisecond)
	for _, q := range tasks.Modify.ShardQueues(3) {
		info, err := insp.GetQueueInfo(q)
		require.NoError(t, err)
		assert.Zero(t, info.Archived, q)
	}

	var st struct {
		Tasks []struct {
			TaskID string `json:"task_id"`
			Queue  string `json:"queue"`
		} `json:"tasks"`
	}
	require.NoError(t, json.Unmarshal([]byte(cli("order", "status", nos[0], "-json")), &st))
	require.NotEmpty(t, st.Tasks)
	for _, tk := range st.Tasks {
		assert.Equal(t, tasks.Modify.QueueFor(nos[0], 3), tk.Queue, tk.TaskID)
	}
}

// TestShardsCommand follows the last step of a change from 1 to 3 shards:
// "producer shards" fails while tasks placed under the draining count wait,
// and passes once workers with "3,1" have taken them.
func TestShardsCommand(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "QUEUE_SHARDS": "1"}
	cli := cliWith(t, env)
	mid, err := tasks.ParseShards("3,1")
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		for _, q := range mid.AllQueues(tasks.Kinds()) {
			_ = insp.DeleteQueue(q, true)
		}
	})
	for _, no := range []string{"SO1001", "SO123"} {
		_, err := cli("order", "put", no, "-address", "1 Main St", "-item", "TEA=2")
		require.NoError(t, err)
		_, err = cli("modify", no, "-remark", "before", "-event-id", "before-"+no)
		require.NoError(t, err)
	}
	_, err = cli("modify", "SO-NONE", "-remark", "to an unknown order", "-event-id", "doomed")
	require.NoError(t, err)

	env["QUEUE_SHARDS"] = "3,1"
	_, err = cli("modify", "SO1001", "-remark", "after", "-event-id", "after")
	require.NoError(t, err)
	out, err := cli("shards")
	require.ErrorIs(t, err, errNotDrained)
	var rep shardsReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Equal(t, "3,1", rep.Shards)
	assert.Equal(t, 3, rep.Old, "the three changes accepted with one shard")
	assert.Contains(t, rep.Queues, queuePlacement{Queue: "order_modify", Waiting: 3, Old: 3})
	assert.Contains(t, rep.Queues, queuePlacement{Queue: "order_modify:2", Waiting: 1})

	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	w, err := worker.New(db.Client, store, worker.Config{KeyPrefix: db.Prefix, Shards: mid, TaskCheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	defer w.Shutdown()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := cli("shards")
		if !assert.NoError(c, err) {
			return
		}
		var rep shardsReport
		if assert.NoError(c, json.Unmarshal([]byte(out), &rep)) {
			assert.Zero(c, rep.Old)
			assert.Equal(c, 1, rep.ArchivedOld, "the change of an unknown order, archived where it was placed")
		}
	}, 30*time.Second, 50*time.Millisecond)
	o, err := store.Get(t.Context(), "SO1001")
	require.NoError(t, err)
	assert.Equal(t, "after", o.Remark)
}
