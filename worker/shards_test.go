package worker_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// onEachShard returns an order number per shard of count, made from
// prefix: the first of prefix0, prefix1, … that falls in each shard.
func onEachShard(prefix string, count int) []string {
	out := make([]string, count)
	for i, found := 0, 0; found < count; i++ {
		no := prefix + strconv.Itoa(i)
		if s := tasks.ShardOf(no, count); out[s] == "" {
			out[s] = no
			found++
		}
	}
	return out
}

// fastWaits are waits short enough for tests that park tasks, one for
// every kind of the worker's table.
var fastWaits = func() map[string]worker.Wait {
	out := map[string]worker.Wait{}
	for _, k := range worker.Kinds() {
		out[k.Kind.Name] = worker.Wait{MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: 200 * time.Millisecond}
	}
	return out
}()

// A worker with 3 shards serves the 3 shard queues of each kind of the
// table with the kind's whole weight, every order's changes land in its
// shard and apply in sequence, and the metrics show the shards.
func TestShardedWorkerServesEveryShard(t *testing.T) {
	e := newEnv(t)
	shards := tasks.Shards{Count: 3}
	// A registry per worker: either may run every task.
	var regs []*prometheus.Registry
	var w *worker.Worker
	for range 2 {
		reg := prometheus.NewRegistry()
		m, err := worker.NewMetrics(reg)
		require.NoError(t, err)
		regs = append(regs, reg)
		w = e.startWorker(worker.Config{Shards: shards, Concurrency: 6, Metrics: m, Kinds: slowKinds(time.Millisecond)}, nil)
	}
	wantQueues := map[string]int{}
	for _, k := range tasks.Kinds() {
		for _, q := range k.ShardQueues(3) {
			wantQueues[q] = k.Weight // each shard the kind's whole weight
		}
	}
	require.Len(t, wantQueues, 3*len(tasks.Kinds()))
	require.Equal(t, wantQueues, w.Queues())
	require.Equal(t, 3, w.Queues()["order_modify:1"], "order_modify:1 has the modify's weight, 3")

	p := e.producer(producer.Config{Shards: shards})
	nos := onEachShard("SO-SH", 3)
	for _, no := range nos {
		e.seed(no)
	}
	const each = 10
	for i := range each {
		for _, no := range nos {
			res, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new("r" + strconv.Itoa(i))})
			require.NoError(t, err)
			require.Equal(t, tasks.Modify.QueueFor(no, 3), res.Queue)
		}
	}
	// An exchange of each order, in its order's exchange shard, and a
	// modify of each replacement, in the replacement's modify shard.
	for i, no := range nos {
		res, err := p.EnqueueExchange(t.Context(), no, []tasks.Item{{SKU: "B", Qty: 1}}, producer.WithNewOrderNo(nos[(i+1)%3]+"-X"))
		require.NoError(t, err)
		require.Equal(t, "order_exchange:"+strconv.Itoa(i), res.Queue)
		_, err = p.EnqueueModify(t.Context(), nos[(i+1)%3]+"-X", tasks.Changes{Remark: new("on the replacement")})
		require.NoError(t, err)
	}
	// And a task of every kind of the table in each of its shards: its
	// example (tasks.Kind.ExamplePayload), each on an order of its own.
	for _, k := range tasks.Kinds() {
		for i, no := range onEachShard("SO-SHK-"+k.Name+"-", 3) {
			e.seed(no)
			payload, err := k.ExamplePayload(fmt.Sprintf("shard-%s-%d", k.Name, i), no)
			require.NoError(t, err)
			res, err := p.Enqueue(t.Context(), payload)
			require.NoError(t, err)
			require.Equal(t, k.ShardQueue(i, 3), res.Queue)
		}
	}
	e.drain(time.Minute)

	for _, no := range nos {
		hist := e.history(no)
		require.Len(t, hist, each+2, "%s: the put, every modify and the exchange", no)
		requireInSequence(t, hist)
		o, err := e.store.Get(t.Context(), no)
		require.NoError(t, err)
		require.Equal(t, "r"+strconv.Itoa(each-1), o.Remark, "last word last")
		x, err := e.store.Get(t.Context(), no+"-X")
		require.NoError(t, err)
		require.Equal(t, "on the replacement", x.Remark)
	}
	for _, k := range tasks.Kinds() {
		for _, q := range k.ShardQueues(3) {
			info, err := e.insp.GetQueueInfo(q)
			require.NoError(t, err, q)
			require.Positive(t, info.Completed, "%s served", q)
			require.Zero(t, info.Archived, q)
		}
	}

	labels := map[string]bool{}
	for _, reg := range regs {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() != "orderworker_task_duration_seconds" {
				continue
			}
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == "queue" {
						labels[l.GetValue()] = true
					}
				}
			}
		}
	}
	require.NotEmpty(t, labels)
	for q := range labels {
		require.Contains(t, w.Queues(), q, "a queue label is a queue the worker serves")
	}
}

