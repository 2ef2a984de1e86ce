package asynqwire_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// enqueueScript enqueues a task with the package's Lua: ARGV[1] queue,
// ARGV[2] id, ARGV[3] head, ARGV[4] payload, ARGV[5] now in ns. It returns
// 1 when it enqueued, 0 when the ID was taken.
var enqueueScript = redis.NewScript(asynqwire.EnqueueLua + `
if asynq_exists(KEYS[1]) then return 0 end
asynq_enqueue(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], asynq_message(ARGV[3], ARGV[4]), ARGV[5])
return 1
`)

func enqueue(t *testing.T, rdb redis.Scripter, m asynqwire.Message, payload []byte) bool {
	t.Helper()
	n, err := enqueueScript.Run(t.Context(), rdb,
		[]string{asynqwire.TaskKey(m.Queue, m.ID), asynqwire.PendingKey(m.Queue), asynqwire.AllQueues},
		m.Queue, m.ID, m.Head(), payload, time.Now().UnixNano()).Int()
	require.NoError(t, err)
	return n == 1
}

// fields parses a protobuf message into its fields by number, each field's
// encoded value; it fails on a field given twice.
func fields(t *testing.T, b []byte) map[protowire.Number][]byte {
	t.Helper()
	out := map[protowire.Number][]byte{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.GreaterOrEqual(t, n, 0, "tag: %v", protowire.ParseError(n))
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		require.GreaterOrEqual(t, m, 0, "field %d: %v", num, protowire.ParseError(m))
		require.NotContains(t, out, num, "field %d twice", num)
		out[num] = b[n : n+m]
		b = b[n+m:]
	}
	return out
}

// A task written by the Lua is the task asynq's Client writes with the
// same options: the same message fields (in another order), the same hash
// and pending list, and the queue listed; the Inspector reads the same
// info, for payloads whose length takes one to three bytes to encode.
func TestEnqueueWritesWhatTheClientWrites(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_test"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })

	for _, size := range []int{0, 1, 127, 128, 300, 16383, 16384, 70000} {
		for _, timeout := range []time.Duration{0, 2 * time.Minute} {
			name := fmt.Sprintf("payload %d bytes, timeout %v", size, timeout)
			payload := []byte(strings.Repeat("é", size/2) + strings.Repeat("x", size%2))
			ours := asynqwire.Message{Type: "order:modify", ID: fmt.Sprintf("ours-%d-%v", size, timeout), Queue: q,
				MaxRetry: 11, Timeout: timeout, Retention: 24 * time.Hour}
			require.True(t, enqueue(t, db.Client, ours, payload), name)
			opts := []asynq.Option{asynq.Queue(q), asynq.TaskID(fmt.Sprintf("client-%d-%v", size, timeout)),
				asynq.MaxRetry(11), asynq.Retention(24 * time.Hour)}
			if timeout > 0 {
				opts = append(opts, asynq.Timeout(timeout))
			}
			_, err := cli.EnqueueContext(ctx, asynq.NewTask("order:modify", payload), opts...)
			require.NoError(t, err, name)

			hash := func(id string) map[string]string {
				h, err := db.Client.HGetAll(ctx, asynqwire.TaskKey(q, id)).Result()
				require.NoError(t, err)
				require.NotEmpty(t, h, "task %s", id)
				return h
			}
			a, b := hash(ours.ID), hash(fmt.Sprintf("client-%d-%v", size, timeout))
			fa, fb := fields(t, []byte(a["msg"])), fields(t, []byte(b["msg"]))
			require.Equal(t, protowire.AppendString(nil, ours.ID), fa[3], name)
			fa[3], fb[3] = nil, nil // the IDs differ
			assert.Equal(t, fb, fa, "the message's fields, %s", name)
			assert.Equal(t, "pending", a["state"], name)
			assert.Equal(t, b["state"], a["state"], name)
			assert.Contains(t, a, "pending_since", name)
			assert.Len(t, a, len(b), name)

			info, err := insp.GetTaskInfo(q, ours.ID)
			require.NoError(t, err, name)
			want, err := insp.GetTaskInfo(q, fmt.Sprintf("client-%d-%v", size, timeout))
			require.NoError(t, err, name)
			info.ID, want.ID = "", ""
			info.NextProcessAt, want.NextProcessAt = time.Time{}, time.Time{}
			assert.Equal(t, want, info, name)
		}
	}
	pending, err := db.Client.LRange(ctx, asynqwire.PendingKey(q), 0, -1).Result()
	require.NoError(t, err)
	assert.Len(t, pending, 32)
	queues, err := insp.Queues()
	require.NoError(t, err)
	assert.Contains(t, queues, q)
}

