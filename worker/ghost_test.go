package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// A change accepted behind 1,000 task IDs that name no task (ghosts),
// LPUSHed into order_modify's pending list by the intake's Redis user, is
// applied within 30 s (before, the worker's recoverer put each ghost that
// asynq had dequeued back at the front of the queue, and the change was
// never applied). The worker, as its own Redis user, removes the ghosts
// at the front of the queue at its first look, and those asynq had taken
// at the end of their lease; it counts every one in
// orderworker_ghost_tasks_removed_total, and none comes back.
func TestGhostTaskIDsDoNotStallAQueue(t *testing.T) {
	e := newEnv(t)
	e.seed("SO34")
	rules := func(p acl.Process) []string {
		r, err := acl.Rules(p, acl.Options{KeyPrefix: e.db.Prefix})
		require.NoError(t, err)
		return r
	}
	intake, workerUser := e.db.AsUser(t, rules(acl.Intake)...), e.db.AsUser(t, rules(acl.Worker)...)
	ctx := t.Context()
	pending := "asynq:{" + tasks.QueueModify + "}:pending"

	const n = 1000
	ghosts := make([]any, n)
	for i := range ghosts {
		ghosts[i] = fmt.Sprintf("poison-%d", i)
	}
	require.NoError(t, intake.Client.LPush(ctx, pending, ghosts...).Err())
	p, err := producer.New(intake.Client, producer.Config{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	_, err = p.EnqueueModify(ctx, "SO34", tasks.Changes{Remark: new("p 1")}, producer.WithEventID("p1k-1"))
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	m, err := worker.NewMetrics(reg)
	require.NoError(t, err)
	w, err := worker.New(workerUser.Client, e.store, worker.Config{KeyPrefix: e.db.Prefix, Logger: zaptest.NewLogger(t), Metrics: m,
		TaskCheckInterval: 100 * time.Millisecond, DelayedTaskCheckInterval: 100 * time.Millisecond,
		RecoverAfter: time.Second, RecoverEvery: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)

	start := time.Now()
	require.Eventually(t, func() bool {
		o, err := e.store.Get(ctx, "SO34")
		return err == nil && o.Remark == "p 1"
	}, 30*time.Second, 20*time.Millisecond, "the change behind the ghosts is applied")
	t.Logf("applied %v after the worker started", time.Since(start).Round(time.Millisecond))

	// The ghosts asynq's dequeue took before the first look hold asynq's
	// 30 s lease; they go when it has ended for RecoverAfter.
	require.Eventually(t, func() bool { return ghostsRemoved(t, reg)[tasks.QueueModify] == n }, 90*time.Second, 50*time.Millisecond,
		"every ghost removed and counted once")
	for _, key := range []string{pending, "asynq:{" + tasks.QueueModify + "}:active"} {
		ids, err := e.db.Client.LRange(ctx, key, 0, -1).Result()
		require.NoError(t, err)
		require.Empty(t, ids, "%s", key)
	}
	require.Zero(t, e.db.Client.ZCard(ctx, "asynq:{"+tasks.QueueModify+"}:lease").Val())
	require.Equal(t, map[string]float64{tasks.QueueModify: n, tasks.QueueExchange: 0}, ghostsRemoved(t, reg), "one series per served queue")
}

// ghostsRemoved reads orderworker_ghost_tasks_removed_total by queue.
func ghostsRemoved(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "orderworker_ghost_tasks_removed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
