package keyorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file run a Runner's handler in real asynq servers on
// a real Redis, with tasks enqueued by a Client.

// body is the payload of the test tasks: the key, and the task's number.
type body struct {
	Key string `json:"key"`
	N   int    `json:"n"`
	Seq int64  `json:"seq,omitempty"`
}

func payload(t testing.TB, key string, n int) []byte {
	t.Helper()
	b, err := json.Marshal(body{Key: key, N: n})
	require.NoError(t, err)
	return b
}

// keyOf is the RunnerConfig.Key of the test tasks.
func keyOf(t *asynq.Task) (string, error) {
	var b body
	if err := json.Unmarshal(t.Payload(), &b); err != nil {
		return "", err
	}
	if b.Key == "" {
		return "", errors.New("the task has no key")
	}
	return b.Key, nil
}

// fastWait keeps the in-handler waits short.
var fastWait = keyorder.Wait{MinDelay: 5 * time.Millisecond, MaxDelay: 30 * time.Millisecond, Deadline: 2 * time.Second}

func newRunner(t *testing.T, rdb redis.UniversalClient, prefix string, cfg keyorder.RunnerConfig) *keyorder.Runner {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = keyOf
	}
	cfg.Wait = cfg.Wait.Or(fastWait)
	if cfg.BusyRetryMin == 0 {
		cfg.BusyRetryMin, cfg.BusyRetryMax = 10*time.Millisecond, 50*time.Millisecond
	}
	r, err := keyorder.NewRunner(space(t, rdb, prefix, keyorder.SeqConfig{}), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

func newClient(t *testing.T, rdb redis.UniversalClient, prefix string, cfg keyorder.ClientConfig) *keyorder.Client {
	t.Helper()
	return newCappedClient(t, rdb, prefix, 0, cfg)
}

// newCappedClient is newClient with SeqConfig.MaxWaiting max.
func newCappedClient(t *testing.T, rdb redis.UniversalClient, prefix string, max int64, cfg keyorder.ClientConfig) *keyorder.Client {
	t.Helper()
	c, err := keyorder.NewClient(space(t, rdb, prefix, keyorder.SeqConfig{MaxWaiting: max}), cfg)
	require.NoError(t, err)
	return c
}

// startServer runs an asynq server on rdb whose handler for every task
// type is r.Handler(h), shut down at cleanup (before the Runner closes:
// cleanups run last first).
func startServer(t *testing.T, rdb redis.UniversalClient, r *keyorder.Runner, concurrency int, h asynq.HandlerFunc) {
	t.Helper()
	startServerCounting(t, rdb, r, concurrency, h, nil)
}

// startServerCounting is startServer that counts in calls every call of
// the Runner's handler, waits included (nil: no count).
func startServerCounting(t *testing.T, rdb redis.UniversalClient, r *keyorder.Runner, concurrency int, h asynq.HandlerFunc, calls *sync.Map) {
	t.Helper()
	handler := r.Handler(h)
	if calls != nil {
		inner := handler
		handler = asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			var b body
			_ = json.Unmarshal(t.Payload(), &b)
			n, _ := calls.LoadOrStore(b.Key+"/"+fmt.Sprint(b.N), new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return inner.ProcessTask(ctx, t)
		})
	}
	srv := asynq.NewServerFromRedisClient(rdb, r.ServerConfig(asynq.Config{
		Concurrency:              concurrency,
		LogLevel:                 asynq.FatalLevel,
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: 20 * time.Millisecond,
		ShutdownTimeout:          5 * time.Second,
	}))
	require.NoError(t, srv.Start(handler))
	t.Cleanup(srv.Shutdown)
}

// ran is one run of a handler.
type ran struct {
	Key   string
	N     int
	Pos   int64
	Fence int64
	Mode  keyorder.Mode
	Held  int
	OK    bool
}

// recorder records the runs of the test tasks, and the overlaps of runs
// of one key.
type recorder struct {
	mu       sync.Mutex
	runs     []ran
	inside   map[string]int
	overlaps []string
}

func newRecorder() *recorder { return &recorder{inside: map[string]int{}} }

