package keyorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// blockedReasons maps the keys Blocked lists, however young their heads,
// to their reasons.
func blockedReasons(t *testing.T, r *keyorder.Runner) map[string]string {
	t.Helper()
	bs, err := r.Blocked(t.Context(), keyorder.BlockedQuery{Queues: []string{"default"}, Scan: 100, After: time.Nanosecond})
	require.NoError(t, err)
	out := map[string]string{}
	for _, b := range bs.Keys {
		out[b.Head.Key] = b.Reason
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
	// Its head runs, with task 2 parked behind it: it waits, and is
	// blocked only once it has waited longer than the query's After.
	require.Equal(t, keyorder.BlockedWaiting, blockedReasons(t, r)["K"])
	bs, err := r.Blocked(ctx, keyorder.BlockedQuery{Queues: []string{"default"}})
	require.NoError(t, err)
	require.Empty(t, bs.Keys, "a head that runs is not blocked before a minute")
	require.Equal(t, 1, bs.Candidates)
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

// shardLocate is a RunnerConfig.Locate that looks a Client's task up in
// queue "elsewhere" first, then in the queue its label names: a program
// whose tasks may wait in more than one queue.
func shardLocate(_, label string) ([]string, string, bool) {
	queue, id, ok := strings.Cut(label, " ")
	return []string{"elsewhere", queue}, id, ok
}

// TestSkipHeadActsOnTheHeadRead: a program reads the head (found through
// its Locate), checks it itself, and skips it with a reason in its own
// words; a second skip of the same read finds the head moved on and skips
// nothing.
func TestSkipHeadActsOnTheHeadRead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{Locate: shardLocate})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	e1 := enqueue(t, c, "K", 1, asynq.Queue("shard"))
	e2 := enqueue(t, c, "K", 2, asynq.Queue("shard"))

	h, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, keyorder.Label("shard", e1.TaskID), h.Label)
	require.Equal(t, "shard", h.Queue, "found in the second queue Locate gives")
	require.Equal(t, e1.TaskID, h.TaskID)
	require.Equal(t, "pending", h.State)
	require.Equal(t, "order", h.Type)
	var b body
	require.NoError(t, json.Unmarshal(h.Payload, &b))
	require.Equal(t, body{Key: "K", N: 1, Seq: e1.Pos}, b)
	require.ErrorIs(t, r.RetryHead(ctx, h), keyorder.ErrNothingToDo, "a pending task is due already")

	sk, err := r.SkipHead(ctx, h, "skipped by ops: poison")
	require.NoError(t, err)
	require.True(t, sk.Archived)
	require.True(t, sk.Done)
	requireState(t, db.Client, e1, asynq.TaskStateArchived, "")
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo("shard", e1.TaskID)
	require.NoError(t, err)
	require.Equal(t, "skipped by ops: poison", info.LastErr, "the reason as given")
	st, err := r.Sequencer().Status(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, keyorder.Settled{Pos: e1.Pos, At: st.Log[len(st.Log)-1].At, Kind: "skip", Label: h.Label, Reason: "skipped by ops: poison"},
		st.Log[len(st.Log)-1])

	again, err := r.SkipHead(ctx, h, "skipped by ops: again")
	require.NoError(t, err)
	require.Equal(t, keyorder.Skipped{}, again, "the head moved on: nothing more is skipped")
	next, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, e2.Pos, next.Pos)
}

