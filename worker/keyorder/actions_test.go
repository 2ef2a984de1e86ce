package keyorder_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// blockedReasons maps the keys Blocked lists to their reasons.
func blockedReasons(t *testing.T, r *keyorder.Runner) map[string]string {
	t.Helper()
	bs, err := r.Blocked(t.Context(), []string{"default"}, 100)
	require.NoError(t, err)
	out := map[string]string{}
	for _, b := range bs {
		out[b.Key] = b.Reason
	}
	return out
}

func TestHoldStopsAKeyAndResumeBringsItBack(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	// The default GapWait (30 s): a held task parks that long, so only
	// Resume's call back brings it back within the test's patience.
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	var calls sync.Map
	startServerCounting(t, db.Client, r, 4, rc.wrap(nil), &calls)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()

	_, err := r.Head(ctx, "A")
	require.ErrorIs(t, err, keyorder.ErrNothingToDo, "nothing of A waits")
	require.ErrorIs(t, r.Resume(ctx, "A"), keyorder.ErrNothingToDo, "A is not on hold")
	require.NoError(t, r.Hold(ctx, "A", "ops", "investigating"))
	require.ErrorIs(t, r.Hold(ctx, "A", "ops", "again"), keyorder.ErrNothingToDo)

	enqueue(t, c, "A", 1)
	enqueue(t, c, "A", 2)
	enqueue(t, c, "B", 1)
	eventually(t, func() bool { return len(rc.succeeded("B")) == 1 }, "B did not run while A was held")
	eventually(t, func() bool { return callsOf(&calls, "A", 1) > 0 }, "A's head never came")
	require.Empty(t, rc.succeeded("A"), "a task of a held key ran")

	h, err := r.Head(ctx, "A")
	require.NoError(t, err)
	require.NotNil(t, h.Held)
	require.Equal(t, int64(2), h.Waiting)
	require.Equal(t, "held", blockedReasons(t, r)["A"])
	require.ErrorIs(t, r.Retry(ctx, "A"), keyorder.ErrNothingToDo, "Retry of a held key")

	resumed := time.Now()
	require.NoError(t, r.Resume(ctx, "A"))
	eventually(t, func() bool { return len(rc.succeeded("A")) == 2 }, "A did not run after Resume")
	require.Less(t, time.Since(resumed), 5*time.Second, "Resume did not bring A back promptly")
	require.Equal(t, []int{1, 2}, rc.succeeded("A"))
	require.NotContains(t, blockedReasons(t, r), "A")
}

// alwaysFail fails task number task of key, counting its runs.
func alwaysFail(key string, task int, runs *atomic.Int32) func(context.Context, body, keyorder.Run) error {
	return func(_ context.Context, b body, _ keyorder.Run) error {
		if b.Key == key && b.N == task {
			runs.Add(1)
			return errors.New("always fails")
		}
		return nil
	}
}

func TestSkipAFailingHead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	var runs atomic.Int32
	startServer(t, db.Client, r, 4, rc.wrap(alwaysFail("K", 1, &runs)))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	e1 := enqueue(t, c, "K", 1, asynq.MaxRetry(5))
	enqueue(t, c, "K", 2, asynq.MaxRetry(5))

	var h keyorder.Head
	eventually(t, func() bool {
		var err error
		h, err = r.Head(ctx, "K")
		return err == nil && h.State == "retry" && h.Retried == 1
	}, "task 1 did not fail")
	require.Equal(t, e1.TaskID, h.TaskID)
	require.Equal(t, e1.Pos, h.Pos)
	require.Contains(t, h.LastErr, "always fails")
	require.Equal(t, "failing", blockedReasons(t, r)["K"])
	require.Empty(t, rc.succeeded("K"))

	require.NoError(t, r.Skip(ctx, "K", "poison"))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "task 2 did not run after the skip")
	require.Equal(t, []int{2}, rc.succeeded("K"))
	requireState(t, db.Client, e1, asynq.TaskStateArchived, "skipped: poison")
	require.Equal(t, int32(1), runs.Load(), "the skipped task ran again")
	require.ErrorIs(t, r.Skip(ctx, "K", "again"), keyorder.ErrNothingToDo, "nothing of K waits")
	require.ErrorIs(t, r.Retry(ctx, "K"), keyorder.ErrNothingToDo, "nothing of K waits")
}