// wrap returns a handler that records each run around fn (nil: succeed).
func (rc *recorder) wrap(fn func(ctx context.Context, b body, run keyorder.Run) error) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var b body
		if err := json.Unmarshal(t.Payload(), &b); err != nil {
			return err
		}
		run, _ := keyorder.RunFrom(ctx)
		rc.mu.Lock()
		rc.inside[run.Key]++
		if rc.inside[run.Key] > 1 {
			rc.overlaps = append(rc.overlaps, fmt.Sprintf("%s: task %d started while another ran", run.Key, b.N))
		}
		rc.mu.Unlock()
		var err error
		if fn != nil {
			err = fn(ctx, b, run)
		}
		rc.mu.Lock()
		rc.inside[run.Key]--
		rc.runs = append(rc.runs, ran{Key: run.Key, N: b.N, Pos: run.Pos, Fence: run.Fence, Mode: run.Mode, Held: run.Held, OK: err == nil})
		rc.mu.Unlock()
		return err
	}
}

func (rc *recorder) all() []ran {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]ran(nil), rc.runs...)
}

// succeeded returns the task numbers of key that succeeded, in run order.
func (rc *recorder) succeeded(key string) []int {
	var out []int
	for _, r := range rc.all() {
		if r.Key == key && r.OK {
			out = append(out, r.N)
		}
	}
	return out
}

func eventually(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 5*time.Millisecond, append([]any{msg}, args...)...)
}

