package worker_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// env is one test's Redis with helpers to run workers on it.
type env struct {
	t     *testing.T
	db    *redistest.DB
	store *redisstore.Store
	cli   *asynq.Client
	insp  *asynq.Inspector
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	e := &env{t: t, db: db, store: store,
		cli:  asynq.NewClientFromRedisClient(db.Client),
		insp: asynq.NewInspectorFromRedisClient(db.Client),
	}
	t.Cleanup(func() {
		// Remove the queues this test made, shard queues included, which
		// matters on a shared server.
		for _, q := range e.queues() {
			_ = e.insp.DeleteQueue(q, true)
		}
	})
	return e
}

// queues returns the order queues asynq knows of, shard queues included.
func (e *env) queues() []string {
	all, _ := e.insp.Queues()
	var out []string
	for _, q := range all {
		if tasks.Kinds().OfQueue(q) != nil {
			out = append(out, q)
		}
	}
	return out
}

// backend is the Redis store, which has every write of the contract: the
// tests' stores embed it (as *backend) and so have every write too, a
// kind's added to the table included, without a list of the writes here.
type backend = redisstore.Store

// startWorker starts one worker "replica" with its own Redis client (and
// so its own lock), shut down at cleanup. store wraps the shared store if
// not nil. It logs to the test unless cfg has a Logger.
func (e *env) startWorker(cfg worker.Config, wrap func(orders.Store) orders.Store) *worker.Worker {
	t := e.t
	t.Helper()
	c := e.db.NewClient(t)
	cfg.KeyPrefix = e.db.Prefix
	cfg.LockTTL = cmp.Or(cfg.LockTTL, 5*time.Second)
	var store orders.Store = e.store
	if wrap != nil {
		store = wrap(store)
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = 100 * time.Millisecond
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = 100 * time.Millisecond
	}
	w, err := worker.New(c, store, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)
	return w
}

func (e *env) seed(no string) {
	e.t.Helper()
	require.NoError(e.t, e.store.Put(e.t.Context(), orders.Order{
		No: no, Address: "1 Old Rd", Remark: "seeded", Items: []orders.Item{{SKU: "A", Qty: 1}},
	}))
}

func (e *env) enqueue(task *asynq.Task, queue, id string) {
	e.t.Helper()
	_, err := e.cli.Enqueue(task, asynq.Queue(queue), asynq.TaskID(id), asynq.Retention(time.Hour), asynq.MaxRetry(5))
	require.NoError(e.t, err)
}

func (e *env) modify(orderNo, eventID string, c tasks.Changes) {
	e.t.Helper()
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: eventID, OrderNo: orderNo, Changes: c})
	require.NoError(e.t, err)
	e.enqueue(task, tasks.QueueModify, eventID)
}

func (e *env) exchange(orderNo, eventID, newNo string) {
	e.t.Helper()
	task, err := tasks.NewTask(tasks.ExchangePayload{EventID: eventID, OrderNo: orderNo, NewOrderNo: newNo,
		Items: []tasks.Item{{SKU: "B", Qty: 2}}})
	require.NoError(e.t, err)
	e.enqueue(task, tasks.QueueExchange, eventID)
}

// drain waits until no task is pending, active, scheduled or retrying.
func (e *env) drain(limit time.Duration) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		busy := 0
		for _, q := range e.queues() {
			if info, err := e.insp.GetQueueInfo(q); err == nil {
				busy += info.Pending + info.Active + info.Scheduled + info.Retry
			}
		}
		return busy == 0
	}, limit, 10*time.Millisecond, "queues not drained")
}

func (e *env) taskInfo(queue, id string) *asynq.TaskInfo {
	e.t.Helper()
	info, err := e.insp.GetTaskInfo(queue, id)
	require.NoError(e.t, err)
	return info
}

// overlapStore wraps a store and counts writers inside one order at once.
type overlapStore struct {
	*backend
	mu       sync.Mutex
	inside   map[string]int
	overlaps int
}

func (s *overlapStore) enter(no string) func() {
	s.mu.Lock()
	s.inside[no]++
	if s.inside[no] > 1 {
		s.overlaps++
	}
	s.mu.Unlock()
	return func() { s.mu.Lock(); s.inside[no]--; s.mu.Unlock() }
}

