package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// TestRawSeqCannotPoisonAnOrder is the probe's reproduction, through the
// real binaries (the worker, and "producer serve" as the intake): a task
// enqueued with a raw asynq client, its seq one that no sequence handed
// out, on an order without a live sequence (SO22), and then the tasks of
// the other forged seqs (negative, 2^53+1, another order's, last+1000 on a
// live sequence). After each, a change sent through the intake is applied.
func TestRawSeqCannotPoisonAnOrder(t *testing.T) {
	db := redistest.New(t)
	db.RequireProcess(t, "worker and intake processes share the Redis")
	ctx := t.Context()
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	for _, no := range []string{"SO22", "SO23", "SO25"} {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

	startWorker(t, buildWorker(t), "REDIS_URL="+db.URL(), "KEY_PREFIX="+db.Prefix, "OPS_ADDR=off", "LOG_FORMAT=console")
	base := startIntakeBinary(t, db)

	cli := asynq.NewClientFromRedisClient(db.Client)
	raw := func(id, no, seq string) asynq.TaskState {
		t.Helper()
		payload := fmt.Sprintf(`{"order_no":%q,"event_id":%q,"seq":%s,"changes":{"remark":"poison"}}`, no, id, seq)
		_, err := cli.Enqueue(asynq.NewTask(tasks.TypeModify, []byte(payload)), asynq.Queue(tasks.QueueModify),
			asynq.TaskID(id), asynq.Retention(time.Hour))
		require.NoError(t, err)
		var state asynq.TaskState
		require.Eventually(t, func() bool {
			info, err := insp.GetTaskInfo(tasks.QueueModify, id)
			if err != nil {
				return false
			}
			state = info.State
			return state == asynq.TaskStateCompleted || state == asynq.TaskStateArchived
		}, 30*time.Second, 10*time.Millisecond, "task %s never ended", id)
		return state
	}
	var last int64
	viaIntake := func(no, id string) {
		t.Helper()
		body := fmt.Sprintf(`{"changes":{"remark":"valid %s"}}`, id)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/orders/"+no+"/modify", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+intakeKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", id)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
		require.Eventually(t, func() bool {
			o, err := store.Get(ctx, no)
			return err == nil && o.Remark == "valid "+id
		}, 30*time.Second, 10*time.Millisecond, "the change %s sent after a raw task was not applied", id)
		h, err := orders.AllHistory(ctx, store, no)
		require.NoError(t, err)
		last = h[len(h)-1].Seq
		require.Positive(t, last)
	}

	require.Equal(t, asynq.TaskStateCompleted, raw("raw-p", "SO22", "9000000000000000"), "applied without order")
	viaIntake("SO22", "after-p")
	for id, seq := range map[string]string{"raw-neg": "-5", "raw-big": "9007199254740993"} {
		require.Equal(t, asynq.TaskStateArchived, raw(id, "SO22", seq), id)
		viaIntake("SO22", "after-"+id)
	}
	viaIntake("SO23", "live-23")
	last23 := last
	viaIntake("SO25", "live-25") // a sequence that starts after SO23's
	for id, seq := range map[string]int64{"raw-other": last, "raw-ahead": last23 + 1000} {
		require.Equal(t, asynq.TaskStateArchived, raw(id, "SO23", fmt.Sprint(seq)), id)
		info, err := insp.GetTaskInfo(tasks.QueueModify, id)
		require.NoError(t, err)
		require.Contains(t, info.LastErr, "was never handed out", id)
		viaIntake("SO23", "after-"+id)
	}
}

// startIntakeBinary builds and runs "producer serve" on a free port and
// returns its base URL once it is ready.
func startIntakeBinary(t *testing.T, db *redistest.DB) string {
	t.Helper()
	_, bin := buildBinaries(t)
	addr := freeAddr(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(cmd.Environ(), "REDIS_URL="+db.URL(), "KEY_PREFIX="+db.Prefix, "INTAKE_ADDR="+addr,
		"INTAKE_API_KEYS="+intakeKey, "LOG_FORMAT=console")
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("intake log:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	require.Eventually(t, func() bool {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "the intake never became ready")
	return base
}
