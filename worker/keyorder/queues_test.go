package keyorder_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// QueueTasks, as a program that takes turns itself asks it (the order
// domain's worker does): the head's task read where its label says, and
// its fate.
func TestQueueTasksReadsAHeadsTask(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	_, err := keyorder.NewQueueTasks(nil, keyorder.QueueTasksConfig{Key: keyOf})
	require.Error(t, err, "no Redis client")
	_, err = keyorder.NewQueueTasks(db.Client, keyorder.QueueTasksConfig{})
	require.Error(t, err, "no Key")
	qt, err := keyorder.NewQueueTasks(db.Client, keyorder.QueueTasksConfig{Key: keyOf})
	require.NoError(t, err)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})

	later := enqueue(t, c, "Q", 1, asynq.ProcessIn(time.Hour))
	te := &keyorder.TurnError{Key: "Q", Head: later.Pos, Pos: later.Pos + 1, Label: keyorder.Label(later.Queue, later.TaskID)}
	why, info, err := qt.HeadTask(ctx, "Q", te)
	require.NoError(t, err)
	require.Empty(t, why, "a scheduled head comes")
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	why, delay, err := qt.HeadFate(ctx, "Q", te)
	require.NoError(t, err)
	require.Empty(t, why)
	require.InDelta(t, time.Hour.Seconds(), delay.Seconds(), 60, "it runs in an hour")

	require.NoError(t, asynq.NewInspectorFromRedisClient(db.Client).DeleteTask(later.Queue, later.TaskID))
	why, info, err = qt.HeadTask(ctx, "Q", te)
	require.NoError(t, err)
	require.Nil(t, info)
	require.Contains(t, why, "is not in queue "+later.Queue)

	te.Label = "spaceless"
	why, _, err = qt.HeadTask(ctx, "Q", te)
	require.NoError(t, err)
	require.Contains(t, why, "names no task")
}
