package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flood accepts n modifies of order no through p, in order, and returns
// their event IDs.
func flood(t *testing.T, p *producer.Producer, no, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		_, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new(ids[i])}, producer.WithEventID(ids[i]))
		require.NoError(t, err)
	}
	return ids
}

// A flood of one order's changes drains in a hold: each change is one run,
// in order, taken by the worker that held the order for the change before
// (Drained); each ends as its own completed asynq task. With nothing else
// waiting in the queues, a quantum (DrainMax) that ends starts another:
// the hold goes on, and is counted once, never as yielded.
func TestFloodDrainsInHolds(t *testing.T) {
	e, r, reg, m, p := holdEnv(t, "SO-FLOOD")
	const n, quantum = 60, 25
	// Accept the flood before any worker runs: every change but the head
	// is parked.
	ids := flood(t, p, "SO-FLOOD", "f", n)
	info, err := e.insp.GetQueueInfo(tasks.QueueModify)
	require.NoError(t, err)
	require.Equal(t, 1, info.Pending, "only the head waits in the queue")
	require.Equal(t, n-1, info.Retry, "the changes behind it are parked")

	folds := &countPipelines{}
	e.db.Client.AddHook(folds)
	e.startWorker(worker.Config{OnDone: r.add, Metrics: m, DrainMax: quantum, DrainFor: time.Minute}, nil)
	all := appliedRuns(t, e, r, ids)
	drained := 0
	for _, d := range all {
		require.Equal(t, worker.OutcomeOK, d.Outcome, "%s ran only once, in its turn: %v", d.EventID, d.Err)
		if d.Drained {
			drained++
			assert.Equal(t, worker.ModeTurn, d.Mode)
		}
	}
	require.Len(t, all, n, "one run per change")
	require.GreaterOrEqual(t, drained, n-2, "the changes ran in the hold of the one before")
	requireInSequence(t, e.history("SO-FLOOD"))
	o, err := e.store.Get(t.Context(), "SO-FLOOD")
	require.NoError(t, err)
	require.Equal(t, ids[n-1], o.Remark)
	for _, id := range []string{ids[1], ids[n/2], ids[n-1]} {
		ti := e.taskInfo(tasks.QueueModify, id)
		assert.Equal(t, asynq.TaskStateCompleted, ti.State, "a drained change is completed with its retention (a duplicate is refused)")
	}
	_, err = p.EnqueueModify(t.Context(), "SO-FLOOD", tasks.Changes{Remark: new("again")}, producer.WithEventID(ids[n/2]))
	require.ErrorIs(t, err, producer.ErrDuplicate)

	// On one Redis, a drained change's commit takes the next change's task
	// in its own round trip (the store's script and the step in one
	// pipeline), but for the first two of the hold (the head, whose next
	// is not yet known, and the first change taken apart) and the last of
	// each quantum.
	quanta := n/quantum + 1
	assert.GreaterOrEqual(t, int(folds.n.Load()), n-3*quanta, "commits that took the next change")

	count, yielded := holdMetrics(t, reg)
	assert.Equal(t, uint64(1), count, "one hold drained the order: alone in the line, it never had to yield")
	assert.Zero(t, yielded, "no hold yielded")
}

// A hold whose quantum is spent yields when another order's change waits
// for a worker: with one worker slot and two flooded orders, the orders
// take turns of at most DrainMax changes each (deficit round robin across
// orders, in effect) rather than one draining to its end first.
func TestHoldsYieldToOtherOrders(t *testing.T) {
	e, r, reg, m, p := holdEnv(t, "SO-A", "SO-B")
	const n, quantum = 12, 3
	ids := append(flood(t, p, "SO-A", "a", n), flood(t, p, "SO-B", "b", n)...)
	e.startWorker(worker.Config{OnDone: r.add, Metrics: m, Concurrency: 1, DrainMax: quantum, DrainFor: time.Minute}, nil)
	for _, id := range ids {
		r.waitFor(t, id, 30*time.Second, worker.OutcomeOK)
	}
	e.drain(30 * time.Second)
	requireInSequence(t, e.history("SO-A"))
	requireInSequence(t, e.history("SO-B"))

	r.mu.Lock()
	all := append([]worker.Done(nil), r.all...)
	r.mu.Unlock()
	require.Len(t, all, 2*n, "one run per change")
	left := map[string]int{"SO-A": n, "SO-B": n}
	streak, switches := 0, 0
	for i, d := range all {
		require.Equal(t, worker.OutcomeOK, d.Outcome, "%s: %v", d.EventID, d.Err)
		if i > 0 && d.OrderNo != all[i-1].OrderNo {
			streak = 0
			switches++
		}
		streak++
		left[d.OrderNo]--
		if left["SO-A"] > 0 && left["SO-B"] > 0 {
			require.LessOrEqual(t, streak, quantum, "run %d: %d changes of %s in a row while the other order waited", i, streak, d.OrderNo)
		}
	}
	assert.GreaterOrEqual(t, switches, 2*n/quantum-2, "the orders took turns")
	_, yielded := holdMetrics(t, reg)
	assert.GreaterOrEqual(t, yielded, float64(2*n/quantum-2), "holds that used their quantum while the other order waited yielded")
}