// TestSkipHeadAndRetryHeadOfARunningOrGoneTask: asynq's refusals reach the
// caller: a task that started since the head was read is not archived (a
// *StateError), and a task deleted since is not run (asynq's
// ErrTaskNotFound, not the Runner's refusal).
func TestSkipHeadAndRetryHeadOfARunningOrGoneTask(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	e1 := enqueue(t, c, "K", 1, asynq.ProcessIn(time.Hour))
	enqueue(t, c, "K", 2)
	h, err := r.Head(ctx, "K")
	require.NoError(t, err)
	require.Equal(t, "scheduled", h.State)

	require.NoError(t, asynq.NewInspectorFromRedisClient(db.Client).DeleteTask(e1.Queue, e1.TaskID))
	err = r.RetryHead(ctx, h)
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
	require.NotErrorIs(t, err, keyorder.ErrNothingToDo, "asynq's own error, for the caller to word")

	// A task that runs: K's head, held in its handler.
	started, open := make(chan struct{}), make(chan struct{})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(gate("L", 1, started, open)))
	enqueue(t, c, "L", 1)
	enqueue(t, c, "L", 2)
	<-started
	lh, err := r.Head(ctx, "L")
	require.NoError(t, err)
	require.Equal(t, "active", lh.State)
	var se *keyorder.StateError
	_, err = r.SkipHead(ctx, lh, "no")
	require.ErrorAs(t, err, &se)
	require.Equal(t, "active", se.State)
	// A head read just before its task started: asynq's archive refuses it.
	lh.State = "pending"
	_, err = r.SkipHead(ctx, lh, "no")
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, keyorder.ErrNothingToDo)
	require.Equal(t, "active", se.State)
	requireState(t, db.Client, keyorder.Enqueued{Queue: lh.Queue, TaskID: lh.TaskID}, asynq.TaskStateActive, "")
	st, err := r.Sequencer().Status(ctx, "L")
	require.NoError(t, err)
	require.Empty(t, st.Log, "nothing was skipped")
	close(open)
	eventually(t, func() bool { return len(rc.succeeded("L")) == 2 }, "L's tasks did not run")
}

// TestWakeLooksWhereLocateSays: Wake brings a position's task to the front
// of the queue Locate finds it in.
func TestWakeLooksWhereLocateSays(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{Locate: shardLocate})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	ctx := t.Context()
	enqueue(t, c, "A", 1, asynq.Queue("shard"))
	e := enqueue(t, c, "K", 1, asynq.Queue("shard"))
	front := func() string {
		id, err := db.Client.LIndex(ctx, "asynq:{shard}:pending", -1).Result()
		require.NoError(t, err)
		return id
	}
	require.NotEqual(t, e.TaskID, front())
	require.NoError(t, r.Wake(ctx, "K", []string{keyorder.Label("shard", e.TaskID), keyorder.Label("shard", "absent"), "no task"}))
	require.Equal(t, e.TaskID, front(), "first in line")
}

// TestTurnsOfARunnerSettleACreation: a settlement made outside a run on the
// Runner's Turns (a creation that another key's task reserved) lets the
// task parked behind it run at once, through the Runner's wake.
func TestTurnsOfARunnerSettleACreation(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	// A GapWait of a minute: only the settlement lets task 1 run.
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: time.Minute})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: time.Minute})
	ctx := t.Context()
	_, err := r.Sequencer().Reserve(ctx, "NEW", "creation ev1", keyorder.CreationRef("ev1"))
	require.NoError(t, err)
	e := enqueue(t, c, "NEW", 1)
	requireState(t, db.Client, e, asynq.TaskStateRetry, "") // parked behind the creation
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))

	settled := time.Now()
	r.Created(ctx, "NEW", "ev1", "ev1 of OLD", nil)
	eventually(t, func() bool { return len(rc.succeeded("NEW")) == 1 }, "task 1 did not run after the creation")
	require.Less(t, time.Since(settled), 10*time.Second, "the creation did not bring task 1 back promptly")

}

// TestRunnerLogsTheKeyAsKeyField: a missing head skipped by the gap check
// is logged with the key named as RunnerConfig.KeyField says.
func TestRunnerLogsTheKeyAsKeyField(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const gapWait = 100 * time.Millisecond
	core, logs := observer.New(zap.WarnLevel)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: gapWait, KeyField: "account", Logger: logging.Slog(zap.New(core))})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: gapWait})
	gone := enqueue(t, c, "G", 1, asynq.ProcessIn(time.Hour))
	require.NoError(t, asynq.NewInspectorFromRedisClient(db.Client).DeleteTask(gone.Queue, gone.TaskID))
	enqueue(t, c, "G", 2)
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("G")) == 1 }, "G's task 2 did not run after its gap")
	skips := logs.FilterMessage("position skipped").FilterField(zap.String("account", "G")).All()
	require.NotEmpty(t, skips, "no skip logged with the key as account: %v", logs.All())
}