// A task ID the queue holds already is refused and nothing is written, as
// asynq's Client refuses it (ErrTaskIDConflict).
func TestEnqueueRefusesATakenID(t *testing.T) {
	db := redistest.New(t)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_taken"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	m := asynqwire.Message{Type: "t", ID: "a", Queue: q}
	require.True(t, enqueue(t, db.Client, m, []byte("first")))
	require.False(t, enqueue(t, db.Client, m, []byte("second")))
	info, err := insp.GetTaskInfo(q, "a")
	require.NoError(t, err)
	assert.Equal(t, []byte("first"), info.Payload)
	n, err := db.Client.LLen(t.Context(), asynqwire.PendingKey(q)).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
}

// A real asynq server runs a task the Lua enqueued, with its payload,
// retry count and timeout.
func TestServerRunsTheTask(t *testing.T) {
	db := redistest.New(t)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_run"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	payload := []byte(`{"event_id":"e1","order_no":"SO1","seq":1796310219504355}` + strings.Repeat(" ", 200))
	require.True(t, enqueue(t, db.Client, asynqwire.Message{Type: "order:modify", ID: "e1", Queue: q,
		MaxRetry: 3, Timeout: 7 * time.Second, Retention: time.Hour}, payload))

	type run struct {
		payload  []byte
		maxRetry int
		deadline time.Time
	}
	got := make(chan run, 1)
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		n, _ := asynq.GetMaxRetry(ctx)
		d, _ := ctx.Deadline()
		got <- run{task.Payload(), n, d}
		return nil
	})))
	defer srv.Shutdown()
	select {
	case r := <-got:
		assert.Equal(t, payload, r.payload)
		assert.Equal(t, 3, r.maxRetry)
		assert.WithinDuration(t, time.Now().Add(7*time.Second), r.deadline, 2*time.Second, "the timeout bounds the run")
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not run the task")
	}
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, "e1")
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 10*time.Second, 10*time.Millisecond, "kept for its retention once done")
	completed, archived, err := asynqwire.Finished(t.Context(), db.Client, []string{q})
	require.NoError(t, err)
	assert.Equal(t, [2]int64{1, 0}, [2]int64{completed, archived}, "Finished counts it")
}

// asynq's Inspector answers "queue not found" for a task of a queue missing
// from asynq's set of queues, though the task exists: TaskInfo lists the
// queue again and finds it. A task that does not exist stays not found,
// and its unlisted queue stays unlisted.
func TestTaskInfoListsAnUnlistedQueueAgain(t *testing.T) {
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q, gone = "asynqwire_unlisted", "asynqwire_unlisted_gone"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true); _ = insp.DeleteQueue(gone, true) })
	_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", []byte("p")), asynq.Queue(q), asynq.TaskID("a"))
	require.NoError(t, err)
	_, err = cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(gone), asynq.TaskID("b"))
	require.NoError(t, err)
	require.NoError(t, insp.DeleteTask(gone, "b"))
	require.NoError(t, db.Client.SRem(ctx, asynqwire.AllQueues, q, gone).Err())

	_, err = insp.GetTaskInfo(q, "a")
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "asynq's Inspector takes the task of an unlisted queue for gone")

	info, relisted, err := asynqwire.TaskInfo(ctx, insp, db.Client, q, "a")
	require.NoError(t, err)
	assert.True(t, relisted)
	assert.Equal(t, []byte("p"), info.Payload)
	queues, err := insp.Queues()
	require.NoError(t, err)
	assert.Contains(t, queues, q)

	info, relisted, err = asynqwire.TaskInfo(ctx, insp, db.Client, q, "none")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
	assert.False(t, relisted)
	assert.Nil(t, info)

	_, relisted, err = asynqwire.TaskInfo(ctx, insp, db.Client, gone, "b")
	require.ErrorIs(t, err, asynq.ErrQueueNotFound)
	assert.False(t, relisted)
	queues, err = insp.Queues()
	require.NoError(t, err)
	assert.NotContains(t, queues, gone)
}