// holdEnv returns a test env with orders nos seeded, a recorder of runs,
// a registry with the worker's metrics in it, and a producer.
func holdEnv(t *testing.T, nos ...string) (*env, *runs, *prometheus.Registry, *worker.Metrics, *producer.Producer) {
	t.Helper()
	e := newEnv(t)
	for _, no := range nos {
		e.seed(no)
	}
	reg := prometheus.NewRegistry()
	m, err := worker.NewMetrics(reg)
	require.NoError(t, err)
	return e, newRuns(), reg, m, e.producer(producer.Config{})
}

// appliedRuns waits until every change of ids is applied and the queues
// are drained, and returns every run r saw.
func appliedRuns(t *testing.T, e *env, r *runs, ids []string) []worker.Done {
	t.Helper()
	for _, id := range ids {
		r.waitFor(t, id, 30*time.Second, worker.OutcomeOK)
	}
	e.drain(30 * time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]worker.Done(nil), r.all...)
}

// countPipelines counts the pipelines of two commands or more a client
// sends: a store's commit with the step of a drained hold.
type countPipelines struct{ n atomic.Int64 }

func (c *countPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *countPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *countPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) >= 2 {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// holdMetrics returns the count of orderworker_hold_changes and the value of
// orderworker_holds_yielded_total of reg.
func holdMetrics(t *testing.T, reg *prometheus.Registry) (holds uint64, yielded float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		switch mf.GetName() {
		case "orderworker_hold_changes":
			holds = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		case "orderworker_holds_yielded_total":
			yielded = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return holds, yielded
}

// failOnce fails the first write of each event in fail.
type failOnce struct {
	*backend
	mu   sync.Mutex
	fail map[string]bool
}

func (s *failOnce) Modify(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
	s.mu.Lock()
	f := s.fail[ev]
	delete(s.fail, ev)
	s.mu.Unlock()
	if f {
		return orders.Result{}, errors.New("the order API answered 500")
	}
	return s.backend.Modify(ctx, ev, no, c)
}

// A change that fails inside a drained hold ends the hold and backs off as
// a failing head does: its failure counts (Retried), it runs again, and the
// changes behind it wait for it.
func TestFailureInAHoldBacksOff(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-HFAIL")
	r := newRuns()
	p := e.producer(producer.Config{})
	ids := flood(t, p, "SO-HFAIL", "h", 6)
	store := &failOnce{fail: map[string]bool{ids[3]: true}}
	e.startWorker(worker.Config{OnDone: r.add}, func(s orders.Store) orders.Store { store.backend = s.(*backend); return store })
	d := r.waitFor(t, ids[3], 30*time.Second, worker.OutcomeError)
	require.True(t, d.Drained, "it failed in the hold of the one before")
	d = r.waitFor(t, ids[3], 60*time.Second, worker.OutcomeOK)
	require.Equal(t, 1, d.Retried, "the failure counted")
	for _, id := range ids[4:] {
		r.waitFor(t, id, 30*time.Second, worker.OutcomeOK)
	}
	requireInSequence(t, e.history("SO-HFAIL"))
}

// An operator's hold takes effect at the next change of a drained hold.
func TestPauseStopsADrainedHold(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-HPAUSE")
	r := newRuns()
	p := e.producer(producer.Config{})
	ids := flood(t, p, "SO-HPAUSE", "p", 5)
	var once atomic.Bool
	q := e.sequencer()
	pauseAt := func(s orders.Store) orders.Store {
		return &hookOnWrite{backend: s.(*backend), before: func(ev string) {
			if ev == ids[1] && once.CompareAndSwap(false, true) {
				_, err := q.Pause(context.WithoutCancel(t.Context()), "SO-HPAUSE", "ops", "checking")
				assert.NoError(t, err)
			}
		}}
	}
	e.startWorker(worker.Config{OnDone: r.add}, pauseAt)
	r.waitFor(t, ids[1], 30*time.Second, worker.OutcomeOK)
	d := r.waitFor(t, ids[2], 30*time.Second)
	require.NotEqual(t, worker.OutcomeOK, d.Outcome, "the paused order's next change does not run: %+v", d)
	_, st, err := q.Resume(t.Context(), "SO-HPAUSE")
	require.NoError(t, err)
	require.NoError(t, keyorder.Wake(t.Context(), e.db.Client, orderkeys.Locate(tasks.Shards{}, tasks.Kinds()), "SO-HPAUSE", st.Wake))
	for _, id := range ids[2:] {
		r.waitFor(t, id, 60*time.Second, worker.OutcomeOK)
	}
	requireInSequence(t, e.history("SO-HPAUSE"))
}

// hookOnWrite calls before with each modify's event ID before it writes.
type hookOnWrite struct {
	*backend
	before func(ev string)
}

func (s *hookOnWrite) Modify(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
	s.before(ev)
	return s.backend.Modify(ctx, ev, no, c)
}

// A hold that nothing else waits for goes on past its quantum, but not to
// its first run's deadline: the hold runs inside that run's asynq handler,
// and asynq fails the task at its deadline whatever was applied since. It
// yields at half the first run's time instead, and the order's next change
// starts a hold of its own. Every change still runs once, and succeeds.
func TestAHoldYieldsBeforeItsFirstRunsDeadline(t *testing.T) {
	e, r, reg, m, _ := holdEnv(t, "SO-LONG")
	p := e.producer(producer.Config{Timeout: 2 * time.Second})
	const n, work = 24, 100 * time.Millisecond // 2.4 s of work: past one task's 2 s
	ids := flood(t, p, "SO-LONG", "l", n)
	e.startWorker(worker.Config{OnDone: r.add, Metrics: m, DrainMax: 2, DrainFor: time.Minute,
		Kinds: storehook.Kinds(nil, storehook.Delay(work))}, nil)
	all := appliedRuns(t, e, r, ids)
	for _, d := range all {
		require.Equal(t, worker.OutcomeOK, d.Outcome, "%s ran only once, and succeeded: %v", d.EventID, d.Err)
	}
	require.Len(t, all, n, "one run per change")
	requireInSequence(t, e.history("SO-LONG"))
	holds, yielded := holdMetrics(t, reg)
	assert.GreaterOrEqual(t, holds, uint64(2), "the flood took more than one hold")
	assert.GreaterOrEqual(t, yielded, float64(1), "a hold yielded at half its first run's time")
}

// A Worker with more than half its slots in use yields at the end of each
// quantum even when nothing waits in the queues, so that hot orders spread
// over the workers rather than stay on the one that took them first: with
// two slots, both holding a flooded order, the holds yield every DrainMax
// changes.
func TestABusyWorkersHoldsYield(t *testing.T) {
	e, r, reg, m, p := holdEnv(t, "SO-A", "SO-B")
	const n, quantum = 12, 3
	ids := append(flood(t, p, "SO-A", "a", n), flood(t, p, "SO-B", "b", n)...)
	e.startWorker(worker.Config{OnDone: r.add, Metrics: m, Concurrency: 2, DrainMax: quantum, DrainFor: time.Minute}, nil)
	all := appliedRuns(t, e, r, ids)
	for _, d := range all {
		require.Equal(t, worker.OutcomeOK, d.Outcome, "%s: %v", d.EventID, d.Err)
	}
	require.Len(t, all, 2*n, "one run per change")
	requireInSequence(t, e.history("SO-A"))
	requireInSequence(t, e.history("SO-B"))
	_, yielded := holdMetrics(t, reg)
	assert.GreaterOrEqual(t, yielded, float64(2), "the busy worker's holds yielded at the end of their quanta")
}
