package asynqredis_test

import (
	"path"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// The keys name what asynq's own Client writes, and the ACL patterns
// match them.
func TestKeysAreAsynqs(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const q, id = "face_keys_test", "k1"
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id))
	require.NoError(t, err)
	_, err = cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("k2"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	require.Equal(t, []string{id}, db.Client.LRange(ctx, asynqredis.PendingKey(q), 0, -1).Val())
	require.Equal(t, []string{"k2"}, db.Client.ZRange(ctx, asynqredis.ScheduledKey(q), 0, -1).Val())
	require.Equal(t, "pending", db.Client.HGet(ctx, asynqredis.TaskKey(q, id), "state").Val())
	require.True(t, db.Client.SIsMember(ctx, asynqredis.AllQueues, q).Val())
	for _, k := range []string{asynqredis.PendingKey(q), asynqredis.RetryKey(q), asynqredis.ActiveKey(q),
		asynqredis.LeaseKey(q), asynqredis.PausedKey(q), asynqredis.TaskKey(q, id)} {
		assert.Contains(t, k, asynqredis.QueueKey(q), "every key of the queue starts with its prefix")
	}

	p := asynqredis.ACL()
	for _, tt := range []struct{ pattern, key string }{
		{p.All, asynqredis.AllQueues}, {p.Queues, asynqredis.PendingKey(q)}, {p.Tasks, asynqredis.TaskKey(q, id)},
		{p.Pending, asynqredis.PendingKey(q)}, {p.Scheduled, asynqredis.ScheduledKey(q)}, {p.Retry, asynqredis.RetryKey(q)},
		{p.Servers, p.ServersSet}, {p.Workers, p.WorkersSet}, {p.All, p.SchedulersSet},
	} {
		ok, err := path.Match(tt.pattern, tt.key) // Redis's glob, for keys without '/'
		require.NoError(t, err)
		assert.True(t, ok, "%s matches %s", tt.pattern, tt.key)
	}
	assert.NotEmpty(t, p.Cancel)
}

// A task whose queue asynq's set of queues lost is never gone: the
// read-only look says unlisted, the read lists the queue again; the
// counts and the summary read the queue's keys.
func TestReadsOfAnUnlistedQueue(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const q, id = "face_reads_test", "r1"
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{}`)), asynq.Queue(q), asynq.TaskID(id))
	require.NoError(t, err)
	require.NoError(t, db.Client.SRem(ctx, asynqredis.AllQueues, q).Err())

	total, listed, err := asynqredis.Listed(ctx, db.Client, []string{q})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, listed)
	names, _, err := asynqredis.Scan(ctx, db.Client, 0, 100)
	require.NoError(t, err)
	require.NotContains(t, names, q)
	require.Len(t, names, int(total))

	_, err = asynqredis.LookTaskInfo(ctx, insp, db.Client, q, id)
	require.ErrorIs(t, err, asynqredis.ErrUnlisted)
	_, err = asynqredis.LookTaskInfo(ctx, insp, db.Client, q, "nobody")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)

	s, err := asynqredis.ReadStats(ctx, db.Client, q)
	require.NoError(t, err)
	require.Equal(t, int64(1), s.Pending)
	require.Equal(t, int64(1), s.Size())

	info, relisted, err := asynqredis.TaskInfo(ctx, insp, db.Client, q, id)
	require.NoError(t, err)
	require.True(t, relisted)
	require.Equal(t, asynq.TaskStatePending, info.State)
	_, listed, err = asynqredis.Listed(ctx, db.Client, []string{q})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, listed)

	completed, archived, err := asynqredis.Finished(ctx, db.Client, []string{q})
	require.NoError(t, err)
	require.Zero(t, completed+archived)
}

// Forward brings a scheduled task to the front; Recover finds nothing to
// bring back in a queue without leases.
func TestForwardAndRecover(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const q = "face_moves_test"
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("f1"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	moved, state, err := asynqredis.Forward(ctx, db.Client, q, "f1")
	require.NoError(t, err)
	require.True(t, moved, state)
	info, err := insp.GetTaskInfo(q, "f1")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	moved, state, err = asynqredis.Forward(ctx, db.Client, q, "none")
	require.NoError(t, err)
	require.False(t, moved)
	require.Empty(t, state, "no such task")

	got, err := asynqredis.Recover(ctx, db.Client, q, time.Second)
	require.NoError(t, err)
	require.Equal(t, asynqredis.Recovered{}, got)
}