// The window is the handler's work before its commit: the Redis store may
// release the lock inside the commit script, after which the next holder
// may start before this call has returned. The commit itself is atomic; the
// histories' times check that the next holder started after it.
func (s *overlapStore) Modify(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
	exit := s.enter(no)
	time.Sleep(time.Millisecond) // simulated work: widens the window an overlap would show in
	exit()
	return s.backend.Modify(ctx, ev, no, c)
}

func (s *overlapStore) Exchange(ctx context.Context, ev, no string, x orders.Exchange) (orders.Result, error) {
	exit := s.enter(no)
	time.Sleep(time.Millisecond)
	exit()
	return s.backend.Exchange(ctx, ev, no, x)
}

func TestHotOrderAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	const hot, modifies = "SO-HOT", 60
	e.seed(hot)
	check := &overlapStore{backend: e.store, inside: map[string]int{}}
	wrap := func(orders.Store) orders.Store { return check }
	cfg := worker.Config{Concurrency: 8, Waits: map[string]worker.Wait{"modify": {Deadline: 30 * time.Second}}}
	for range 3 {
		e.startWorker(cfg, wrap)
	}
	remark := func(i int) *string { s := fmt.Sprintf("r%d", i); return &s }
	for i := range modifies {
		e.modify(hot, fmt.Sprintf("mod-%d", i), tasks.Changes{Remark: remark(i)})
		if i == modifies/2 {
			e.exchange(hot, "exch-1", "SO-HOT-B")
		}
	}
	e.drain(time.Minute)

	require.Zero(t, check.overlaps, "two handlers inside one order at once")

	a, err := e.store.Get(t.Context(), hot)
	require.NoError(t, err)
	require.Equal(t, orders.StatusExchanged, a.Status)
	require.Equal(t, "SO-HOT-B", a.ExchangedTo)
	b, err := e.store.Get(t.Context(), "SO-HOT-B")
	require.NoError(t, err)
	require.Equal(t, hot, b.ExchangedFrom)
	require.Equal(t, a.Address, b.Address)

	hist, err := orders.AllHistory(t.Context(), e.store, hot)
	require.NoError(t, err)
	applied := map[string]int{}
	var lastFence int64
	var lastEnd time.Time
	for _, h := range hist {
		applied[h.EventID]++
		require.GreaterOrEqual(t, h.Fence, lastFence, "fences never go back")
		require.False(t, h.StartedAt.Before(lastEnd.Truncate(time.Microsecond)), "%s started before the previous write ended", h.EventID)
		lastFence, lastEnd = h.Fence, h.EndedAt
	}
	// Every modify either was applied exactly once before the exchange, or
	// was archived because the order had been exchanged, naming B.
	for i := range modifies {
		id := fmt.Sprintf("mod-%d", i)
		info := e.taskInfo(tasks.QueueModify, id)
		switch info.State {
		case asynq.TaskStateCompleted:
			require.Equal(t, 1, applied[id], id)
		case asynq.TaskStateArchived:
			require.Zero(t, applied[id], id)
			require.Contains(t, info.LastErr, "SO-HOT-B", id)
		default:
			t.Fatalf("%s in state %v", id, info.State)
		}
	}
	require.Equal(t, 1, applied["exch-1"])
	require.Equal(t, asynq.TaskStateCompleted, e.taskInfo(tasks.QueueExchange, "exch-1").State)
}

func TestBusyGoesBackWithoutUsingRetries(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-BUSY")
	// Someone else holds the order.
	space, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	l, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	held, err := l.Acquire(t.Context(), "SO-BUSY", "order:exchange elsewhere")
	require.NoError(t, err)

	e.startWorker(worker.Config{
		Waits:        map[string]worker.Wait{"modify": {MinDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Deadline: 100 * time.Millisecond}},
		BusyRetryMin: 50 * time.Millisecond, BusyRetryMax: 100 * time.Millisecond,
	}, nil)
	addr := "2 New St"
	e.modify("SO-BUSY", "ev-busy", tasks.Changes{Address: &addr})

	// It meets the deadline and goes back, without counting as a failure.
	var info *asynq.TaskInfo
	require.Eventually(t, func() bool {
		info = e.taskInfo(tasks.QueueModify, "ev-busy")
		return info.State == asynq.TaskStateRetry && strings.Contains(info.LastErr, "order:exchange elsewhere")
	}, 30*time.Second, 5*time.Millisecond, "task never met the lock deadline")
	require.Zero(t, info.Retried, "busy must not use up retries")
	require.NoError(t, held.Release(t.Context()))
	e.drain(30 * time.Second)
	info = e.taskInfo(tasks.QueueModify, "ev-busy")
	require.Equal(t, asynq.TaskStateCompleted, info.State)
	require.Zero(t, info.Retried)
	o, err := e.store.Get(t.Context(), "SO-BUSY")
	require.NoError(t, err)
	require.Equal(t, addr, o.Address)
}