func TestRetryRunsABackingOffHeadAtOnce(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	var runs atomic.Int32
	startServer(t, db.Client, r, 4, rc.wrap(failFirst(1, 1, &runs)))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	enqueue(t, c, "K", 1, asynq.MaxRetry(3))
	enqueue(t, c, "K", 2)
	eventually(t, func() bool {
		h, err := r.Head(ctx, "K")
		return err == nil && h.State == "retry" && h.Retried == 1
	}, "task 1 did not fail")
	// asynq's backoff after a first failure is at least 15 s.
	retried := time.Now()
	require.NoError(t, r.Retry(ctx, "K"))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "the tasks did not run after Retry")
	require.Less(t, time.Since(retried), 10*time.Second)
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
}

func TestActionsRefuseARunningHead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	started, open := make(chan struct{}), make(chan struct{})
	startServer(t, db.Client, r, 4, rc.wrap(gate("K", 1, started, open)))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	enqueue(t, c, "K", 1)
	enqueue(t, c, "K", 2)
	<-started
	h, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, "active", h.State)
	require.ErrorIs(t, r.Skip(ctx, "K", "no"), keyorder.ErrNothingToDo)
	require.ErrorIs(t, r.Retry(ctx, "K"), keyorder.ErrNothingToDo)
	require.NotContains(t, blockedReasons(t, r), "K", "a running head is not blocked")
	close(open)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "the tasks did not run")
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
}

func TestSkipAMissingHead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	e1 := enqueue(t, c, "K", 1)
	enqueue(t, c, "K", 2)
	require.NoError(t, asynq.NewInspectorFromRedisClient(db.Client).DeleteTask(e1.Queue, e1.TaskID))
	// A GapWait of a minute: only the operator's skip lets task 2 run.
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: time.Minute})
	h, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, keyorder.StateMissing, h.State)
	require.Equal(t, "gap", blockedReasons(t, r)["K"])
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	require.NoError(t, r.Skip(ctx, "K", "deleted by hand"))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "task 2 did not run after the skip")
}

// TestHoldWhileTheHeadRuns: the running task ends, and the next one waits
// for Resume.
func TestHoldWhileTheHeadRuns(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	started, open := make(chan struct{}), make(chan struct{})
	var calls sync.Map
	startServerCounting(t, db.Client, r, 4, rc.wrap(gate("K", 1, started, open)), &calls)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	enqueue(t, c, "K", 1)
	enqueue(t, c, "K", 2)
	<-started
	require.NoError(t, r.Hold(ctx, "K", "ops", "stop after this one"))
	close(open)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "the running task did not end")
	eventually(t, func() bool {
		h, err := r.Head(ctx, "K")
		return callsOf(&calls, "K", 2) > 0 && err == nil && h.State == "retry"
	}, "task 2 never came back to wait")
	require.Equal(t, []int{1}, rc.succeeded("K"), "a task of a held key ran")
	require.NoError(t, r.Resume(ctx, "K"))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "task 2 did not run after Resume")
}

// TestRetryRunsAScheduledHeadNow: a head enqueued to run in an hour runs
// at once on Retry, and the task behind it after it.
func TestRetryRunsAScheduledHeadNow(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	e1 := enqueue(t, c, "K", 1, asynq.ProcessIn(time.Hour))
	enqueue(t, c, "K", 2)
	h, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, "scheduled", h.State)
	require.Equal(t, e1.Pos, h.Pos)
	require.Equal(t, int64(2), h.Waiting)
	require.NoError(t, r.Retry(ctx, "K"))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "the tasks did not run after Retry")
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
}
