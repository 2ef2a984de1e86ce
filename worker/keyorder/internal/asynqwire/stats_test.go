package asynqwire_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// ReadQueueStats reads what asynq's Inspector reads, as the read-only
// dashboard's user, and a ghost in the scheduled and retry sets and in the
// pending list, which fails the Inspector, fails nothing.
func TestReadQueueStatsMatchesTheInspectorAndSurvivesGhosts(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "stats_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	ctx := t.Context()
	for _, id := range []string{"p1", "p2", "p3"} {
		_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{"a":1}`)), asynq.Queue(q), asynq.TaskID(id))
		require.NoError(t, err)
	}
	for _, id := range []string{"s1", "s2"} {
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
		require.NoError(t, err)
	}
	require.NoError(t, insp.ArchiveTask(q, "s2"))
	require.NoError(t, db.Client.Set(ctx, asynqwire.ProcessedTotalKey(q), 7, 0).Err())
	require.NoError(t, db.Client.Set(ctx, asynqwire.FailedTotalKey(q), 2, 0).Err())

	rules, err := acl.Rules(acl.Dashboard, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	ro := db.AsUser(t, rules...)
	got, err := asynqwire.ReadQueueStats(ctx, ro.Client, q)
	require.NoError(t, err)
	info, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	assert.Equal(t, asynqwire.QueueStats{Pending: 3, Scheduled: 1, Archived: 1, ProcessedTotal: 7, FailedTotal: 2,
		OldestPendingSince: got.OldestPendingSince, MemoryUsage: got.MemoryUsage}, got)
	assert.Equal(t, int64(info.Size), got.Size())
	assert.InDelta(t, info.Latency.Seconds(), time.Since(got.OldestPendingSince).Seconds(), 1)
	assert.InEpsilon(t, float64(info.MemoryUsage), float64(got.MemoryUsage), 0.01)

	// Ghosts, as the intake's user may write them: one at each end of the
	// pending list, one a year ahead in the scheduled set, one in the retry
	// set; and a key of another type where a task hash would be.
	rules, err = acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...).Client
	year := float64(time.Now().Add(365 * 24 * time.Hour).Unix())
	require.NoError(t, intake.ZAdd(ctx, asynqwire.ScheduledKey(q), redis.Z{Score: year, Member: "ghost-s"}).Err())
	require.NoError(t, intake.ZAdd(ctx, asynqwire.RetryKey(q), redis.Z{Score: year, Member: "ghost-r"}).Err())
	require.NoError(t, intake.LPush(ctx, asynqwire.PendingKey(q), "ghost-back").Err())
	require.NoError(t, db.Client.RPush(ctx, asynqwire.PendingKey(q), "ghost-front").Err())
	require.NoError(t, db.Client.Set(ctx, asynqwire.TaskKey(q, "ghost-front"), "not a hash", 0).Err())
	_, err = insp.GetQueueInfo(q)
	require.Error(t, err, "asynq's Inspector fails on a ghost (if it no longer does, asynq's collector may do again)")

	ghosted, err := asynqwire.ReadQueueStats(ctx, ro.Client, q)
	require.NoError(t, err)
	assert.Equal(t, int64(5), ghosted.Pending, "a ghost is counted, as asynq counts it")
	assert.Equal(t, int64(2), ghosted.Scheduled)
	assert.Equal(t, int64(1), ghosted.Retry)
	assert.Equal(t, 4, ghosted.Ghosts)
	assert.Equal(t, got.OldestPendingSince, ghosted.OldestPendingSince, "the ghost at the front is passed over")
	assert.Positive(t, ghosted.MemoryUsage)
}

// A queue with nothing in it reads as zeros, and a key of the wrong type
// where a list is fails the read with an error.
func TestReadQueueStatsEmptyAndWrongType(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	got, err := asynqwire.ReadQueueStats(ctx, db.Client, "stats_empty_test")
	require.NoError(t, err)
	assert.Equal(t, asynqwire.QueueStats{}, got)

	const q = "stats_wrongtype_test"
	require.NoError(t, db.Client.Set(ctx, asynqwire.PendingKey(q), "x", 0).Err())
	t.Cleanup(func() { db.Client.Del(context.Background(), asynqwire.PendingKey(q)) })
	_, err = asynqwire.ReadQueueStats(ctx, db.Client, q)
	require.ErrorContains(t, err, q)
}