func TestRunnerOrdersKeysAcrossServersAndClients(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	keys := []string{"A", "B", "C"}
	const producers, each = 4, 15 // per producer, per key
	rc := newRecorder()
	for range 2 {
		rdb := db.NewClient(t)
		r := newRunner(t, rdb, db.Prefix, keyorder.RunnerConfig{})
		startServer(t, rdb, r, 4, rc.wrap(nil))
	}
	clients := []*keyorder.Client{
		newClient(t, db.NewClient(t), db.Prefix, keyorder.ClientConfig{}),
		newClient(t, db.NewClient(t), db.Prefix, keyorder.ClientConfig{}),
	}
	var mu sync.Mutex
	posOf := map[string]map[int]int64{} // key -> task number -> position
	for _, k := range keys {
		posOf[k] = map[int]int64{}
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			c := clients[p%len(clients)]
			for i := range each {
				for _, k := range keys {
					n := p*each + i
					e, err := c.Enqueue(t.Context(), k, asynq.NewTask("order", payload(t, k, n)), asynq.MaxRetry(1))
					if !assertNoError(t, err) {
						return
					}
					mu.Lock()
					posOf[k][n] = e.Pos
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	total := producers * each
	eventually(t, func() bool { return len(rc.all()) >= total*len(keys) }, "not every task ran")
	runs := rc.all()
	require.Len(t, runs, total*len(keys), "a task ran more than once")
	require.Empty(t, rc.overlaps)
	for _, k := range keys {
		var fence int64
		want := int64(0) // a sequence starts at Redis TIME, then counts by one
		for _, p := range posOf[k] {
			if want == 0 || p < want {
				want = p
			}
		}
		first := want
		for _, r := range runs {
			if r.Key != k {
				continue
			}
			require.True(t, r.OK)
			require.Equal(t, keyorder.ModeTurn, r.Mode, "key %s: task %d ran out of its turn", k, r.N)
			require.Equal(t, want, r.Pos, "key %s ran out of order", k)
			require.Equal(t, posOf[k][r.N], r.Pos, "key %s: task %d ran with another position", k, r.N)
			if r.Held > 0 {
				// Run in the hold of the run before it: the same fence.
				require.Equal(t, fence, r.Fence, "key %s: a held run has its hold's fence", k)
			} else {
				require.Greater(t, r.Fence, fence, "key %s: fences must increase", k)
			}
			fence = r.Fence
			want++
		}
		require.Equal(t, first+int64(total), want)
	}
}

// assertNoError reports err from a goroutine other than the test's.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// failFirst returns a handler body that fails the first n runs of task
// number task, and counts its runs.
func failFirst(task, n int, runs *atomic.Int32) func(context.Context, body, keyorder.Run) error {
	return func(_ context.Context, b body, _ keyorder.Run) error {
		if b.N != task {
			return nil
		}
		if int(runs.Add(1)) <= n {
			return errors.New("boom")
		}
		return nil
	}
}

// enqueue enqueues task n of key with c, failing the test on an error.
func enqueue(t *testing.T, c *keyorder.Client, key string, n int, opts ...asynq.Option) keyorder.Enqueued {
	t.Helper()
	e, err := c.Enqueue(t.Context(), key, asynq.NewTask("order", payload(t, key, n)), opts...)
	require.NoError(t, err)
	return e
}

func TestRunnerArchivesAtBudgetZeroAndPassesTheTurn(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	var fails atomic.Int32
	startServer(t, db.Client, r, 2, rc.wrap(failFirst(1, 100, &fails)))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	e1 := enqueue(t, c, "K", 1, asynq.MaxRetry(0))
	enqueue(t, c, "K", 2, asynq.MaxRetry(0))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "task 2 never ran after task 1 was archived")
	require.Equal(t, []int{2}, rc.succeeded("K"))
	require.Equal(t, int32(1), fails.Load(), "task 1 ran again past its budget of 0")
	// The turn passes as the handler returns; asynq archives it just after.
	requireState(t, db.Client, e1, asynq.TaskStateArchived, "boom")
}

func TestRunnerFailureWithinBudgetKeepsTheTurn(t *testing.T) {
	t.Parallel()
	for _, maxRetry := range []int{2, 25} {
		t.Run(fmt.Sprint("MaxRetry=", maxRetry), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
			rc := newRecorder()
			var runs atomic.Int32
			startServer(t, db.Client, r, 4, rc.wrap(failFirst(1, 2, &runs)))
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			e1 := enqueue(t, c, "K", 1, asynq.MaxRetry(maxRetry))
			enqueue(t, c, "K", 2, asynq.MaxRetry(maxRetry))
			enqueue(t, c, "K", 3, asynq.MaxRetry(maxRetry))
			// asynq's default backoff after a first failure is some
			// seconds: Retry runs it now, as an operator would.
			for i := range int32(2) {
				eventually(t, func() bool {
					h, err := r.Head(t.Context(), "K")
					return runs.Load() == i+1 && err == nil && h.State == "retry" && h.Retried == int(i+1)
				}, "task 1 did not fail for the %d. time", i+1)
				require.Empty(t, rc.succeeded("K"), "a task ran while task 1 failed within budget")
				require.NoError(t, r.Retry(t.Context(), "K"))
			}
			eventually(t, func() bool { return len(rc.succeeded("K")) == 3 }, "the tasks did not all run")
			require.Equal(t, []int{1, 2, 3}, rc.succeeded("K"))
			require.Equal(t, int32(3), runs.Load())
			// Tasks 2 and 3 may run in task 1's hold, inside task 1's
			// asynq run, which asynq ends after the hold.
			insp := asynq.NewInspectorFromRedisClient(db.Client)
			eventually(t, func() bool {
				_, err := insp.GetTaskInfo(e1.Queue, e1.TaskID)
				return errors.Is(err, asynq.ErrTaskNotFound)
			}, "task 1 succeeded: asynq deletes it")
			require.Empty(t, rc.overlaps)
		})
	}
}

// requireState waits for the task of e to reach state, with a last error
// holding lastErr.
func requireState(t *testing.T, rdb redis.UniversalClient, e keyorder.Enqueued, state asynq.TaskState, lastErr string) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	var info *asynq.TaskInfo
	eventually(t, func() bool {
		var err error
		info, err = insp.GetTaskInfo(e.Queue, e.TaskID)
		return err == nil && info.State == state
	}, "task %s never reached state %v", e.TaskID, state)
	require.Contains(t, info.LastErr, lastErr)
}

// callsOf reads the count of startServerCounting for task n of key.
func callsOf(calls *sync.Map, key string, n int) int32 {
	v, ok := calls.Load(key + "/" + fmt.Sprint(n))
	if !ok {
		return 0
	}
	return v.(*atomic.Int32).Load()
}

