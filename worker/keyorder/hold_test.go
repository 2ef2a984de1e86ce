package keyorder_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file hold a hot key's lock across its tasks (the
// Runner's drain, Turns.Drain): the tasks of one key are enqueued before
// the server starts, so that every one after the first is parked.

// hotKey enqueues tasks 1..n of key with c.
func hotKey(t *testing.T, c *keyorder.Client, key string, n int, opts ...asynq.Option) []keyorder.Enqueued {
	t.Helper()
	out := make([]keyorder.Enqueued, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, enqueue(t, c, key, i, opts...))
	}
	return out
}

// seq returns 1..n.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// A hot key's tasks after the first run in the first one's hold, in
// order, each as its own run with the hold's fence (asynq's getters
// report its own task), and asynq records each one's end.
func TestRunnerDrainsAHotKey(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	const n = 30
	es := hotKey(t, c, "K", n)
	holds := make(chan keyorder.HoldDone, 10)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{OnHold: func(h keyorder.HoldDone) {
		select {
		case holds <- h:
		default: // more holds than expected: the check below fails
		}
	}})
	rc := newRecorder()
	var ids sync.Map // task number -> what asynq.GetTaskID said in its run
	startServer(t, db.Client, r, 4, rc.wrap(func(ctx context.Context, b body, _ keyorder.Run) error {
		id, _ := asynq.GetTaskID(ctx)
		ids.Store(b.N, id)
		return nil
	}))
	eventually(t, func() bool { return len(rc.succeeded("K")) == n }, "the tasks did not all run")
	require.Equal(t, seq(n), rc.succeeded("K"))
	for i, e := range es {
		id, _ := ids.Load(i + 1)
		require.Equal(t, e.TaskID, id, "task %d: asynq.GetTaskID in its run", i+1)
	}
	runs := rc.all()
	require.Len(t, runs, n, "a task ran more than once")
	for i, x := range runs {
		require.Equal(t, i, x.Held, "task %d: not the %d. run of one hold", x.N, i+1)
		require.Equal(t, keyorder.ModeTurn, x.Mode)
		require.Equal(t, runs[0].Fence, x.Fence, "task %d: a held run has its hold's fence", x.N)
	}
	require.Empty(t, rc.overlaps)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	for _, e := range es {
		eventually(t, func() bool {
			_, err := insp.GetTaskInfo(e.Queue, e.TaskID)
			return errors.Is(err, asynq.ErrTaskNotFound)
		}, "task %s: its end was not recorded in asynq", e.TaskID)
	}
	h, err := r.Head(t.Context(), "K")
	require.ErrorIs(t, err, keyorder.ErrNothingToDo, "head %+v", h)
	select {
	case hd := <-holds:
		require.Equal(t, "K", hd.Key)
		require.Equal(t, n, hd.Runs, "OnHold: one hold ran every task")
		require.False(t, hd.Yielded)
		require.Positive(t, hd.Took)
	case <-time.After(10 * time.Second):
		t.Fatal("OnHold was not called")
	}
	require.Empty(t, holds, "OnHold called for more than one hold")
}

// DrainMax 1 turns the drain off: each task runs from its queue.
func TestRunnerDrainMaxOneDoesNotHold(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	const n = 5
	hotKey(t, c, "K", n)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{DrainMax: 1})
	rc := newRecorder()
	startServer(t, db.Client, r, 4, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == n }, "the tasks did not all run")
	require.Equal(t, seq(n), rc.succeeded("K"))
	var fence int64
	for _, x := range rc.all() {
		require.Zero(t, x.Held, "task %d ran in a hold", x.N)
		require.Greater(t, x.Fence, fence)
		fence = x.Fence
	}
}

// A hold whose quantum (DrainMax) is spent while the server is busy lets
// the key's next task go back to its queue: no hold runs more than
// DrainMax tasks, and the key's order holds across the holds.
func TestRunnerHoldYieldsAfterItsQuantum(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	const n, quantum = 12, 3
	hotKey(t, c, "K", n)
	for i := range 5 {
		enqueue(t, c, fmt.Sprint("other", i), 1)
	}
	var yielded atomic.Int32
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{DrainMax: quantum, OnHold: func(h keyorder.HoldDone) {
		if h.Key == "K" && h.Yielded {
			yielded.Add(1)
		}
	}})
	rc := newRecorder()
	// One slot, in use by the hold's first run: the server is busy.
	startServer(t, db.Client, r, 1, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == n }, "the tasks did not all run")
	require.Equal(t, seq(n), rc.succeeded("K"))
	holds := 0
	for _, x := range rc.all() {
		if x.Key != "K" {
			continue
		}
		require.Less(t, x.Held, quantum, "task %d: a hold ran past its quantum", x.N)
		if x.Held == 0 {
			holds++
		}
	}
	require.GreaterOrEqual(t, holds, n/quantum, "the holds did not yield")
	require.Positive(t, yielded.Load(), "OnHold: no hold said it yielded")
	require.Empty(t, rc.overlaps)
}