// A task on another shard of its kind's queue than its order's is archived
// with the reason, and uses up its position.
func TestTaskOnAnotherShardIsArchived(t *testing.T) {
	e := newEnv(t)
	e.seed("SO1001") // shard 2 of 3
	shards := tasks.Shards{Count: 3}
	r := newRuns()
	e.startWorker(worker.Config{Shards: shards, OnDone: r.add}, nil)
	pos, err := e.sequencer().Reserve(t.Context(), "SO1001", tasks.PositionLabel(tasks.TypeModify, "misplaced"), "")
	require.NoError(t, err)
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "misplaced", OrderNo: "SO1001", Seq: pos, Changes: tasks.Changes{Remark: new("wrong shard")}})
	require.NoError(t, err)
	e.enqueue(task, "order_modify:0", "misplaced")
	_, err = e.producer(producer.Config{Shards: shards}).EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("right shard")}, producer.WithEventID("right"))
	require.NoError(t, err)

	d := r.waitFor(t, "misplaced", 30*time.Second, worker.OutcomeRejected)
	require.Equal(t, "order_modify:0", d.Queue)
	r.waitFor(t, "right", 30*time.Second, worker.OutcomeOK)
	e.waitState("order_modify:0", "misplaced", asynq.TaskStateArchived)
	info := e.taskInfo("order_modify:0", "misplaced")
	require.Contains(t, info.LastErr, `order:modify task of order SO1001 on queue "order_modify:0": its queue is order_modify:2 (shards 3)`)
	o, err := e.store.Get(t.Context(), "SO1001")
	require.NoError(t, err)
	require.Equal(t, "right shard", o.Remark)
}

// The shard count changes from 1 to 3 while changes stream in, the way the
// procedure of docs/scaling.md ("Changing the shard count") does it: the workers first take "3,1" (they serve the
// old queues and the new shards, and accept tasks placed either way) while
// the producers still place by 1; then the producers place by 3; once the
// old queues are empty, everyone takes "3". Nothing is lost, archived or
// applied out of order, and every order ends as its last change said.
func TestShardCountChangeLosesNothing(t *testing.T) {
	e := newEnv(t)
	nos := onEachShard("SO-CHG", 3)
	nos = append(nos, onEachShard("SO-CHG-B", 3)...)
	for _, no := range nos {
		e.seed(no)
	}
	r := newRuns()
	start := func(s tasks.Shards) *worker.Worker {
		return e.startWorker(worker.Config{Shards: s, Concurrency: 4, OnDone: r.add, Waits: fastWaits,
			BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond, Kinds: slowKinds(2 * time.Millisecond)}, nil)
	}
	var sent []string // event IDs, in the order they were accepted
	last := map[string]string{}
	send := func(p *producer.Producer, phase string, n int) {
		t.Helper()
		for i := range n {
			for _, no := range nos {
				id := fmt.Sprintf("%s-%s-%d", phase, no, i)
				_, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new(id)}, producer.WithEventID(id))
				require.NoError(t, err)
				sent = append(sent, id)
				last[no] = id
			}
		}
	}
	old := tasks.Shards{Count: 1}
	mid := tasks.Shards{Count: 3, Draining: []int{1}}
	end := tasks.Shards{Count: 3}

	w1 := start(old)
	send(e.producer(producer.Config{Shards: old}), "before", 10)
	w2 := start(mid) // the rolling update of the workers
	w1.Shutdown()
	send(e.producer(producer.Config{Shards: old}), "rolling", 5) // a producer not yet updated
	send(e.producer(producer.Config{Shards: mid}), "during", 10)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := e.insp.GetQueueInfo(tasks.QueueModify)
		if assert.NoError(c, err) {
			assert.Zero(c, info.Pending+info.Active+info.Scheduled+info.Retry, "the old queue drained")
		}
	}, time.Minute, 20*time.Millisecond)
	start(end)
	w2.Shutdown()
	send(e.producer(producer.Config{Shards: end}), "after", 5)
	e.drain(time.Minute)

	r.mu.Lock()
	all := slices.Clone(r.all) // checked without the lock: a failed check must not leave it held
	r.mu.Unlock()
	applied := map[string]bool{}
	for _, d := range all {
		require.NotEqual(t, worker.OutcomeRejected, d.Outcome, "%s rejected: %v", d.EventID, d.Err)
		if d.Outcome == worker.OutcomeOK {
			applied[d.EventID] = true
		}
	}
	for _, id := range sent {
		require.True(t, applied[id], "%s applied", id)
	}
	for _, no := range nos {
		hist := e.history(no)
		require.Len(t, hist, 1+30, "%s: the put and every change once", no)
		requireInSequence(t, hist)
		o, err := e.store.Get(t.Context(), no)
		require.NoError(t, err)
		require.Equal(t, last[no], o.Remark, "last word last")
	}
	for _, q := range e.queues() {
		info, err := e.insp.GetQueueInfo(q)
		require.NoError(t, err)
		require.Zero(t, info.Archived, q)
	}
	served := slices.Sorted(maps.Keys(map[string]bool{"order_modify": true, "order_modify:0": true, "order_modify:1": true, "order_modify:2": true}))
	var used []string
	for _, q := range e.queues() {
		if info, err := e.insp.GetQueueInfo(q); err == nil && info.Completed > 0 && tasks.Kinds().OfQueue(q) == tasks.Modify {
			used = append(used, q)
		}
	}
	slices.Sort(used)
	require.Equal(t, served, used, "the old queue and every shard carried changes")
}

