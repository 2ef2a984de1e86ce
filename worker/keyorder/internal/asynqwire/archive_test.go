package asynqwire_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// failOnce runs one asynq server on q until task id has failed once (it
// is then in the retry set, an hour out, with a last error), and stops it.
func failOnce(t *testing.T, db *redistest.DB, q, id string) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
		LogLevel:       asynq.FatalLevel})
	failed := make(chan struct{})
	var once sync.Once
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		if got, _ := asynq.GetTaskID(ctx); got == id {
			once.Do(func() { close(failed) })
		}
		return errPark
	})))
	defer srv.Shutdown()
	select {
	case <-failed:
	case <-time.After(15 * time.Second):
		t.Fatal("the server never ran the task")
	}
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, id)
		return err == nil && info.State == asynq.TaskStateRetry
	}, 10*time.Second, 10*time.Millisecond)
}

// Archive archives a pending, a scheduled and a retry task as asynq's
// Inspector does, and asynq's Inspector reads the reason as the task's
// last error (with its time), the rest of the task as it was: its payload,
// its retry count. The message keeps each field once.
func TestArchiveWithAReason(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_archive"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", []byte("retried")), asynq.Queue(q), asynq.TaskID("r"), asynq.MaxRetry(5))
	require.NoError(t, err)
	failOnce(t, db, q, "r")
	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", []byte("pending")), asynq.Queue(q), asynq.TaskID("p"))
	require.NoError(t, err)
	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", []byte("scheduled")), asynq.Queue(q), asynq.TaskID("s"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	before := time.Now().Add(-time.Second)
	for id, payload := range map[string]string{"r": "retried", "p": "pending", "s": "scheduled"} {
		prev, err := insp.GetTaskInfo(q, id)
		require.NoError(t, err)
		archived, state, err := asynqwire.Archive(ctx, db.Client, q, id, "skipped by dave: bad address")
		require.NoError(t, err, id)
		require.True(t, archived, id)
		require.Equal(t, "archived", state, id)
		info, err := insp.GetTaskInfo(q, id)
		require.NoError(t, err, id)
		assert.Equal(t, asynq.TaskStateArchived, info.State, id)
		assert.Equal(t, "skipped by dave: bad address", info.LastErr, id)
		assert.False(t, info.LastFailedAt.Before(before.Truncate(time.Second)), id)
		assert.Equal(t, []byte(payload), info.Payload, id)
		assert.Equal(t, prev.Retried, info.Retried, "%s: a skip is no failure", id)
		assert.Equal(t, prev.MaxRetry, info.MaxRetry, id)
		msg, err := db.Client.HGet(ctx, asynqwire.TaskKey(q, id), "msg").Bytes()
		require.NoError(t, err)
		fields(t, msg) // each field once
	}
	retried, err := insp.GetTaskInfo(q, "r")
	require.NoError(t, err)
	assert.Equal(t, 1, retried.Retried)
	arch, err := insp.ListArchivedTasks(q)
	require.NoError(t, err)
	assert.Len(t, arch, 3)
	for _, set := range []string{asynqwire.PendingKey(q), asynqwire.ScheduledKey(q), asynqwire.RetryKey(q)} {
		n, err := db.Client.Exists(ctx, set).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s is empty", set)
	}

	// asynq's own moves still read the message: run an archived task.
	require.NoError(t, insp.RunTask(q, "p"))
	info, err := insp.GetTaskInfo(q, "p")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State)
}

// A task that is active, archived already, or gone is left alone, and
// Archive says what it found.
func TestArchiveLeavesAlone(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_archive_alone"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	archived, state, err := asynqwire.Archive(ctx, db.Client, q, "none", "why")
	require.NoError(t, err)
	assert.False(t, archived)
	assert.Equal(t, asynqwire.StateGone, state)

	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("a"))
	require.NoError(t, err)
	require.NoError(t, insp.ArchiveTask(q, "a"))
	archived, state, err = asynqwire.Archive(ctx, db.Client, q, "a", "why")
	require.NoError(t, err)
	assert.False(t, archived)
	assert.Equal(t, "archived", state)

	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("run"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(started)
		<-release
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the server never ran the task")
	}
	archived, state, err = asynqwire.Archive(ctx, db.Client, q, "run", "why")
	close(release)
	require.NoError(t, err)
	assert.False(t, archived, "an active task is never archived")
	assert.Equal(t, asynqwire.StateActive, state)
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, "run")
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 10*time.Second, 10*time.Millisecond, "and it completes")
}

// Forward brings a task scheduled two days out, and one in the retry set,
// to the front of its queue: a real asynq server runs them at once, ahead
// of a task pending before them, without counting a retry.
func TestForwardRunsAFarScheduledTask(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_forward"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("retried"), asynq.MaxRetry(5), asynq.Retention(time.Hour))
	require.NoError(t, err)
	failOnce(t, db, q, "retried")
	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("far"), asynq.ProcessIn(48*time.Hour))
	require.NoError(t, err)
	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("before"))
	require.NoError(t, err)

	for _, id := range []string{"retried", "far"} {
		moved, state, err := asynqwire.Forward(ctx, db.Client, q, id)
		require.NoError(t, err)
		assert.True(t, moved, id)
		assert.Equal(t, "moved", state, id)
	}
	moved, state, err := asynqwire.Forward(ctx, db.Client, q, "before")
	require.NoError(t, err)
	assert.False(t, moved, "a pending task is left alone")
	assert.Equal(t, "pending", state)
	moved, state, err = asynqwire.Forward(ctx, db.Client, q, "none")
	require.NoError(t, err)
	assert.False(t, moved)
	assert.Equal(t, asynqwire.StateGone, state)

	order := make(chan string, 3)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		order <- id
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	var got []string
	for range 3 {
		select {
		case id := <-order:
			got = append(got, id)
		case <-time.After(15 * time.Second):
			t.Fatalf("ran only %v", got)
		}
	}
	assert.Equal(t, []string{"far", "retried", "before"}, got, "the tasks brought forward run first, the last one brought first")
	info, err := insp.GetTaskInfo(q, "retried")
	require.NoError(t, err)
	assert.Equal(t, 1, info.Retried, "bringing it forward counts no retry")
}
