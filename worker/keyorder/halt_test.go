package keyorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The failure policy: a key whose head fails past its budget under
// FailureHalt keeps that head, runs nothing behind it, and is listed as
// halted until an operator acts.

// haltAll is a RunnerConfig.Failure that halts every task.
func haltAll(*asynq.Task) keyorder.FailurePolicy { return keyorder.FailureHalt }

// haltSetup is a halting Runner on rdb with a GapWait short enough that a
// key whose archived head were skipped would go on within the test, its
// server (concurrency 4, counting each task's calls in calls) running
// queue, and a Client that parks briefly.
type haltSetup struct {
	r     *keyorder.Runner
	c     *keyorder.Client
	rc    *recorder
	calls *sync.Map
	queue string
}

func newHaltSetup(t *testing.T, rdb redis.UniversalClient, prefix, queue string, failure func(*asynq.Task) keyorder.FailurePolicy,
	fn func(ctx context.Context, b body, run keyorder.Run) error, start bool) *haltSetup {
	t.Helper()
	s := &haltSetup{rc: newRecorder(), calls: new(sync.Map), queue: queue}
	s.r = newRunner(t, rdb, prefix, keyorder.RunnerConfig{Failure: failure, GapWait: 100 * time.Millisecond})
	s.c = newClient(t, rdb, prefix, keyorder.ClientConfig{ParkFor: 100 * time.Millisecond})
	if start {
		s.start(t, rdb, fn)
	}
	return s
}

func (s *haltSetup) start(t *testing.T, rdb redis.UniversalClient, fn func(ctx context.Context, b body, run keyorder.Run) error) {
	t.Helper()
	handler := s.r.Handler(s.rc.wrap(fn))
	inner := handler
	handler = asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var b body
		_ = json.Unmarshal(task.Payload(), &b)
		n, _ := s.calls.LoadOrStore(b.Key+"/"+fmt.Sprint(b.N), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return inner.ProcessTask(ctx, task)
	})
	srv := asynq.NewServerFromRedisClient(rdb, s.r.ServerConfig(asynq.Config{
		Concurrency: 4, LogLevel: asynq.FatalLevel, Queues: map[string]int{s.queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}))
	require.NoError(t, srv.Start(handler))
	t.Cleanup(srv.Shutdown)
}

func (s *haltSetup) enqueue(t *testing.T, key string, n int) keyorder.Enqueued {
	t.Helper()
	return enqueue(t, s.c, key, n, asynq.MaxRetry(0), asynq.Queue(s.queue))
}

// blocked returns key as Blocked lists it (nil: not listed).
func (s *haltSetup) blocked(t *testing.T, key string) *keyorder.Blocked {
	t.Helper()
	bs, err := s.r.Blocked(t.Context(), keyorder.BlockedQuery{Queues: []string{s.queue}, Scan: 100, After: time.Nanosecond})
	require.NoError(t, err)
	for _, b := range bs.Keys {
		if b.Head.Key == key {
			return &b
		}
	}
	return nil
}

// requireHalted waits until key is halted at e's position with its task
// archived, and until task n behind it has come back for its turn at
// least three times (each past the GapWait, so that a skip of the
// archived head would have happened), and requires that nothing of key
// succeeded; the halt's reason and the head's last error hold reason and
// lastErr.
func (s *haltSetup) requireHalted(t *testing.T, key string, e keyorder.Enqueued, behind int, reason, lastErr string) keyorder.Head {
	t.Helper()
	var h keyorder.Head
	eventually(t, func() bool {
		var err error
		h, err = s.r.Head(t.Context(), key)
		return err == nil && h.Held != nil && h.Held.Halted != "" && h.State == asynq.TaskStateArchived.String()
	}, "%s was not halted with its head archived", key)
	require.Equal(t, e.Pos, h.Pos, "halted at another position")
	require.Equal(t, e.TaskID, h.TaskID)
	require.Equal(t, h.Label, h.Held.Halted)
	require.Contains(t, h.Held.Reason, reason)
	eventually(t, func() bool { return callsOf(s.calls, key, behind) >= 3 }, "task %d never came back for its turn", behind)
	require.Empty(t, s.rc.succeeded(key), "a task ran behind the halted head")
	b := s.blocked(t, key)
	require.NotNil(t, b, "the halted key is not listed")
	require.Equal(t, keyorder.BlockedHalted, b.Reason)
	require.Contains(t, b.Head.LastErr, lastErr)
	require.Contains(t, b.Head.Held.Reason, reason)
	return h
}

