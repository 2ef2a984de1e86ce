package asynqwire_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// What SetTasks reads of asynq's retry and scheduled sets is what asynq's
// own server wrote and its Inspector reads: a real server fails one task
// (a failure) and parks another (an error that is no failure, which asynq
// v0.25.1 puts in the retry set with the delay of RetryDelayFunc and
// without counting it); a third is scheduled.
func TestSetTasksReadsWhatAsynqKeeps(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	t.Cleanup(func() { _ = cli.Close() })
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "sets_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	errFail, errWait := errors.New("upstream said 503"), errors.New("lock: waits for position 1")
	for _, id := range []string{"failed", "parked"} {
		_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{"order_no":"`+id+`"}`)), asynq.Queue(q), asynq.TaskID(id), asynq.MaxRetry(7))
		require.NoError(t, err)
	}
	_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{"order_no":"later"}`)), asynq.Queue(q), asynq.TaskID("later"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 2,
		IsFailure:      func(err error) bool { return !errors.Is(err, errWait) },
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
		LogLevel:       asynq.FatalLevel})
	ran := make(chan string, 2)
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		ran <- id
		if id == "failed" {
			return errFail
		}
		return errWait
	})))
	<-ran
	<-ran
	require.Eventually(t, func() bool {
		n, err := db.Client.ZCard(t.Context(), asynqwire.RetryKey(q)).Result()
		return err == nil && n == 2
	}, 10*time.Second, 10*time.Millisecond)
	srv.Shutdown()

	got, more, ghosts, err := asynqwire.SetTasks(t.Context(), db.Client, asynqwire.SetRetry, []string{q, "sets_test_none"}, 10)
	require.NoError(t, err)
	require.False(t, more)
	require.Zero(t, ghosts)
	require.Len(t, got, 2)
	for _, st := range got {
		info, err := insp.GetTaskInfo(q, st.ID)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateRetry, info.State)
		require.Equal(t, q, st.Queue)
		require.Equal(t, info.Type, st.Type)
		require.Equal(t, info.Payload, st.Payload)
		require.Equal(t, info.MaxRetry, st.Retry)
		require.Equal(t, info.Retried, st.Retried)
		require.Equal(t, info.LastErr, st.ErrorMsg)
		require.Equal(t, info.LastFailedAt.Unix(), st.LastFailedAt.Unix())
		require.Equal(t, info.NextProcessAt.Unix(), st.Due.Unix())
	}
	byID := map[string]asynqwire.SetTask{got[0].ID: got[0], got[1].ID: got[1]}
	require.Equal(t, 1, byID["failed"].Retried, "a failure counts")
	require.Equal(t, 0, byID["parked"].Retried, "an error that is no failure goes to the retry set uncounted")
	require.Equal(t, errWait.Error(), byID["parked"].ErrorMsg)

	one, more, _, err := asynqwire.SetTasks(t.Context(), db.Client, asynqwire.SetRetry, []string{q}, 1)
	require.NoError(t, err)
	require.True(t, more, "a set longer than the limit says so")
	require.Len(t, one, 1)

	sched, _, _, err := asynqwire.SetTasks(t.Context(), db.Client, asynqwire.SetScheduled, []string{q}, 10)
	require.NoError(t, err)
	require.Len(t, sched, 1)
	info, err := insp.GetTaskInfo(q, "later")
	require.NoError(t, err)
	require.Equal(t, "later", sched[0].ID)
	require.Equal(t, info.Payload, sched[0].Payload)
	require.Equal(t, info.NextProcessAt.Unix(), sched[0].Due.Unix())
}

// Members of a retry set that name no task (ghosts), 2,001 of them scored
// before a real task and ZADDed by the intake's Redis user, neither hide
// the task nor count towards the limit: the read goes on past them and
// counts them. Past SetScanFactor times the limit, it stops and says more.
func TestSetTasksReadsPastGhosts(t *testing.T) {
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...)
	cli := asynq.NewClientFromRedisClient(db.Client)
	t.Cleanup(func() { _ = cli.Close() })
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "sets_ghost_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	due := time.Now().Add(time.Hour)
	_, err = cli.Enqueue(asynq.NewTask("t", []byte(`{"order_no":"SO24"}`)), asynq.Queue(q), asynq.TaskID("fail-24"), asynq.ProcessAt(due))
	require.NoError(t, err)
	// As a failing head in the retry set (asynq's Inspector is not needed).
	require.NoError(t, db.Client.ZRem(ctx, asynqwire.ScheduledKey(q), "fail-24").Err())
	require.NoError(t, db.Client.ZAdd(ctx, asynqwire.RetryKey(q), redis.Z{Score: float64(due.Unix()), Member: "fail-24"}).Err())
	const n = 2001
	zs := make([]redis.Z, n)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(due.Unix() - 3), Member: fmt.Sprintf("fake-%d", i)}
	}
	require.NoError(t, intake.Client.ZAdd(ctx, asynqwire.RetryKey(q), zs...).Err())

	got, more, ghosts, err := asynqwire.SetTasks(ctx, db.Client, asynqwire.SetRetry, []string{q}, 2000)
	require.NoError(t, err)
	require.False(t, more)
	require.Equal(t, n, ghosts)
	require.Len(t, got, 1)
	require.Equal(t, "fail-24", got[0].ID)
	require.Equal(t, []byte(`{"order_no":"SO24"}`), got[0].Payload)

	// A limit of 100 looks at 1,001 members at most: the task is past them.
	got, more, ghosts, err = asynqwire.SetTasks(ctx, db.Client, asynqwire.SetRetry, []string{q}, 100)
	require.NoError(t, err)
	require.True(t, more, "the read stopped at its bound")
	require.Equal(t, 100*asynqwire.SetScanFactor+1, ghosts)
	require.Empty(t, got)
}

// A task active on a server that died keeps its lease entry past its end:
// ExpiredLeases finds it, and LeaseEnd says when its lease ended.
func TestExpiredLeasesFindsADeadWorkersTask(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	t.Cleanup(func() { _ = cli.Close() })
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "lease_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{"order_no":"SO1"}`)), asynq.Queue(q), asynq.TaskID("held"))
	require.NoError(t, err)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	started, release := make(chan struct{}), make(chan struct{})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		close(started)
		<-release
		return nil
	})))
	t.Cleanup(func() { close(release); srv.Shutdown() })
	<-started

	end, ok, err := asynqwire.LeaseEnd(t.Context(), db.Client, q, "held")
	require.NoError(t, err)
	require.True(t, ok, "an active task holds a lease")
	none, _, err := asynqwire.ExpiredLeases(t.Context(), db.Client, []string{q}, end.Add(-time.Second), 10)
	require.NoError(t, err)
	require.Empty(t, none, "a lease not yet ended")
	got, more, err := asynqwire.ExpiredLeases(t.Context(), db.Client, []string{q}, end.Add(time.Second), 10)
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, got, 1)
	require.Equal(t, "held", got[0].ID)
	require.Equal(t, []byte(`{"order_no":"SO1"}`), got[0].Payload)
	require.Equal(t, end, got[0].Due)

	_, ok, err = asynqwire.LeaseEnd(t.Context(), db.Client, q, "nothing")
	require.NoError(t, err)
	require.False(t, ok)
}