// gate is a handler body that blocks task number task of key until open
// is closed, and closes started when it starts.
func gate(key string, task int, started, open chan struct{}) func(context.Context, body, keyorder.Run) error {
	return func(ctx context.Context, b body, _ keyorder.Run) error {
		if b.Key != key || b.N != task {
			return nil
		}
		close(started)
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func TestRunnerWaitSpendsNoRetry(t *testing.T) {
	t.Parallel()
	for _, maxRetry := range []int{0, 1} {
		t.Run(fmt.Sprint("MaxRetry=", maxRetry), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			// Short waits and parks, so that the tasks behind the head
			// go back to their queue many times while it runs.
			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
				Wait:    keyorder.Wait{Deadline: 50 * time.Millisecond},
				GapWait: 100 * time.Millisecond,
			})
			rc := newRecorder()
			started, open := make(chan struct{}), make(chan struct{})
			var calls sync.Map
			startServerCounting(t, db.Client, r, 4, rc.wrap(gate("K", 1, started, open)), &calls)
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: 50 * time.Millisecond})
			var behind []keyorder.Enqueued
			enqueue(t, c, "K", 1, asynq.MaxRetry(maxRetry), asynq.Retention(time.Hour))
			for n := 2; n <= 4; n++ {
				behind = append(behind, enqueue(t, c, "K", n, asynq.MaxRetry(maxRetry), asynq.Retention(time.Hour)))
			}
			<-started
			eventually(t, func() bool {
				for n := 2; n <= 4; n++ {
					if callsOf(&calls, "K", n) < 3 {
						return false
					}
				}
				return true
			}, "the tasks behind the head did not wait three times each")
			close(open)
			eventually(t, func() bool { return len(rc.succeeded("K")) == 4 }, "not every task ran")
			require.Equal(t, []int{1, 2, 3, 4}, rc.succeeded("K"))
			insp := asynq.NewInspectorFromRedisClient(db.Client)
			for _, e := range behind {
				requireState(t, db.Client, e, asynq.TaskStateCompleted, "")
				info, err := insp.GetTaskInfo(e.Queue, e.TaskID)
				require.NoError(t, err)
				require.Zero(t, info.Retried, "task %s spent a retry waiting", e.TaskID)
			}
		})
	}
}

func TestRunnerSkipsAGapAfterGapWait(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const gapWait = 300 * time.Millisecond
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: gapWait})
	enqueue(t, c, "K", 1)
	e2 := enqueue(t, c, "K", 2)
	enqueue(t, c, "K", 3)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	require.NoError(t, insp.DeleteTask(e2.Queue, e2.TaskID))

	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: gapWait})
	rc := newRecorder()
	start := time.Now()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "task 3 never ran after the gap")
	require.Equal(t, []int{1, 3}, rc.succeeded("K"))
	require.GreaterOrEqual(t, time.Since(start), gapWait, "the gap was skipped before GapWait")
}

func TestRunnerRunsATaskWithoutPositionUnderTheLock(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	var got atomic.Value
	rc := newRecorder()
	var calls sync.Map
	startServerCounting(t, db.Client, r, 2, rc.wrap(func(ctx context.Context, _ body, run keyorder.Run) error {
		got.Store(run)
		return nil
	}), &calls)
	// An operator holds K's lock: the task waits for it.
	l := newLocker(t, db, keyorder.Config{})
	lease, err := l.TryAcquire(t.Context(), "K", "test")
	require.NoError(t, err)
	ac := asynq.NewClientFromRedisClient(db.Client)
	_, err = ac.Enqueue(asynq.NewTask("plain", payload(t, "K", 1)))
	require.NoError(t, err)
	eventually(t, func() bool { return callsOf(&calls, "K", 1) > 0 }, "the task never came")
	require.Empty(t, rc.all(), "the task ran while its key's lock was held")
	require.NoError(t, lease.Release(t.Context()))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "the task never ran")
	run := got.Load().(keyorder.Run)
	require.Equal(t, "K", run.Key)
	require.Zero(t, run.Pos)
	require.Equal(t, keyorder.ModeFree, run.Mode)
	require.Greater(t, run.Fence, lease.Fence())
}

