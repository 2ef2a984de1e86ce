package asynqwire_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Step claims a task out of the retry set or the pending list into the
// active list with a lease, and records each end of its run as asynq's
// processor would: asynq's Inspector then reads the task as completed (with
// its retention), retrying (with its failure counted, its error and its
// time), archived (with its reason) or pending again; a task in no state to
// claim is left alone, and two tasks of one queue take one round trip.
func TestStepClaimsAndEndsAsAsynqDoes(t *testing.T) {
	const q = "step_test"
	db, cli, insp := stepQueue(t, q)
	ctx := t.Context()
	for _, id := range []string{"ok", "fail", "wait", "archive", "requeue", "norec"} {
		_, err := cli.Enqueue(asynq.NewTask("t", []byte(`{"id":"`+id+`"}`)), asynq.Queue(q), asynq.TaskID(id),
			asynq.MaxRetry(5), asynq.Retention(time.Hour), asynq.Timeout(time.Minute))
		require.NoError(t, err)
	}
	_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("later"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	c, gone, err := asynqwire.Step(ctx, db.Client, nil, q, "ok")
	require.NoError(t, err)
	require.False(t, gone)
	assert.Equal(t, asynqwire.Claimed{Queue: q, ID: "ok", Type: "t", Payload: []byte(`{"id":"ok"}`), MaxRetry: 5,
		Timeout: time.Minute, Retention: time.Hour}, withoutMsg(c))
	info, err := insp.GetTaskInfo(q, "ok")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateActive, info.State)

	// End "ok" and claim "fail" in one call.
	fail, _, err := asynqwire.Step(ctx, db.Client, &asynqwire.Outcome{Task: c}, q, "fail")
	require.NoError(t, err)
	info, err = insp.GetTaskInfo(q, "ok")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateCompleted, info.State)
	assert.WithinDuration(t, time.Now(), info.CompletedAt, 5*time.Second)
	assert.Equal(t, time.Hour, info.Retention)

	at := time.Now().Add(time.Hour).Truncate(time.Second)
	wait, _, err := asynqwire.Step(ctx, db.Client, &asynqwire.Outcome{Task: fail, Err: errors.New("upstream 503"), Failure: true, RetryAt: at}, q, "wait")
	require.NoError(t, err)
	info, err = insp.GetTaskInfo(q, "fail")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateRetry, info.State)
	assert.Equal(t, 1, info.Retried, "a failure counts")
	assert.Equal(t, "upstream 503", info.LastErr)
	assert.Equal(t, at, info.NextProcessAt)

	arch, _, err := asynqwire.Step(ctx, db.Client, &asynqwire.Outcome{Task: wait, Err: errors.New("busy"), RetryAt: at}, q, "archive")
	require.NoError(t, err)
	info, err = insp.GetTaskInfo(q, "wait")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateRetry, info.State)
	assert.Zero(t, info.Retried, "a wait is no failure")

	rq, _, err := asynqwire.Step(ctx, db.Client, &asynqwire.Outcome{Task: arch, Err: errors.New("bad payload"), Archive: true}, q, "requeue")
	require.NoError(t, err)
	info, err = insp.GetTaskInfo(q, "archive")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateArchived, info.State)
	assert.Equal(t, "bad payload", info.LastErr)

	_, _, err = asynqwire.Step(ctx, db.Client, &asynqwire.Outcome{Task: rq, Err: errors.New("shutdown"), Requeue: true}, q, "")
	require.NoError(t, err)
	info, err = insp.GetTaskInfo(q, "requeue")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State)

	// Not claimed: scheduled on purpose, gone, already active.
	for id, state := range map[string]string{"later": "scheduled", "nope": "", "norec": "active"} {
		if id == "norec" {
			_, _, err := asynqwire.Step(ctx, db.Client, nil, q, id)
			require.NoError(t, err)
		}
		_, _, err := asynqwire.Step(ctx, db.Client, nil, q, id)
		var nc *asynqwire.NotClaimedError
		require.ErrorAs(t, err, &nc, id)
		assert.Equal(t, state, nc.State, id)
		require.ErrorIs(t, err, asynqwire.ErrNotClaimed)
	}
	info, err = insp.GetTaskInfo(q, "later")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateScheduled, info.State, "left alone")

	// The processed and failed counters asynqmon charts move as asynq's do.
	qi, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	assert.Equal(t, 3, qi.ProcessedTotal, "completed, failed and archived")
	assert.Equal(t, 2, qi.FailedTotal, "failed and archived")
}