// LookTaskInfo, the read-only look, never takes the task of an unlisted
// queue for gone: it says ErrQueueUnlisted, and lists nothing. A task that
// does not exist is asynq.ErrTaskNotFound, listed queue or not.
func TestLookTaskInfoTellsAnUnlistedQueueFromNoTask(t *testing.T) {
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_look"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", []byte("p")), asynq.Queue(q), asynq.TaskID("a"))
	require.NoError(t, err)

	info, err := asynqwire.LookTaskInfo(ctx, insp, db.Client, q, "a")
	require.NoError(t, err)
	assert.Equal(t, []byte("p"), info.Payload)
	_, err = asynqwire.LookTaskInfo(ctx, insp, db.Client, q, "none")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)

	require.NoError(t, db.Client.SRem(ctx, asynqwire.AllQueues, q).Err())
	_, err = asynqwire.LookTaskInfo(ctx, insp, db.Client, q, "a")
	require.ErrorIs(t, err, asynqwire.ErrQueueUnlisted)
	require.NotErrorIs(t, err, asynq.ErrTaskNotFound)
	_, err = asynqwire.LookTaskInfo(ctx, insp, db.Client, q, "none")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "no hash: no task")
	listed, err := db.Client.SIsMember(ctx, asynqwire.AllQueues, q).Result()
	require.NoError(t, err)
	assert.False(t, listed, "it only reads")
}

// The keys this package names are the ones asynq writes: Finished counts
// what the Inspector archives, and the Inspector's pause sets PausedKey.
func TestFinishedAndPausedKeys(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	const q = "asynqwire_finished"
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	for _, id := range []string{"a", "b"} {
		_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id))
		require.NoError(t, err)
	}
	require.NoError(t, insp.ArchiveTask(q, "a"))
	completed, archived, err := asynqwire.Finished(ctx, db.Client, []string{q, "asynqwire_finished_none"})
	require.NoError(t, err)
	assert.EqualValues(t, 0, completed)
	assert.EqualValues(t, 1, archived)

	require.NoError(t, insp.PauseQueue(q))
	n, err := db.Client.Exists(ctx, asynqwire.PausedKey(q)).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the Inspector's pause writes PausedKey")
	require.NoError(t, insp.UnpauseQueue(q))
}

// TaskQueues names the queues that hold a task, in the order asked, on
// one Redis and across the masters of a Cluster.
func TestTaskQueuesFindsATaskByID(t *testing.T) {
	for _, rdb := range []redis.UniversalClient{redistest.New(t).Client, redistest.NewCluster(t).Client} {
		ctx := t.Context()
		cli := asynq.NewClientFromRedisClient(rdb)
		insp := asynq.NewInspectorFromRedisClient(rdb)
		const a, b, c = "asynqwire_tq_a", "asynqwire_tq_b", "asynqwire_tq_c"
		t.Cleanup(func() { _ = insp.DeleteQueue(b, true); _ = insp.DeleteQueue(c, true) })
		for _, q := range []string{b, c} {
			_, err := cli.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("x"))
			require.NoError(t, err)
		}
		got, err := asynqwire.TaskQueues(ctx, rdb, []string{c, a, b}, "x")
		require.NoError(t, err)
		assert.Equal(t, []string{c, b}, got)
		got, err = asynqwire.TaskQueues(ctx, rdb, []string{a, b}, "none")
		require.NoError(t, err)
		assert.Empty(t, got)
	}
}