func TestRunnerArchivesATaskWhoseKeyErrs(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const gapWait = 300 * time.Millisecond
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
		GapWait: gapWait,
		Key: func(t *asynq.Task) (string, error) {
			var b body
			if err := json.Unmarshal(t.Payload(), &b); err != nil {
				return "", err
			}
			if b.N < 0 {
				return "", errors.New("negative task number")
			}
			return b.Key, nil
		},
	})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: gapWait})
	bad := enqueue(t, c, "K", -1)
	enqueue(t, c, "K", 2)
	requireState(t, db.Client, bad, asynq.TaskStateArchived, "negative task number")
	// Its position is a gap: skipped after GapWait, then task 2 runs.
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "task 2 was blocked by the archived task")
	require.Equal(t, []int{2}, rc.succeeded("K"))

	// A task of no key at all, and one whose "seq" is not a position.
	ac := asynq.NewClientFromRedisClient(db.Client)
	info, err := ac.Enqueue(asynq.NewTask("plain", []byte(`{"n":3}`)))
	require.NoError(t, err)
	requireState(t, db.Client, keyorder.Enqueued{Queue: info.Queue, TaskID: info.ID}, asynq.TaskStateArchived, "invalid key")
	info, err = ac.Enqueue(asynq.NewTask("plain", []byte(`{"key":"K","n":4,"seq":-3}`)))
	require.NoError(t, err)
	requireState(t, db.Client, keyorder.Enqueued{Queue: info.Queue, TaskID: info.ID}, asynq.TaskStateArchived, "not a positive integer")
	// Nothing blocks K.
	enqueue(t, c, "K", 5)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "task 5 never ran")
}

// TestRunnerPassesTheTurnOfATaskDoneForGood: a handler's asynq.SkipRetry
// (archived) and asynq.RevokeTask (deleted), within budget, and a panic
// past a budget of 0, end the task for good, and the turn passes at once:
// with a GapWait of a minute, the next task runs well before it.
func TestRunnerPassesTheTurnOfATaskDoneForGood(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxRetry int
		fail     func() error
	}{
		{"SkipRetry", 3, func() error { return fmt.Errorf("bad input: %w", asynq.SkipRetry) }},
		{"RevokeTask", 3, func() error { return fmt.Errorf("not wanted: %w", asynq.RevokeTask) }},
		{"panic", 0, func() error { panic("handler panics") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: time.Minute})
			rc := newRecorder()
			var runs atomic.Int32
			startServer(t, db.Client, r, 2, rc.wrap(func(_ context.Context, b body, _ keyorder.Run) error {
				if b.N == 1 {
					runs.Add(1)
					return tc.fail()
				}
				return nil
			}))
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			enqueue(t, c, "K", 1, asynq.MaxRetry(tc.maxRetry))
			enqueue(t, c, "K", 2, asynq.MaxRetry(tc.maxRetry))
			require.Eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, 10*time.Second, 5*time.Millisecond,
				"task 2 waited for the gap check")
			require.Equal(t, int32(1), runs.Load())
		})
	}
}

// TestRunnerOrdersOnSentinel runs the one-script path on a Sentinel
// group's master (a failover client is a *redis.Client).
func TestRunnerOrdersOnSentinel(t *testing.T) {
	t.Parallel()
	db := redistest.NewSentinel(t)
	rc := newRecorder()
	for range 2 {
		rdb := db.NewClient(t)
		r := newRunner(t, rdb, db.Prefix, keyorder.RunnerConfig{})
		startServer(t, rdb, r, 3, rc.wrap(nil))
	}
	c := newClient(t, db.NewClient(t), db.Prefix, keyorder.ClientConfig{})
	const each = 20
	for i := range each {
		for _, k := range []string{"A", "B"} {
			enqueue(t, c, k, i)
		}
	}
	eventually(t, func() bool { return len(rc.all()) == 2*each }, "not every task ran")
	require.Empty(t, rc.overlaps)
	for _, k := range []string{"A", "B"} {
		want := make([]int, each)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, rc.succeeded(k))
	}
}

