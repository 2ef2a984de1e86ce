package workertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
	"github.com/orderworker/orderworker/worker/workertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// newStore returns a Redis store on a real redis-server of the test's own
// key prefix, with order SO1 seeded.
func newStore(t *testing.T) *redisstore.Store {
	t.Helper()
	db := redistest.New(t)
	s, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	storetest.Seed(t, s, "SO1")
	return s
}

func newWorker(t *testing.T, s orders.Store, cfg workertest.Config) *workertest.Worker {
	t.Helper()
	w, err := workertest.New(s, cfg)
	require.NoError(t, err)
	return w
}

func modify(ev string, seq int64, remark string) tasks.ModifyPayload {
	return tasks.ModifyPayload{EventID: ev, OrderNo: "SO1", Seq: seq, Changes: tasks.Changes{Remark: &remark}}
}

func history(t *testing.T, s orders.Store, no string) []orders.Entry {
	t.Helper()
	h, err := orders.AllHistory(t.Context(), s, no)
	require.NoError(t, err)
	return h
}

// A change runs through its kind's handler under a fence, and the store
// records the fence and the writer.
func TestWorkAppliesUnderAFence(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	w := newWorker(t, s, workertest.Config{ID: "test-worker"})
	res := w.Work(t.Context(), modify("ev-1", 0, "hi"))
	require.NoError(t, res.Err)
	assert.Equal(t, worker.OutcomeOK, res.Outcome)
	assert.Equal(t, worker.ModeFree, res.Mode, "no seq: no order")
	assert.Positive(t, res.Fence)
	o, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, "hi", o.Remark)
	last := history(t, s, "SO1")[1]
	assert.Equal(t, []any{"ev-1", res.Fence, "test-worker"}, []any{last.EventID, last.Fence, last.Worker})

	again := w.Work(t.Context(), modify("ev-1", 0, "hi"))
	require.NoError(t, again.Err, "a replay is applied, not an error")
	assert.Greater(t, again.Fence, res.Fence, "every run of an order has a newer fence")
}

// Fences of one order increase even when the clock does not move.
func TestFencesIncreaseWithAFrozenClock(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	frozen := time.Now()
	w := newWorker(t, s, workertest.Config{Now: func() time.Time { return frozen }})
	a := w.Work(t.Context(), modify("ev-1", 0, "a"))
	b := w.Work(t.Context(), modify("ev-2", 0, "b"))
	require.NoError(t, a.Err)
	require.NoError(t, b.Err)
	assert.Equal(t, a.Fence+1, b.Fence)
}

// A position after the newest applied runs in its turn and is recorded; one
// at or before it runs out of turn, and the store refuses it for good.
func TestPositions(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	w := newWorker(t, s, workertest.Config{})
	res := w.Work(t.Context(), modify("ev-3", 3, "three"))
	require.NoError(t, res.Err)
	assert.Equal(t, worker.ModeTurn, res.Mode)
	assert.Equal(t, int64(3), history(t, s, "SO1")[1].Seq, "a position in its turn is recorded")

	res = w.Work(t.Context(), modify("ev-2", 2, "two"))
	assert.Equal(t, worker.ModePassed, res.Mode)
	assert.Equal(t, worker.OutcomeRejected, res.Outcome)
	assert.ErrorIs(t, res.Err, orders.ErrPassed)
	assert.ErrorIs(t, res.Err, asynq.SkipRetry)

	res = w.Work(t.Context(), modify("ev-5", 5, "five"))
	require.NoError(t, res.Err)
	assert.Equal(t, worker.ModeTurn, res.Mode)
}

// What a Worker archives at once is rejected: an unknown type, a payload
// the strict parser refuses, a change of a closed order.
func TestRejections(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	w := newWorker(t, s, workertest.Config{})
	x := w.Work(t.Context(), tasks.ExchangePayload{EventID: "ev-x", OrderNo: "SO1", Items: []tasks.Item{{SKU: "B", Qty: 1}}, NewOrderNo: "SO2"})
	require.NoError(t, x.Err)
	tests := []struct {
		name string
		task *asynq.Task
		want error
	}{
		{"unknown type", asynq.NewTask("order:no-such-kind", []byte(`{}`)), asynq.SkipRetry},
		{"bad payload", asynq.NewTask(tasks.TypeModify, []byte(`{"event_id":"e","order_no":"SO1","changes":{},"extra":1}`)), tasks.ErrInvalid},
		{"closed order", task(t, modify("ev-m", 0, "late")), orders.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := w.WorkTask(t.Context(), tt.task)
			assert.Equal(t, worker.OutcomeRejected, res.Outcome, "%v", res.Err)
			assert.ErrorIs(t, res.Err, tt.want)
			assert.ErrorIs(t, res.Err, asynq.SkipRetry)
		})
	}
}

func task(t *testing.T, p tasks.Payload) *asynq.Task {
	t.Helper()
	task, err := tasks.NewTask(p)
	require.NoError(t, err)
	return task
}

// A write refused for a stale fence is lost, not a failure: the Worker
// would run it again under a fresh lock.
func TestStaleFenceIsLost(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ahead := orders.WithWrite(t.Context(), orders.Write{Fence: time.Now().Add(time.Hour).UnixMicro()})
	_, err := s.Modify(ahead, "ev-ahead", "SO1", orders.Changes{})
	require.NoError(t, err)
	res := newWorker(t, s, workertest.Config{}).Work(t.Context(), modify("ev-1", 0, "late"))
	assert.Equal(t, worker.OutcomeLost, res.Outcome)
	assert.ErrorIs(t, res.Err, orders.ErrStaleFence)
	assert.False(t, worker.IsFailure(res.Err))
}

// A kind of the test's own, whose handler fails or panics: a failure the
// Worker would retry.
func TestHandlerFailures(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	panicky := worker.NewKind(worker.Wait{}, func(context.Context, orders.Modifier, tasks.ModifyPayload) error { panic("handler bug") })
	w := newWorker(t, s, workertest.Config{Kinds: []worker.Kind{panicky}})
	res := w.Work(t.Context(), modify("ev-1", 0, "x"))
	assert.Equal(t, worker.OutcomeError, res.Outcome)
	assert.ErrorContains(t, res.Err, "panic in the order:modify handler: handler bug")
	assert.True(t, worker.IsFailure(res.Err))
}

// New refuses a kind whose write the store lacks, as worker.New does.
func TestNewRefusesAStoreWithoutTheWrite(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	_, err := workertest.New(struct{ orders.Store }{s}, workertest.Config{})
	require.ErrorIs(t, err, worker.ErrNoWrite)
	require.ErrorContains(t, err, "orders.Exchanger")
	_, err = workertest.New(nil, workertest.Config{})
	require.Error(t, err)
	res := newWorker(t, s, workertest.Config{}).Work(t.Context(), nil)
	require.Equal(t, worker.OutcomeRejected, res.Outcome)
}
