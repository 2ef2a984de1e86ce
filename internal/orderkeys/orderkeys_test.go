package orderkeys_test

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// The engine's wake, given Locate, looks a parked task up in each of its
// placements: while a shard count drains, a task of order SO1001 may wait
// in the queue it was placed in under the old count (order_modify) rather
// than in its shard under the new one (order_modify:2).
func TestWakeLooksInEveryPlacement(t *testing.T) {
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		for _, q := range []string{"order_modify", "order_modify:2"} {
			_ = insp.DeleteQueue(q, true)
		}
	})
	for _, id := range []string{"parked", "a", "b"} {
		_, err := cli.Enqueue(asynq.NewTask(tasks.TypeModify, nil), asynq.Queue("order_modify"), asynq.TaskID(id))
		require.NoError(t, err)
	}
	_, err := cli.Enqueue(asynq.NewTask(tasks.TypeModify, nil), asynq.Queue("order_modify:2"), asynq.TaskID("c"))
	require.NoError(t, err)
	ctx := t.Context()
	front := func(q string) string {
		id, err := db.Client.LIndex(ctx, asynqredis.PendingKey(q), -1).Result()
		require.NoError(t, err)
		return id
	}
	require.Equal(t, "parked", front("order_modify"), "asynq dequeues from the right: the first enqueued is first")
	require.NoError(t, db.Client.LRem(ctx, asynqredis.PendingKey("order_modify"), 1, "parked").Err())
	require.NoError(t, db.Client.LPush(ctx, asynqredis.PendingKey("order_modify"), "parked").Err())
	require.Equal(t, "a", front("order_modify"))

	labels := []string{tasks.PositionLabel(tasks.TypeModify, "parked"), tasks.PositionLabel(tasks.TypeModify, "absent")}
	require.NoError(t, keyorder.Wake(ctx, db.Client, orderkeys.Locate(tasks.Shards{Count: 3}, tasks.Kinds()), "SO1001", labels))
	require.Equal(t, "a", front("order_modify"), "without the draining count, the old queue is not looked at")
	require.NoError(t, keyorder.Wake(ctx, db.Client, orderkeys.Locate(tasks.Shards{Count: 3, Draining: []int{1}}, tasks.Kinds()), "SO1001", labels))
	require.Equal(t, "parked", front("order_modify"), "found in the placement under the draining count")
	require.Equal(t, "c", front("order_modify:2"))
}

// Locate gives a label's task ID and its placements: the order's shard
// under each count, and for a creation, the exchanged order's (whose queue
// holds the exchange); a label that names no task of the kinds is not
// located.
func TestLocate(t *testing.T) {
	t.Parallel()
	shards := tasks.Shards{Count: 3, Draining: []int{1}}
	locate := orderkeys.Locate(shards, tasks.Kinds())
	queues, id, ok := locate("SO1001", tasks.PositionLabel(tasks.TypeModify, "ev-1"))
	require.True(t, ok)
	require.Equal(t, "ev-1", id)
	require.Equal(t, shards.Placements(tasks.Modify, "SO1001"), queues)
	require.Contains(t, queues, "order_modify", "the placement under the draining count")

	queues, id, ok = locate("SO2", tasks.CreationLabel("x-1", "SO1001"))
	require.True(t, ok)
	require.Equal(t, "x-1", id)
	require.Equal(t, shards.Placements(tasks.Exchange, "SO1001"), queues, "the exchanged order's placements")

	for _, label := range []string{"", "order:modify", "order:unknown ev-1", "order:create x-1"} {
		_, _, ok := locate("SO1001", label)
		require.False(t, ok, "%q", label)
	}
}

// The domain's Redis layout is the one its ACL rules, docs and existing
// data know: the engine's keys under ow:lock:, whatever the engine's own
// default, and the shared token at ow:token:{upstream}.
func TestTheLayoutUnderTheDefaultPrefix(t *testing.T) {
	t.Parallel()
	cfg := orderkeys.SeqConfig(orderkeys.DefaultPrefix, orderkeys.Use{MaxWaiting: 3, StatusPage: 7})
	require.Equal(t, keyorder.SeqConfig{Prefix: "ow:lock:", MaxWaiting: 3, StatusPage: 7}, cfg, "only the Use differs per program")
	require.NotEqual(t, keyorder.DefaultPrefix, cfg.Prefix, "the domain sets its prefix: the engine's default is not the domain's")
	require.Equal(t, "ow:token:{upstream}", orderkeys.TokenKey(orderkeys.DefaultPrefix))

	db := redistest.New(t)
	seq, err := orderkeys.Sequencer(db.Client, orderkeys.DefaultPrefix, orderkeys.Use{})
	require.NoError(t, err)
	require.Equal(t, "ow:lock:{SO1}:seq", seq.SeqKey("SO1"))
	require.Equal(t, "ow:lock:held", seq.PausedKey())
}