// While a count drains, the gap check looks for a position's task in its
// placement under the old count too: a change accepted before the switch,
// scheduled for later in the old queue, is waited for, not skipped (which
// would apply the later change first and archive this one as passed).
func TestGapCheckLooksInTheDrainingPlacement(t *testing.T) {
	e := newEnv(t)
	e.seed("SO1001")
	r := newRuns()
	mid := tasks.Shards{Count: 3, Draining: []int{1}}
	e.startWorker(worker.Config{Shards: mid, GapWait: 200 * time.Millisecond, OnDone: r.add, Waits: fastWaits,
		BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond}, nil)
	old, err := e.producer(producer.Config{}).EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("first")},
		producer.WithEventID("old"), producer.WithProcessIn(2*time.Second))
	require.NoError(t, err)
	require.Equal(t, tasks.QueueModify, old.Queue)
	cur, err := e.producer(producer.Config{Shards: mid}).EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("second")},
		producer.WithEventID("new"))
	require.NoError(t, err)
	require.Equal(t, "order_modify:2", cur.Queue)

	// (OnDone reports the two in either order: read them from r.all.)
	var d worker.Done
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		ok := 0
		for _, run := range r.all {
			if run.Outcome == worker.OutcomeOK && (run.EventID == "old" || run.EventID == "new") {
				ok++
				if run.EventID == "new" {
					d = run
				}
			}
		}
		return ok == 2
	}, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, d.Skipped)
	hist := e.history("SO1001")
	requireInSequence(t, hist)
	o, err := e.store.Get(t.Context(), "SO1001")
	require.NoError(t, err)
	require.Equal(t, "second", o.Remark)
	st, err := e.sequencer().Status(t.Context(), "SO1001")
	require.NoError(t, err)
	require.Empty(t, st.Log, "nothing skipped")
}

func TestShardsConfigValidation(t *testing.T) {
	e := newEnv(t)
	for _, cfg := range []worker.Config{
		{Shards: tasks.Shards{Count: 65}},
		{Shards: tasks.Shards{Count: 3, Draining: []int{-1}}},
		{Queues: map[string]int{"order_modify:1": 3}},
	} {
		cfg.KeyPrefix = e.db.Prefix
		_, err := worker.New(e.db.Client, e.store, cfg)
		require.Error(t, err, "%+v", cfg)
	}
}
