package producer_test

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// With shards, a task goes to its order's shard of its type's queue: the
// queue tasks.Kind.QueueFor names (SO1001 is in shard 2 of 3, SO123 in
// shard 1), and a repeat is refused there.
func TestShardedEnqueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{Shards: tasks.Shards{Count: 3}})
	changes := tasks.Changes{Remark: new("r")}
	res, err := e.p.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-1"))
	require.NoError(t, err)
	assert.Equal(t, "order_modify:2", res.Queue)
	res, err = e.p.EnqueueExchange(t.Context(), "SO123", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithEventID("x-1"))
	require.NoError(t, err)
	assert.Equal(t, "order_exchange:1", res.Queue)
	for _, q := range []string{"order_modify:2", "order_exchange:1"} {
		info, err := e.insp.GetQueueInfo(q)
		require.NoError(t, err)
		assert.Equal(t, 1, info.Pending, q)
	}

	_, err = e.p.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-1"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, "order_modify:2", dup.Queue)
	assert.True(t, dup.SamePayload)
	assert.Equal(t, asynq.TaskStatePending, dup.State)

	// Another change under the same event ID is described from its queue.
	_, err = e.p.EnqueueModify(t.Context(), "SO123", changes, producer.WithEventID("m-1"))
	require.ErrorIs(t, err, producer.ErrPayloadMismatch)
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, "order_modify:2", dup.Queue, "the queue of the change the ID was taken for")
	assert.Equal(t, asynq.TaskStatePending, dup.State)
}

func TestShardsConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	_, err := producer.New(e.db.Client, producer.Config{Shards: tasks.Shards{Count: 65}})
	require.ErrorIs(t, err, tasks.ErrShards)
	assert.Equal(t, tasks.Shards{}, e.p.Config().Shards, "the default: one queue per type")
}

// While a shard count drains, the same change sent again is refused as a
// duplicate although the task waits in its placement under the old count,
// where asynq, whose task IDs are unique per queue, does not look; and the
// positions it took are given up.
func TestShardChangeRefusesARepeatInTheOldQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Remark: new("once")}
	first, err := e.p.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-1"))
	require.NoError(t, err)
	require.Equal(t, "order_modify", first.Queue)

	p3, err := producer.New(e.db.Client, producer.Config{Shards: tasks.Shards{Count: 3, Draining: []int{1}}})
	require.NoError(t, err)
	res, err := p3.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-1"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	assert.Equal(t, first, res, "the result describes the task in the old queue")
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.True(t, dup.SamePayload)
	_, err = e.insp.GetTaskInfo("order_modify:2", "m-1")
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "nothing was enqueued in the new queue")

	// The refused repeat's position was given up: the next change goes on.
	next, err := p3.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-2"))
	require.NoError(t, err)
	assert.Equal(t, "order_modify:2", next.Queue)
	st, err := sequencer(t, e).Status(t.Context(), "SO1001")
	require.NoError(t, err)
	require.Len(t, st.Pending, 3, "m-1, the void, m-2")
	assert.Contains(t, st.Pending[1].Record, "v ")

	// Without the draining count, the repeat is enqueued again in the new
	// queue (the workers' store would apply it once).
	p3only, err := producer.New(e.db.Client, producer.Config{Shards: tasks.Shards{Count: 3}})
	require.NoError(t, err)
	again, err := p3only.EnqueueModify(t.Context(), "SO1001", changes, producer.WithEventID("m-1"))
	require.NoError(t, err)
	assert.Equal(t, "order_modify:2", again.Queue)
}