func TestMalformedTasksAreArchivedWithReason(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-OK")
	e.startWorker(worker.Config{}, nil)
	tests := []struct {
		name, typ, queue, payload, reason string
	}{
		{"not json", tasks.TypeModify, tasks.QueueModify, `{"order_no":`, "payload"},
		{"bad order number", tasks.TypeModify, tasks.QueueModify, `{"event_id":"e","order_no":"SO 1","changes":{"remark":"x"}}`, "order_no"},
		{"no changes", tasks.TypeModify, tasks.QueueModify, `{"event_id":"e2","order_no":"SO-OK","changes":{}}`, "changes"},
		{"bad qty", tasks.TypeExchange, tasks.QueueExchange, `{"event_id":"e3","order_no":"SO-OK","items":[{"sku":"A","qty":0}]}`, "items[0].qty"},
		{"unknown order", tasks.TypeModify, tasks.QueueModify, `{"event_id":"e4","order_no":"SO-NONE","changes":{"remark":"x"}}`, "not found"},
		{"unknown type", "order:no-such-kind", tasks.QueueModify, `{"event_id":"e5","order_no":"SO-OK"}`, "unknown task type"},
	}
	// Each task's ID is its event ID, as the contract says (else the
	// mismatch would be the reason).
	id := func(i int, payload string) string {
		var h struct {
			EventID string `json:"event_id"`
		}
		if json.Unmarshal([]byte(payload), &h) == nil && h.EventID != "" {
			return h.EventID
		}
		return fmt.Sprintf("bad-%d", i)
	}
	for i, tt := range tests {
		e.enqueue(asynq.NewTask(tt.typ, []byte(tt.payload)), tt.queue, id(i, tt.payload))
	}
	e.drain(30 * time.Second)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := e.taskInfo(tt.queue, id(i, tt.payload))
			require.Equal(t, asynq.TaskStateArchived, info.State)
			require.Zero(t, info.Retried, "archived at once, not retried")
			require.Contains(t, info.LastErr, tt.reason)
		})
	}
}

// A store write under a fence older than one the store has seen is refused,
// so a holder that lost its lock cannot write after the next holder did.
func TestStaleFenceIsRejectedAndRetried(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-FENCE")
	// A newer holder has written with a fence from the far future.
	ctx := orders.WithWrite(t.Context(), orders.Write{Fence: time.Now().Add(time.Hour).UnixMicro(), Worker: "future"})
	r := "from the future"
	_, err := e.store.Modify(ctx, "ev-future", "SO-FENCE", orders.Changes{Remark: &r})
	require.NoError(t, err)

	e.startWorker(worker.Config{}, nil)
	r2 := "late"
	e.modify("SO-FENCE", "ev-late", tasks.Changes{Remark: &r2})
	var info *asynq.TaskInfo
	require.Eventually(t, func() bool {
		info = e.taskInfo(tasks.QueueModify, "ev-late")
		return strings.Contains(info.LastErr, "stale fence")
	}, 30*time.Second, 5*time.Millisecond, "stale write was not refused")
	require.Zero(t, info.Retried, "a stale fence is not a failure: it spends no retry")
	o, err := e.store.Get(t.Context(), "SO-FENCE")
	require.NoError(t, err)
	require.Equal(t, r, o.Remark)
}

