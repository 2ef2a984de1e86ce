package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// TestSIGTERM runs the real binary, sends it SIGTERM while a task holds its
// order's lock, and checks the shutdown: exit status 0, the lock released at
// once (not left to expire), and the task either finished (it fit in the
// shutdown timeout) or back in its queue (it did not).
func TestSIGTERM(t *testing.T) {
	bin := buildWorker(t)
	tests := []struct {
		name      string
		work      string // WORKER_SIMULATE_WORK
		timeout   string // SHUTDOWN_TIMEOUT
		wantState asynq.TaskState
		applied   bool
	}{
		{"finishes in flight", "1500ms", "20s", asynq.TaskStateCompleted, true},
		{"cut off goes back", "1m", "1s", asynq.TaskStatePending, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := redistest.New(t)
			db.RequireProcess(t, "a worker process shares the Redis")
			store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
			require.NoError(t, err)
			require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
			insp := asynq.NewInspectorFromRedisClient(db.Client)
			t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

			cmd := startWorker(t, bin, "REDIS_URL="+db.URL(), "KEY_PREFIX="+db.Prefix, "OPS_ADDR=off", "LOG_FORMAT=console",
				"WORKER_SIMULATE_WORK="+tt.work, "SHUTDOWN_TIMEOUT="+tt.timeout)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()

			addr := "new"
			task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "ev-term", OrderNo: "SO1", Changes: tasks.Changes{Address: &addr}})
			require.NoError(t, err)
			_, err = asynq.NewClientFromRedisClient(db.Client).Enqueue(task, asynq.Queue(tasks.QueueModify), asynq.TaskID("ev-term"), asynq.Retention(time.Hour))
			require.NoError(t, err)

			lockKey := db.Prefix + "lock:{SO1}"
			require.Eventually(t, func() bool { return db.Client.Exists(t.Context(), lockKey).Val() == 1 },
				30*time.Second, 5*time.Millisecond, "the task never took its lock")
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case err := <-exited:
				require.NoError(t, err, "exit status")
			case <-time.After(60 * time.Second):
				t.Fatal("worker did not exit after SIGTERM")
			}

			require.Zero(t, db.Client.Exists(t.Context(), lockKey).Val(), "lock left behind after shutdown")
			info, err := insp.GetTaskInfo(tasks.QueueModify, "ev-term")
			require.NoError(t, err)
			require.Equal(t, tt.wantState, info.State)
			o, err := store.Get(t.Context(), "SO1")
			require.NoError(t, err)
			require.Equal(t, tt.applied, o.Address == addr)
		})
	}
}