// A task whose lease ended and that was brought back while its run went
// on is not written for when the run ends: gone.
func TestStepLeavesARecoveredTaskAlone(t *testing.T) {
	const q = "step_gone"
	db, cli, insp := stepQueue(t, q)
	_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID("x"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	c, _, err := asynqwire.Step(t.Context(), db.Client, nil, q, "x")
	require.NoError(t, err)
	// As Recover would: back to pending.
	_, _, err = asynqwire.Step(t.Context(), db.Client, &asynqwire.Outcome{Task: c, Err: errors.New("x"), Requeue: true}, q, "")
	require.NoError(t, err)
	_, gone, err := asynqwire.Step(t.Context(), db.Client, &asynqwire.Outcome{Task: c}, q, "")
	require.NoError(t, err)
	require.True(t, gone)
	info, err := insp.GetTaskInfo(q, "x")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State, "nothing written for the gone run")
}

func withoutMsg(c *asynqwire.Claimed) asynqwire.Claimed {
	out := *c
	asynqwire.ClearMsg(&out)
	return out
}

// A guarded step writes nothing unless every guard holds: the task it
// would end stays active and the one it would claim stays where it was.
// With its guards holding, it ends, claims and peeks in one script, and
// sent in a pipeline after another command it reads what that command
// wrote (the commit of a store, in the drain of a hold).
func TestStepWithGuardsAndPeek(t *testing.T) {
	const q = "step_guard"
	db, cli, insp := stepQueue(t, q)
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c"} {
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}
	a, _, err := asynqwire.Step(ctx, db.Client, nil, q, "a")
	require.NoError(t, err)
	require.NoError(t, db.Client.HSet(ctx, "guard", "owner", "me", "d", "1").Err())
	require.NoError(t, db.Client.HSet(ctx, "peek", "p:3", "rec3").Err())
	guards := []asynqwire.Guard{{Key: "guard", Field: "owner", Value: "me"}, {Key: "guard", Field: "d", Value: "2"}}
	opt := asynqwire.StepOptions{Guards: guards, PeekKey: "peek", PeekFields: []string{"p:3", "k:3"}}

	_, _, err = asynqwire.StepWith(ctx, db.Client, &asynqwire.Outcome{Task: a}, q, "b", opt)
	require.ErrorIs(t, err, asynqwire.ErrUnguarded)
	for id, want := range map[string]asynq.TaskState{"a": asynq.TaskStateActive, "b": asynq.TaskStatePending} {
		info, err := insp.GetTaskInfo(q, id)
		require.NoError(t, err)
		assert.Equal(t, want, info.State, "%s: an unguarded step writes nothing", id)
	}
	// A missing field is no match either.
	_, _, err = asynqwire.StepWith(ctx, db.Client, nil, q, "b", asynqwire.StepOptions{Guards: []asynqwire.Guard{{Key: "guard", Field: "nope", Value: ""}}})
	require.ErrorIs(t, err, asynqwire.ErrUnguarded)

	// In a pipeline, after the write that makes the guards hold.
	pipe := db.Client.Pipeline()
	pipe.HSet(ctx, "guard", "d", "2")
	result, err := asynqwire.PipeStep(ctx, pipe, &asynqwire.Outcome{Task: a}, q, "b", opt)
	require.NoError(t, err)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	b, gone, err := result()
	require.NoError(t, err)
	require.False(t, gone)
	assert.Equal(t, "b", b.ID)
	require.Len(t, b.Peek, 2)
	require.NotNil(t, b.Peek[0])
	assert.Equal(t, "rec3", *b.Peek[0])
	assert.Nil(t, b.Peek[1], "a missing field peeks as nil")
	for id, want := range map[string]asynq.TaskState{"a": asynq.TaskStateCompleted, "b": asynq.TaskStateActive} {
		info, err := insp.GetTaskInfo(q, id)
		require.NoError(t, err)
		assert.Equal(t, want, info.State, id)
	}

	// A step of two queues cannot be one script.
	_, err = asynqwire.PipeStep(ctx, db.Client.Pipeline(), &asynqwire.Outcome{Task: b}, "other", "c", opt)
	require.Error(t, err)

	// A server without the script (restarted, flushed) refuses the piped
	// step, which writes nothing; StepWith loads it.
	require.NoError(t, db.Client.ScriptFlush(ctx).Err())
	pipe = db.Client.Pipeline()
	result, err = asynqwire.PipeStep(ctx, pipe, &asynqwire.Outcome{Task: b}, q, "c", asynqwire.StepOptions{})
	require.NoError(t, err)
	_, _ = pipe.Exec(ctx)
	_, _, err = result()
	require.ErrorContains(t, err, "NOSCRIPT")
	info, err := insp.GetTaskInfo(q, "b")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateActive, info.State)
	c, _, err := asynqwire.StepWith(ctx, db.Client, &asynqwire.Outcome{Task: b}, q, "c", asynqwire.StepOptions{})
	require.NoError(t, err)
	assert.Equal(t, "c", c.ID)
}

// stepQueue returns a Redis server, an asynq client and an inspector on
// it, and deletes queue q at cleanup.
func stepQueue(t *testing.T, q string) (*redistest.DB, *asynq.Client, *asynq.Inspector) {
	t.Helper()
	db := redistest.New(t)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	return db, asynq.NewClientFromRedisClient(db.Client), insp
}