// TestRunnerTimeoutCountsAgainstTheBudget: a run that outlives its
// asynq.Timeout fails (asynq counts it, without the Runner's say), so a
// task of budget 0 whose run timed out is archived before it runs again,
// and the turn passes at once.
func TestRunnerTimeoutCountsAgainstTheBudget(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: time.Minute})
	rc := newRecorder()
	var runs atomic.Int32
	startServer(t, db.Client, r, 2, rc.wrap(func(ctx context.Context, b body, _ keyorder.Run) error {
		if b.N == 1 {
			runs.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	e1 := enqueue(t, c, "K", 1, asynq.MaxRetry(0), asynq.Timeout(time.Second))
	e2 := enqueue(t, c, "K", 2, asynq.Retention(time.Hour))
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	eventually(t, func() bool {
		info, err := insp.GetTaskInfo(e1.Queue, e1.TaskID)
		if err == nil && info.State == asynq.TaskStateRetry {
			_ = insp.RunTask(e1.Queue, e1.TaskID) // skip asynq's backoff
		}
		return err == nil && info.State == asynq.TaskStateArchived
	}, "the task that timed out was never archived")
	require.Equal(t, int32(1), runs.Load(), "a task of budget 0 ran again after its run timed out")
	requireState(t, db.Client, e1, asynq.TaskStateArchived, "budget")
	require.Eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, 10*time.Second, 5*time.Millisecond,
		"task 2 waited for the gap check")
	requireState(t, db.Client, e2, asynq.TaskStateCompleted, "")
}

// RunnerConfig.RetryDelay sets a failure's backoff: a head that fails twice
// with a 50 ms backoff runs again by itself, and the tasks behind it wait
// for it, then run in order.
func TestRunnerRetryDelayIsTheConfigs(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	var asked atomic.Int32
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
		RetryDelay: func(n int, err error, _ *asynq.Task) time.Duration {
			if errors.Is(err, keyorder.ErrNotYourTurn) || errors.Is(err, keyorder.ErrBusy) {
				t.Errorf("RetryDelay asked for a wait: %v", err)
			}
			asked.Add(1)
			return 50 * time.Millisecond
		},
	})
	rc := newRecorder()
	var runs atomic.Int32
	startServer(t, db.Client, r, 4, rc.wrap(failFirst(1, 2, &runs)))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for n := 1; n <= 3; n++ {
		enqueue(t, c, "K", n, asynq.MaxRetry(5))
	}
	eventually(t, func() bool { return len(rc.succeeded("K")) == 3 }, "the tasks did not all run")
	require.Equal(t, []int{1, 2, 3}, rc.succeeded("K"))
	require.Equal(t, int32(3), runs.Load())
	require.Equal(t, int32(2), asked.Load(), "one backoff per failure")
	require.Empty(t, rc.overlaps)
}

// A handler whose lease is lost mid-run (its lock deleted, as a Redis
// failover can lose it) sees its context cancelled with cause ErrLost; the
// task goes back without spending a retry, keeps its turn, and runs again
// with a newer fence, before the task behind it.
func TestRunnerLostLeaseRunsAgainInItsTurn(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{TTL: 600 * time.Millisecond})
	started := make(chan keyorder.Run, 1)
	var cause atomic.Value
	var runs atomic.Int32
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(func(ctx context.Context, b body, run keyorder.Run) error {
		if b.N != 1 || runs.Add(1) > 1 {
			return nil
		}
		started <- run
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		return ctx.Err()
	}))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	e1 := enqueue(t, c, "K", 1, asynq.MaxRetry(0))
	enqueue(t, c, "K", 2, asynq.MaxRetry(0))
	var first keyorder.Run
	select {
	case first = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("task 1 never started")
	}
	// The lock's key is "<prefix>{K}": delete it, as a failover might.
	require.NoError(t, db.Client.Del(t.Context(), db.Prefix+"lock:{K}").Err())
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "the tasks did not both run")
	require.ErrorIs(t, cause.Load().(error), keyorder.ErrLost)
	require.Equal(t, []int{1, 2}, rc.succeeded("K"), "task 2 ran before task 1 took its turn again")
	var again ran
	for _, x := range rc.all() {
		if x.N == 1 && x.OK {
			again = x
		}
	}
	require.Greater(t, again.Fence, first.Fence, "the second run holds a newer fence")
	require.Equal(t, keyorder.ModeTurn, again.Mode)
	// Task 2 may run in task 1's hold, inside task 1's asynq run, which
	// asynq ends after the hold.
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	eventually(t, func() bool {
		_, err := insp.GetTaskInfo(e1.Queue, e1.TaskID)
		return errors.Is(err, asynq.ErrTaskNotFound)
	}, "task 1 completed: a lost lease spent no retry of its budget of 0")
}

