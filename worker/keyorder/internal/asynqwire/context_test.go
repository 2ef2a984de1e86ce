package asynqwire_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// meta is what asynq's getters read from a context.
type meta struct {
	ID, Queue         string
	Retried, MaxRetry int
}

func metaOf(ctx context.Context) meta {
	var m meta
	m.ID, _ = asynq.GetTaskID(ctx)
	m.Queue, _ = asynq.GetQueueName(ctx)
	m.Retried, _ = asynq.GetRetryCount(ctx)
	m.MaxRetry, _ = asynq.GetMaxRetry(ctx)
	return m
}

// Inside a run that asynq started, TaskContext makes asynq's own getters
// report another task's metadata, and leaves the run's context alone.
func TestTaskContext(t *testing.T) {
	db := redistest.New(t)
	const q = "taskctx_test"
	type result struct {
		outer, inner, after meta
		ok                  bool
	}
	got := make(chan result, 1)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{
		Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel, TaskCheckInterval: 10 * time.Millisecond,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		var r result
		r.outer = metaOf(ctx)
		inner, ok := asynqwire.TaskContext(ctx, &asynqwire.Claimed{ID: "drained", Queue: "other", Retried: 3, MaxRetry: 7})
		r.inner, r.ok, r.after = metaOf(inner), ok, metaOf(ctx)
		got <- r
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	_, err := asynq.NewClientFromRedisClient(db.Client).Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("first"), asynq.MaxRetry(2))
	require.NoError(t, err)
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the task never ran")
	}
	require.True(t, r.ok, "asynq's metadata is not laid out as v0.25.1's")
	assert.Equal(t, meta{ID: "first", Queue: q, Retried: 0, MaxRetry: 2}, r.outer)
	assert.Equal(t, meta{ID: "drained", Queue: "other", Retried: 3, MaxRetry: 7}, r.inner)
	assert.Equal(t, r.outer, r.after, "the run's own context changed")
}

// Outside a run that asynq started, TaskContext leaves the context alone.
func TestTaskContextOutsideARun(t *testing.T) {
	ctx, ok := asynqwire.TaskContext(t.Context(), &asynqwire.Claimed{ID: "x"})
	require.False(t, ok)
	_, has := asynq.GetTaskID(ctx)
	require.False(t, has)
}
