package asynqwire_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

var errPark = errors.New("park")

// A task parked in the retry set for an hour is brought to the front of
// its queue and is the next one a real asynq server runs, ahead of tasks
// that were pending before it.
func TestFrontRunsTheTaskNext(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "front_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	// Park "parked" in the retry set, as the worker does, with one short
	// run of a server that fails it once.
	_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("parked"), asynq.MaxRetry(5), asynq.Retention(time.Hour))
	require.NoError(t, err)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1,
		IsFailure:      func(error) bool { return false },
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
		LogLevel:       asynq.FatalLevel})
	parked := make(chan struct{})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(parked)
		return errPark
	})))
	<-parked
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, "parked")
		return err == nil && info.State == asynq.TaskStateRetry
	}, 10*time.Second, 10*time.Millisecond)
	srv.Shutdown()

	for _, id := range []string{"a", "b", "c"} {
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id))
		require.NoError(t, err)
	}
	moved, _, err := asynqwire.Front(t.Context(), db.Client, q, "parked")
	require.NoError(t, err)
	require.True(t, moved)
	info, err := insp.GetTaskInfo(q, "parked")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	require.Zero(t, info.Retried, "a park is not a failure")

	order := make(chan string, 4)
	srv = asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		order <- id
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	require.Equal(t, "parked", <-order, "the task brought to the front runs first")

	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, "parked")
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 10*time.Second, 10*time.Millisecond)
	moved, state, err := asynqwire.Front(t.Context(), db.Client, q, "parked")
	require.NoError(t, err)
	require.False(t, moved, "a task that is no longer waiting is left alone")
	require.Equal(t, "completed", state)
	moved, state, err = asynqwire.Front(t.Context(), db.Client, q, "nothing")
	require.NoError(t, err)
	require.False(t, moved)
	require.Empty(t, state)
}

// The task of a worker that died (its asynq lease expired) is brought back
// to the front of its queue once the lease has been expired for the margin,
// and not before; its failure count is untouched.
func TestRecoverBringsBackADeadWorkersTask(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "recover_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	for _, id := range []string{"dead", "alive", "other"} {
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id), asynq.MaxRetry(3))
		require.NoError(t, err)
	}
	// As asynq's dequeue leaves them: active, with a lease (unix seconds).
	ctx := t.Context()
	now := time.Now().Unix()
	for id, lease := range map[string]int64{"dead": now - 20, "alive": now + 25} {
		require.NoError(t, db.Client.LRem(ctx, "asynq:{"+q+"}:pending", 1, id).Err())
		require.NoError(t, db.Client.LPush(ctx, "asynq:{"+q+"}:active", id).Err())
		require.NoError(t, db.Client.ZAdd(ctx, "asynq:{"+q+"}:lease", redis.Z{Score: float64(lease), Member: id}).Err())
		require.NoError(t, db.Client.HSet(ctx, "asynq:{"+q+"}:t:"+id, "state", "active").Err())
	}
	got, err := asynqwire.Recover(ctx, db.Client, q, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, asynqwire.Recovered{}, got, "expired 20 s ago: within the margin")
	got, err = asynqwire.Recover(ctx, db.Client, q, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, asynqwire.Recovered{IDs: []string{"dead"}}, got)
	info, err := insp.GetTaskInfo(q, "dead")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	require.Zero(t, info.Retried)
	first, err := db.Client.LIndex(ctx, "asynq:{"+q+"}:pending", -1).Result()
	require.NoError(t, err)
	require.Equal(t, "dead", first, "at the front: asynq dequeues from the right")
	info, err = insp.GetTaskInfo(q, "alive")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateActive, info.State)
}

// IDs that name no task (ghosts: no task hash, or one without a message),
// written by the intake's Redis user, are never brought back: one whose
// lease expired is removed from the lease set and the active list, and
// those at the front of the pending list, 2,500 of them (more than one
// round trip looks at), are removed from it, with their hashes; each is
// counted. The real tasks keep their order, and a real dead worker's task
// still goes to the front.
func TestRecoverRemovesGhosts(t *testing.T) {
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...)
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "recover_ghosts_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	pending, active, lease := "asynq:{"+q+"}:pending", "asynq:{"+q+"}:active", "asynq:{"+q+"}:lease"
	enqueue := func(id string) {
		t.Helper()
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id))
		require.NoError(t, err)
	}
	enqueue("a")
	enqueue("b")
	const n = 2500
	ghosts := make([]any, n)
	for i := range ghosts {
		ghosts[i] = fmt.Sprintf("poison-%d", i)
	}
	long := "poison-" + strings.Repeat("x", 100)
	ghosts[n-1] = long
	require.NoError(t, intake.Client.LPush(ctx, pending, ghosts...).Err())
	require.NoError(t, intake.Client.HSet(ctx, "asynq:{"+q+"}:t:poison-7", "state", "pending").Err(), "a hash without a message")
	// A key of another type where a task hash would be (a fault, or a
	// user with more rights) names no task either, and fails no read.
	require.NoError(t, db.Client.Set(ctx, "asynq:{"+q+"}:t:poison-8", "not a hash", 0).Err())
	enqueue("c")
	enqueue("dead")
	// "dead" and a ghost as asynq's dequeue leaves them: active, with a
	// lease that expired 20 s ago (the ghost's hash has only its state).
	now := time.Now().Unix()
	for _, id := range []string{"dead", "lease-ghost"} {
		require.NoError(t, db.Client.LRem(ctx, pending, 1, id).Err())
		require.NoError(t, db.Client.LPush(ctx, active, id).Err())
		require.NoError(t, db.Client.ZAdd(ctx, lease, redis.Z{Score: float64(now - 20), Member: id}).Err())
		require.NoError(t, db.Client.HSet(ctx, "asynq:{"+q+"}:t:"+id, "state", "active").Err())
	}

	got, err := asynqwire.Recover(ctx, db.Client, q, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, []string{"dead"}, got.IDs)
	require.Equal(t, n+1, got.Ghosts)
	require.Len(t, got.GhostIDs, 10)
	require.Equal(t, "lease-ghost", got.GhostIDs[0], "the lease set is read first")
	for _, id := range got.GhostIDs {
		require.LessOrEqual(t, len(id), 64)
	}
	list, err := db.Client.LRange(ctx, pending, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"c", "b", "a", "dead"}, list, "the real tasks, in order, the dead worker's first")
	require.Zero(t, db.Client.LLen(ctx, active).Val())
	require.Zero(t, db.Client.ZCard(ctx, lease).Val())
	for _, id := range []string{"lease-ghost", "poison-7", "poison-8"} {
		require.Zero(t, db.Client.Exists(ctx, "asynq:{"+q+"}:t:"+id).Val(), "%s's hash", id)
	}
	info, err := insp.GetQueueInfo(q)
	require.NoError(t, err, "asynq reads the queue again")
	require.Equal(t, 4, info.Pending)

	got, err = asynqwire.Recover(ctx, db.Client, q, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, asynqwire.Recovered{}, got, "nothing left to do")
}