func TestHaltAtBudgetZeroHoldsTheKeyUntilTheHeadIsRetried(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	var fails atomic.Int32
	s := newHaltSetup(t, db.Client, db.Prefix, "default", haltAll, failFirst(1, 1, &fails), true)
	e1 := s.enqueue(t, "K", 1)
	s.enqueue(t, "K", 2)
	s.requireHalted(t, "K", e1, 2, "boom", "boom")
	require.Equal(t, int32(1), fails.Load(), "the halted head ran again by itself")
	require.ErrorIs(t, s.r.Resume(t.Context(), "K"), keyorder.ErrNothingToDo, "a resume of a halted key whose head is archived")
	require.ErrorIs(t, s.r.Hold(t.Context(), "K", "ops", "too"), keyorder.ErrNothingToDo, "a hold of a halted key")

	require.NoError(t, s.r.Retry(t.Context(), "K"))
	eventually(t, func() bool { return len(s.rc.succeeded("K")) == 2 }, "the head and the task behind it did not run after the retry")
	require.Equal(t, []int{1, 2}, s.rc.succeeded("K"), "not in order")
	require.Nil(t, s.blocked(t, "K"), "still listed")
	st, err := s.r.Sequencer().Status(t.Context(), "K")
	require.NoError(t, err)
	require.Nil(t, st.Paused)
	require.Empty(t, s.rc.overlaps)
}

func TestHaltThenSkipLetsTheNextGo(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	var fails atomic.Int32
	s := newHaltSetup(t, db.Client, db.Prefix, "default", haltAll, failFirst(1, 100, &fails), true)
	e1 := s.enqueue(t, "K", 1)
	s.enqueue(t, "K", 2)
	s.requireHalted(t, "K", e1, 2, "boom", "boom")
	require.NoError(t, s.r.Skip(t.Context(), "K", "poison"))
	eventually(t, func() bool { return len(s.rc.succeeded("K")) == 1 }, "task 2 did not run after the skip")
	require.Equal(t, []int{2}, s.rc.succeeded("K"))
	require.Equal(t, int32(1), fails.Load())
	require.Nil(t, s.blocked(t, "K"))
}

func TestContinueArchivesAndTheNextGoes(t *testing.T) {
	t.Parallel()
	policies := map[string]func(*asynq.Task) keyorder.FailurePolicy{
		"unset":    nil,
		"continue": func(*asynq.Task) keyorder.FailurePolicy { return keyorder.FailureContinue },
	}
	for name, failure := range policies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			var fails atomic.Int32
			s := newHaltSetup(t, db.Client, db.Prefix, "default", failure, failFirst(1, 100, &fails), true)
			e1 := s.enqueue(t, "K", 1)
			s.enqueue(t, "K", 2)
			eventually(t, func() bool { return len(s.rc.succeeded("K")) == 1 }, "task 2 never ran after task 1 was archived")
			require.Equal(t, []int{2}, s.rc.succeeded("K"))
			requireState(t, db.Client, e1, asynq.TaskStateArchived, "boom")
			st, err := s.r.Sequencer().Status(t.Context(), "K")
			require.NoError(t, err)
			require.Nil(t, st.Paused)
		})
	}
}