func TestLostLeaseCancelsHandler(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-LOST")
	entered := make(chan struct{})
	var once sync.Once
	blocking := func(s orders.Store) orders.Store {
		return &hookStore{backend: s.(*backend), modify: func(ctx context.Context, _, _ string, _ orders.Changes) (orders.Result, error) {
			once.Do(func() { close(entered) })
			<-ctx.Done() // the handler blocks until its lease is lost
			return orders.Result{}, context.Cause(ctx)
		}}
	}
	c := e.db.NewClient(t)
	w, err := worker.New(c, blocking(e.store), worker.Config{KeyPrefix: e.db.Prefix, LockTTL: 150 * time.Millisecond,
		Logger: zaptest.NewLogger(t), DelayedTaskCheckInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)

	r := "x"
	e.modify("SO-LOST", "ev-lost", tasks.Changes{Remark: &r})
	<-entered
	// Someone deletes the lock from outside: the renewal finds it gone.
	require.NoError(t, e.db.Client.Del(t.Context(), e.db.Prefix+"lock:{SO-LOST}").Err())
	var info *asynq.TaskInfo
	require.Eventually(t, func() bool {
		info = e.taskInfo(tasks.QueueModify, "ev-lost")
		return strings.Contains(info.LastErr, keyorder.ErrLost.Error())
	}, 30*time.Second, 5*time.Millisecond, "lost lease did not end the handler")
	require.Zero(t, info.Retried, "a lost lease is not a failure: it spends no retry")
}

// hookStore replaces a store's Modify.
type hookStore struct {
	*backend
	modify func(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error)
}

func (s *hookStore) Modify(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
	return s.modify(ctx, ev, no, c)
}

func TestConfigValidation(t *testing.T) {
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	tests := []struct {
		name string
		cfg  worker.Config
	}{
		{"unknown queue", worker.Config{Queues: map[string]int{"default": 1}}},
		{"zero weight", worker.Config{Queues: map[string]int{tasks.QueueModify: 0, tasks.QueueExchange: 1}}},
		{"min over max", worker.Config{Waits: map[string]worker.Wait{"modify": {MinDelay: time.Second, MaxDelay: time.Millisecond}}}},
		{"wait of an unknown kind", worker.Config{Waits: map[string]worker.Wait{"no-such-kind": {Deadline: time.Second}}}},
		{"failure policy of an unknown kind", worker.Config{Failures: map[string]worker.FailurePolicy{"no-such-kind": worker.Halt}}},
		{"unknown failure policy", worker.Config{Failures: map[string]worker.FailurePolicy{"modify": "stop"}}},
		{"negative gap wait", worker.Config{GapWait: -time.Second}},
		{"negative schedule bound", worker.Config{MaxScheduleAhead: -time.Second}},
		{"negative shutdown", worker.Config{ShutdownTimeout: -time.Second}},
		{"brace in key prefix", worker.Config{KeyPrefix: "ow:{x}:"}},
		{"negative lock TTL", worker.Config{LockTTL: -time.Second}},
		{"lock TTL too short", worker.Config{LockTTL: time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := worker.New(db.Client, store, tt.cfg)
			require.Error(t, err)
		})
	}
}

func TestOutcome(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, worker.OutcomeOK},
		{&keyorder.BusyError{Key: "k"}, worker.OutcomeBusy},
		{&keyorder.TurnError{Key: "k"}, worker.OutcomeWaiting},
		{fmt.Errorf("%w: late", orders.ErrStaleFence), worker.OutcomeLost},
		{asynq.ErrLeaseExpired, worker.OutcomeError},
		{fmt.Errorf("x: %w", asynq.SkipRetry), worker.OutcomeRejected},
		{fmt.Errorf("%w: ctx", keyorder.ErrLost), worker.OutcomeLost},
		{errors.New("boom"), worker.OutcomeError},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, worker.Outcome(tt.err), "%v", tt.err)
		if tt.err == nil {
			continue
		}
		failure := tt.want == worker.OutcomeError || tt.want == worker.OutcomeRejected
		if errors.Is(tt.err, asynq.ErrLeaseExpired) {
			failure = false // a dead worker's task: not the task's failure
		}
		require.Equal(t, failure, worker.IsFailure(tt.err), "%v", tt.err)
		require.Equal(t, failure, keyorder.IsFailure(tt.err), "the engine's rule is the worker's: %v", tt.err)
	}
	// The order stores' stale fence is the engine's.
	require.ErrorIs(t, fmt.Errorf("write: %w", orders.ErrStaleFence), keyorder.ErrStaleFence)
	require.ErrorIs(t, fmt.Errorf("write: %w", orders.ErrStaleFence), orders.ErrStaleFence)
	require.NotErrorIs(t, keyorder.ErrStaleFence, orders.ErrStaleFence)
}