// A Client and a Runner configured with different prefixes: the Runner
// finds no sequence for the tasks' positions, runs them without order, and
// says so in a warning per task, which names the likely causes.
func TestARunnerWarnsOfATaskWhoseSequenceIsGone(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	core, logs := observer.New(zap.WarnLevel)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{KeyField: "account", Logger: logging.Slog(zap.New(core))})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	c := newClient(t, db.Client, db.Prefix+"elsewhere:", keyorder.ClientConfig{})
	enqueue(t, c, "K", 1)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "the task did not run")
	eventually(t, func() bool { return logs.FilterMessageSnippet("sequence does not exist").Len() == 1 }, "no warning")
	w := logs.FilterMessageSnippet("sequence does not exist").All()[0]
	require.Contains(t, w.Message, "another key prefix")
	require.Equal(t, "K", w.ContextMap()["account"])
	require.Equal(t, keyorder.ModePassed, rc.all()[0].Mode)

	// A task of the Runner's own prefix runs in its turn, without a word.
	own := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	enqueue(t, own, "M", 1)
	eventually(t, func() bool { return len(rc.succeeded("M")) == 1 }, "the task did not run")
	require.Equal(t, 1, logs.FilterMessageSnippet("sequence does not exist").Len())
}

// A failover of a key's master can lose the end of a turn (the sequence
// passed on) while the task's completion, on its queue's master (another
// master, on a Cluster), survives: the task never runs again. The next
// task then finds the head's task completed and skips it within about a
// second, not after GapWait (five minutes here). The lost writes are
// played by putting the key space back as it was before the run.
func TestRunnerSkipsAHeadWhoseTurnsEndWasLost(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := context.Background()
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: 5 * time.Minute, Logger: logging.Slog(zaptest.NewLogger(t)),
		Wait: keyorder.Wait{Deadline: time.Minute}})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: time.Second})
	e1 := enqueue(t, c, "K", 1, asynq.Retention(time.Hour))

	// The key space as the replica has it: before the run.
	keys, err := db.Client.Keys(ctx, db.Prefix+"lock:*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	dumps := map[string]string{}
	for _, k := range keys {
		dumps[k], err = db.Client.Dump(ctx, k).Result()
		require.NoError(t, err)
	}

	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "task 1 never ran")
	requireStateEventually(t, db.Client, e1, asynq.TaskStateCompleted)

	// The promotion: the run's writes to the key space are gone, its
	// task's completion is not.
	now, err := db.Client.Keys(ctx, db.Prefix+"lock:*").Result()
	require.NoError(t, err)
	for _, k := range now {
		if _, ok := dumps[k]; !ok {
			require.NoError(t, db.Client.Del(ctx, k).Err())
		}
	}
	for k, d := range dumps {
		require.NoError(t, db.Client.RestoreReplace(ctx, k, 0, d).Err())
	}

	start := time.Now()
	enqueue(t, c, "K", 2, asynq.Retention(time.Hour))
	require.Eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, 30*time.Second, 5*time.Millisecond,
		"task 2 waited for the GapWait behind a head whose task had completed")
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
	t.Logf("task 2 ran %v after its acceptance", time.Since(start).Round(time.Millisecond))
}