// TestHaltedKeyRunsNothingWhateverTheWritesACrashLeft simulates a worker
// that dies between the halt (written in the release, before asynq
// archives the task) and asynq's archive, one write at a time: either
// alone keeps the task behind from running.
func TestHaltedKeyRunsNothingWhateverTheWritesACrashLeft(t *testing.T) {
	t.Parallel()
	t.Run("archived, not halted", func(t *testing.T) {
		t.Parallel()
		db := redistest.New(t)
		s := newHaltSetup(t, db.Client, db.Prefix, "default", haltAll, nil, false)
		e1 := s.enqueue(t, "K", 1)
		s.enqueue(t, "K", 2)
		require.NoError(t, asynq.NewInspectorFromRedisClient(db.Client).ArchiveTask(e1.Queue, e1.TaskID))
		s.start(t, db.Client, nil)
		s.requireHalted(t, "K", e1, 2, "was archived", "") // asynq's ArchiveTask records no error
		require.NoError(t, s.r.Retry(t.Context(), "K"))
		eventually(t, func() bool { return len(s.rc.succeeded("K")) == 2 }, "the tasks did not run after the retry")
		require.Equal(t, []int{1, 2}, s.rc.succeeded("K"))
	})
	t.Run("halted, not archived", func(t *testing.T) {
		t.Parallel()
		db := redistest.New(t)
		s := newHaltSetup(t, db.Client, db.Prefix, "default", haltAll, nil, false)
		e1 := s.enqueue(t, "K", 1)
		s.enqueue(t, "K", 2)
		done, err := s.r.Halt(t.Context(), "K", e1.Pos, keyorder.Label(e1.Queue, e1.TaskID), "boom")
		require.NoError(t, err)
		require.True(t, done)
		s.start(t, db.Client, nil)
		eventually(t, func() bool { return callsOf(s.calls, "K", 1) >= 2 && callsOf(s.calls, "K", 2) >= 2 }, "the tasks never came for their turn")
		require.Empty(t, s.rc.succeeded("K"), "a task of a halted key ran")
		b := s.blocked(t, "K")
		require.NotNil(t, b)
		require.Equal(t, keyorder.BlockedHalted, b.Reason)
		require.Equal(t, "boom", b.Head.Held.Reason)
		require.NoError(t, s.r.Retry(t.Context(), "K"))
		eventually(t, func() bool { return len(s.rc.succeeded("K")) == 2 }, "the tasks did not run after the retry")
		require.Equal(t, []int{1, 2}, s.rc.succeeded("K"))
	})
}

// TestHaltOnCluster halts a key on a Redis Cluster: the halt rides in
// the release on the key's slot, and the index of paused keys is written
// apart.
func TestHaltOnCluster(t *testing.T) {
	t.Parallel()
	db := redistest.NewCluster(t)
	queue := strings.NewReplacer(" ", "", "{", "", "}", "").Replace(db.Prefix) + "q"
	t.Cleanup(func() { cleanAsynq(t, db.Client, queue) })
	keys := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprint("HK-", i) })
	haltAndRetry(t, db.NewClient(t), db.Prefix, queue, keys[len(keys)-1])
}

// TestHaltOnSentinel halts a key through a Sentinel group's master.
func TestHaltOnSentinel(t *testing.T) {
	t.Parallel()
	db := redistest.NewSentinel(t)
	queue := strings.NewReplacer(" ", "", "{", "", "}", "").Replace(db.Prefix) + "q"
	haltAndRetry(t, db.NewClient(t), db.Prefix, queue, "HS")
}

// haltAndRetry halts key with a task of MaxRetry 0 that fails once, then
// retries its head: both tasks run, in order.
func haltAndRetry(t *testing.T, rdb redis.UniversalClient, prefix, queue, key string) {
	t.Helper()
	var fails atomic.Int32
	s := newHaltSetup(t, rdb, prefix, queue, haltAll, failFirst(1, 1, &fails), true)
	e1 := s.enqueue(t, key, 1)
	s.enqueue(t, key, 2)
	s.requireHalted(t, key, e1, 2, "boom", "boom")
	require.NoError(t, s.r.Retry(t.Context(), key))
	eventually(t, func() bool { return len(s.rc.succeeded(key)) == 2 }, "the tasks did not run after the retry")
	require.Equal(t, []int{1, 2}, s.rc.succeeded(key))
}
