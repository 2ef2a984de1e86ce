package producer_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests of Config.WaitReplicas. The failover that it guards against is
// tested in cmd/worker (TestSentinelFailoverMidRun).

// A master without replicas can confirm nothing. On one Redis the change's
// position and its task are written by one script, so a replica gets both
// or neither: the task is enqueued, and the change is answered
// ErrNotReplicated, as is its repeat (sent again, it is not reported as
// accepted until a replica has it). Without WaitReplicas the repeat is the
// duplicate of the same change.
func TestWaitReplicasWithoutAReplica(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	defer p.Close()
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	remark := tasks.Changes{Remark: new("r")}

	err = p.CheckReplicas(t.Context())
	require.ErrorIs(t, err, producer.ErrNotReplicated)
	assert.Contains(t, err.Error(), "producer: check replicas: producer: not confirmed by the replicas: 0 of 1 replicas acknowledged within 20ms")

	// The script, run in a pipeline with the WAIT, is loaded again after a
	// flush.
	require.NoError(t, db.Client.ScriptFlush(t.Context()).Err())
	for range 2 {
		_, err = p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
		require.ErrorIs(t, err, producer.ErrNotReplicated)
		require.ErrorIs(t, err, producer.ErrUnavailable)
		require.NotErrorIs(t, err, producer.ErrDuplicate)
		assert.Contains(t, err.Error(), `producer: confirm order:modify event "e1" for order SO1: `)
		assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged within 20ms")
	}
	info, err := insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.NoError(t, err, "the task was enqueued with its position")
	got, err := tasks.Modify.Parse(info.Payload)
	require.NoError(t, err)

	plain, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.True(t, dup.SamePayload)
	assert.Equal(t, got.Header().Seq, dup.Seq)
}

// On a Sentinel group (one replica) a confirmed change is on the replica
// when the enqueue returns, for a Redis user with the intake's rules
// (package acl: no @dangerous command, no channel).
func TestWaitReplicasOnSentinel(t *testing.T) {
	t.Parallel()
	db := redistest.NewSentinel(t)
	ctx := t.Context()
	const user, pass = "ow-intake-wait", "intake-wait-secret-0123"
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, db.Group.SetUser(ctx, user, append([]string{"reset", "on", ">" + pass}, rules...)...))
	o := *db.Options
	o.SentinelAddrs = slices.Clone(o.SentinelAddrs)
	o.Username, o.Password = user, pass
	rdb := redis.NewFailoverClient(&o)
	defer rdb.Close()
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 1})
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.CheckReplicas(ctx))
	res, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("e1"))
	require.NoError(t, err)

	master, err := db.Group.Master(ctx)
	require.NoError(t, err)
	var replica string
	for _, n := range db.Group.Nodes() {
		if n != master {
			replica = n
		}
	}
	r := redis.NewClient(&redis.Options{Addr: replica, DB: db.DB})
	defer r.Close()
	// asynq's key of the task, and the order's sequence: both replicated.
	n, err := r.Exists(ctx, "asynq:{"+res.Queue+"}:t:e1", db.Prefix+"lock:{SO1}:seq").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the replica has the task and the position")
}

// On a Cluster the order's keys and the queue may live on two masters:
// the producer waits on both.
func TestWaitReplicasOnCluster(t *testing.T) {
	t.Parallel()
	db := redistest.NewCluster(t)
	ctx := t.Context()
	queueMaster := db.Cluster.MasterOf("asynq:{" + tasks.QueueModify + "}")
	var no string
	for _, n := range db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("SO-W%d", i) }) {
		if db.Cluster.MasterOf("{"+n+"}") != queueMaster {
			no = n
		}
	}
	require.NotEmpty(t, no)
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 1})
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.CheckReplicas(ctx), "every master has its replica")
	two, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 2})
	require.NoError(t, err)
	defer two.Close()
	err = two.CheckReplicas(ctx)
	require.ErrorIs(t, err, producer.ErrNotReplicated)
	assert.Contains(t, err.Error(), "1 of 2 replicas acknowledged within")

	// On a Cluster the position is taken in the order's slot and the task
	// enqueued in the queue's: a position the replicas did not confirm is
	// voided before any task carries it.
	_, err = two.EnqueueModify(ctx, no, tasks.Changes{Remark: new("r")}, producer.WithEventID(db.Prefix+"e0"))
	require.ErrorIs(t, err, producer.ErrNotReplicated)
	_, err = asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, db.Prefix+"e0")
	require.Error(t, err, "no task carries an unconfirmed position")
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	st, err := seq.Status(ctx, no)
	require.NoError(t, err)
	require.Len(t, st.Log, 1)
	assert.Equal(t, "void", st.Log[0].Kind, "the position was voided: %+v", st.Log[0])
	res, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: new("r")}, producer.WithEventID(db.Prefix+"e1"))
	require.NoError(t, err)
	// asynq's keys carry no test prefix: delete the task.
	defer func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteTask(res.Queue, res.TaskID) }()
	for _, k := range []string{db.Prefix + "wait:{" + no + "}", db.Prefix + "wait:{" + tasks.QueueModify + "}"} {
		n, err := db.Client.Exists(ctx, k).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "the marker %s: the producer waited on %s", k, db.Cluster.MasterOf(k))
	}
}