// requireStateEventually waits for e's task to reach state.
func requireStateEventually(t *testing.T, rdb redis.UniversalClient, e keyorder.Enqueued, state asynq.TaskState) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	eventually(t, func() bool {
		info, err := insp.GetTaskInfo(e.Queue, e.TaskID)
		return err == nil && info.State == state
	}, "task %s never reached %v", e.TaskID, state)
}

// A task whose key's Redis does not answer before its turn (a master
// down, a failover) did not fail: it comes back after a busy delay, its
// retries kept, rather than after a failure's backoff.
func TestRunnerTakesAnUnreachableRedisForNoFailure(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	r := newRunner(t, rdb, "test:", keyorder.RunnerConfig{BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond})
	task := asynq.NewTask("order", payload(t, "K", 1))
	err = r.Handler(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Error("the handler ran without its key's lock")
		return nil
	})).ProcessTask(t.Context(), task)
	require.Error(t, err)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.False(t, keyorder.IsFailure(err), "an unreachable Redis counted as the task's failure: %v", err)
	require.LessOrEqual(t, r.ServerConfig(asynq.Config{}).RetryDelayFunc(3, err, task), 50*time.Millisecond, "not the busy delay")
}

// Runner.Shutdown is a program's whole stop: the holds, the server, the
// Runner; the Runner's Close after it is a no-op.
func TestRunnerShutdownStopsTheServerAndTheRunner(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r, err := keyorder.NewRunner(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.RunnerConfig{Key: keyOf})
	require.NoError(t, err)
	rc := newRecorder()
	srv := asynq.NewServerFromRedisClient(db.Client, r.ServerConfig(asynq.Config{
		Concurrency: 2, LogLevel: asynq.FatalLevel, TaskCheckInterval: 10 * time.Millisecond}))
	require.NoError(t, srv.Start(r.Handler(rc.wrap(nil))))
	enqueue(t, newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{}), "K", 1)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "the task did not run")
	require.NoError(t, r.Shutdown(srv))
	require.NoError(t, r.Close(), "closing again")

	other, err := keyorder.NewRunner(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.RunnerConfig{Key: keyOf})
	require.NoError(t, err)
	require.NoError(t, other.Shutdown(nil), "no server: it only closes")
}

// A Runner given no Logger still warns of tasks whose key's sequence does
// not exist (here: a Client on another prefix), through slog.Default, once
// a minute however many such tasks and keys run; the Report says so of
// each run.
// Not parallel: it sets slog.Default.
func TestARunnerWithoutLoggerWarnsOnceThroughSlogDefault(t *testing.T) {
	rec := &slogRecords{}
	prev := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(prev) })

	db := redistest.New(t)
	var gone atomic.Int32
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
		Observe: func(ctx context.Context, _ *asynq.Task, rep *keyorder.Report, run func(context.Context) error) error {
			err := run(ctx)
			if rep.SequenceGone {
				gone.Add(1)
			}
			return err
		},
	})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	c := newClient(t, db.Client, db.Prefix+"elsewhere:", keyorder.ClientConfig{})
	keys := []string{"K", "L", "M"}
	for _, key := range keys {
		enqueue(t, c, key, 1)
	}
	for _, key := range keys {
		eventually(t, func() bool { return len(rc.succeeded(key)) == 1 }, "the task of %s did not run", key)
	}
	eventually(t, func() bool { return gone.Load() == int32(len(keys)) }, "the reports did not say the sequence was gone")
	warned := rec.matching("sequence does not exist")
	require.Len(t, warned, 1, "one warning a minute: %v", warned)
	require.Equal(t, slog.LevelWarn, warned[0].Level)
	attrs := map[string]string{}
	warned[0].Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	require.Contains(t, keys, attrs["key"])
	require.Equal(t, db.Prefix+"lock:", attrs["prefix"], "the Runner's prefix, not the Client's")
}

// slogRecords is a slog.Handler that keeps the records it is given.
type slogRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *slogRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *slogRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *slogRecords) WithGroup(string) slog.Handler            { return h }
func (h *slogRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// matching returns the records whose message contains snippet.
func (h *slogRecords) matching(snippet string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if strings.Contains(r.Message, snippet) {
			out = append(out, r)
		}
	}
	return out
}