// A task that fails in a hold ends the hold. Within its budget it keeps
// its turn and backs off (the tasks behind it wait); at a budget of 0 it
// is archived in its turn, which passes on.
func TestRunnerFailureInAHold(t *testing.T) {
	t.Parallel()
	for _, maxRetry := range []int{0, 2} {
		t.Run(fmt.Sprint("MaxRetry=", maxRetry), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			es := hotKey(t, c, "K", 5, asynq.MaxRetry(maxRetry))
			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
				RetryDelay: func(int, error, *asynq.Task) time.Duration { return 20 * time.Millisecond },
			})
			rc := newRecorder()
			var runs atomic.Int32
			startServer(t, db.Client, r, 4, rc.wrap(failFirst(3, 1, &runs)))
			want := []int{1, 2, 3, 4, 5}
			if maxRetry == 0 {
				want = []int{1, 2, 4, 5}
			}
			eventually(t, func() bool { return len(rc.succeeded("K")) == len(want) }, "the tasks did not all run")
			require.Equal(t, want, rc.succeeded("K"))
			var third []ran
			for _, x := range rc.all() {
				if x.N == 3 {
					third = append(third, x)
				}
			}
			require.Equal(t, 2, third[0].Held, "task 3 first ran in task 1's hold")
			require.False(t, third[0].OK)
			if maxRetry == 0 {
				require.Len(t, third, 1, "task 3 ran again past its budget of 0")
				requireState(t, db.Client, es[2], asynq.TaskStateArchived, "boom")
				return
			}
			require.Len(t, third, 2)
			require.Zero(t, third[1].Held, "task 3 ran again from its queue, after the hold ended")
			require.Greater(t, third[1].Fence, third[0].Fence)
			require.Empty(t, rc.overlaps)
		})
	}
}

// A hold runs a task with the handler that ran its type before: a task of
// a type the Runner has not run yet goes back to its queue, and runs in
// its turn from there.
func TestRunnerHoldOfATypeNotRunYet(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for i, typ := range []string{"a", "b", "a", "b"} {
		_, err := c.Enqueue(t.Context(), "K", asynq.NewTask(typ, payload(t, "K", i+1)))
		require.NoError(t, err)
	}
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	mux := asynq.NewServeMux()
	mux.Handle("a", r.Handler(rc.wrap(nil)))
	mux.Handle("b", r.Handler(rc.wrap(nil)))
	srv := asynq.NewServerFromRedisClient(db.Client, r.ServerConfig(asynq.Config{
		Concurrency: 2, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
	}))
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 4 }, "the tasks did not all run")
	require.Equal(t, seq(4), rc.succeeded("K"))
	runs := rc.all()
	require.Zero(t, runs[1].Held, "task 2, of type b, ran from its queue")
	require.Equal(t, 1, runs[2].Held, "task 3, of type a, ran in task 2's hold")
	require.Equal(t, 2, runs[3].Held, "task 4, of type b, ran in that hold too, once b had run")
	require.Empty(t, rc.overlaps)
}

// A hold ends at a shutdown, and the tasks it had not run stay in asynq
// and run, in order, on the next server. Without Stop, the shutdown
// cancels the held run past its timeout: asynq puts the hold's first task
// back, and it runs again (as a passed position: asynq delivers at least
// once). With Stop first, the hold ends before its next task, well within
// the timeout, and no task runs twice.
func TestRunnerHoldAtShutdown(t *testing.T) {
	t.Parallel()
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprint("Stop=", stop), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			const n = 6
			hotKey(t, c, "K", n)
			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
			rc := newRecorder()
			started, open := make(chan struct{}), make(chan struct{})
			timeout := 100 * time.Millisecond
			if stop {
				timeout = 10 * time.Second
			}
			srv := asynq.NewServerFromRedisClient(db.Client, r.ServerConfig(asynq.Config{
				Concurrency: 2, LogLevel: asynq.FatalLevel, ShutdownTimeout: timeout,
				TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
			}))
			require.NoError(t, srv.Start(r.Handler(rc.wrap(gate("K", 3, started, open)))))
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("task 3 never started")
			}
			want := []int{1, 2}
			if stop {
				r.Stop()
				close(open)
				srv.Shutdown()
				want = []int{1, 2, 3}
			} else {
				srv.Shutdown() // cancels task 3's run, in task 1's hold
				close(open)
			}
			require.Equal(t, want, rc.succeeded("K"))

			r2 := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
			startServer(t, db.Client, r2, 2, rc.wrap(nil))
			inTurn := func() (ns []int) {
				for _, x := range rc.all() {
					if x.OK && x.Mode == keyorder.ModeTurn {
						ns = append(ns, x.N)
					}
				}
				return ns
			}
			eventually(t, func() bool { return len(inTurn()) == n }, "the tasks did not all run after the restart")
			require.Equal(t, seq(n), inTurn())
			for _, x := range rc.all() {
				if x.Mode != keyorder.ModeTurn {
					require.False(t, stop, "task %d ran again after a Stop: %+v", x.N, x)
					require.Equal(t, 1, x.N, "task %d ran again: %+v", x.N, x)
					require.Equal(t, keyorder.ModePassed, x.Mode)
				}
			}
		})
	}
}
