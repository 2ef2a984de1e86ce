package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// producer returns a producer on the test's Redis with its key prefix.
func (e *env) producer(cfg producer.Config) *producer.Producer {
	e.t.Helper()
	cfg.KeyPrefix = e.db.Prefix
	p, err := producer.New(e.db.NewClient(e.t), cfg)
	require.NoError(e.t, err)
	return p
}

// sequencer reads and writes the orders' sequences of the test.
func (e *env) sequencer() *keyorder.Sequencer {
	e.t.Helper()
	q, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(e.t, err)
	return q
}

// runs collects the workers' OnDone reports.
type runs struct {
	mu  sync.Mutex
	all []worker.Done
	// added is closed, and replaced, on every add.
	added chan struct{}
	// seen is, for each event ID, how far into all waitFor has looked for
	// it: the index after the run it last returned.
	seen map[string]int
}

func newRuns() *runs { return &runs{added: make(chan struct{}), seen: map[string]int{}} }

func (r *runs) add(d worker.Done) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, d)
	close(r.added)
	r.added = make(chan struct{})
}

// await waits until match holds for a run in all[from():], and returns it
// with its index, or -1 once limit has passed. from is called with r.mu
// held.
func (r *runs) await(limit time.Duration, from func() int, match func(worker.Done) bool) (worker.Done, int) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		r.mu.Lock()
		for i := from(); i < len(r.all); i++ {
			if match(r.all[i]) {
				d := r.all[i]
				r.mu.Unlock()
				return d, i
			}
		}
		added := r.added
		r.mu.Unlock()
		select {
		case <-added:
		case <-timer.C:
			return worker.Done{}, -1
		}
	}
}

// waitFor waits for a run of event id with an outcome in want, among every
// run recorded (whatever other event IDs' runs came before or after it),
// and returns it. Each waitFor for id looks only after the run that the
// last one for id returned, so waiting twice for an ID finds two runs, in
// the order they were reported.
func (r *runs) waitFor(t *testing.T, id string, limit time.Duration, want ...string) worker.Done {
	t.Helper()
	d, i := r.await(limit, func() int { return r.seen[id] }, func(d worker.Done) bool {
		return d.EventID == id && (len(want) == 0 || contains(want, d.Outcome))
	})
	if i < 0 {
		t.Fatalf("no run of %s with outcome %v within %v", id, want, limit)
	}
	r.mu.Lock()
	r.seen[id] = i + 1
	r.mu.Unlock()
	return d
}

// outcomes returns the outcomes of id's runs so far, in order.
func (r *runs) outcomes(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.all {
		if d.EventID == id {
			out = append(out, d.Outcome)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitState waits until asynq has the task in state: a worker reports a
// run (OnDone) just before asynq records its end.
func (e *env) waitState(queue, id string, state asynq.TaskState) {
	e.t.Helper()
	require.EventuallyWithT(e.t, func(c *assert.CollectT) {
		info, err := e.insp.GetTaskInfo(queue, id)
		if assert.NoError(c, err) {
			assert.Equal(c, state, info.State)
		}
	}, 10*time.Second, 10*time.Millisecond)
}

// history returns an order's history.
func (e *env) history(no string) []orders.Entry {
	e.t.Helper()
	h, err := orders.AllHistory(e.t.Context(), e.store, no)
	require.NoError(e.t, err)
	return h
}

// requireInSequence checks that an order's history applies its positions in
// increasing order.
func requireInSequence(t *testing.T, hist []orders.Entry) {
	t.Helper()
	var last int64
	for _, h := range hist {
		if h.Seq == 0 {
			continue
		}
		require.Greater(t, h.Seq, last, "%s (position %d) applied after position %d", h.EventID, h.Seq, last)
		last = h.Seq
	}
}

// slowKinds are the kinds whose every write takes d, so that tasks pile
// up behind a hot order.
func slowKinds(d time.Duration) []worker.Kind { return storehook.Kinds(nil, storehook.Delay(d)) }

// Changes sent one after another apply in the order they were sent, across
// several workers, even when many wait behind one hot order.
func TestChangesApplyInAcceptanceOrder(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-SEQ")
	for range 3 {
		e.startWorker(worker.Config{Concurrency: 6, Kinds: slowKinds(2 * time.Millisecond)}, nil)
	}
	p := e.producer(producer.Config{})
	const n = 40
	for i := range n {
		_, err := p.EnqueueModify(t.Context(), "SO-SEQ", tasks.Changes{Remark: new("r" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	e.drain(time.Minute)
	hist := e.history("SO-SEQ")
	require.Len(t, hist, n+1, "the put and every modify, once")
	requireInSequence(t, hist)
	o, err := e.store.Get(t.Context(), "SO-SEQ")
	require.NoError(t, err)
	require.Equal(t, "r"+strconv.Itoa(n-1), o.Remark, "last word last")
}

// Several producer processes send to shared hot orders, one after another
// each: every order's history follows its sequence, and each producer's
// changes of an order apply in the order it sent them.
func TestSequencesUnderConcurrency(t *testing.T) {
	e := newEnv(t)
	orderNos := []string{"SO-C1", "SO-C2", "SO-C3"}
	for _, no := range orderNos {
		e.seed(no)
	}
	for range 3 {
		e.startWorker(worker.Config{Concurrency: 8}, nil)
	}
	const clients, each = 4, 30
	sent := make([][]string, clients) // event IDs per client, in send order
	var wg sync.WaitGroup
	for c := range clients {
		p := e.producer(producer.Config{})
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("c%d-%d", c, i)
				no := orderNos[(c+i)%len(orderNos)]
				_, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new(id)}, producer.WithEventID(id))
				require.NoError(t, err)
				sent[c] = append(sent[c], no+" "+id)
			}
		})
	}
	wg.Wait()
	e.drain(2 * time.Minute)

	at := map[string]int{} // event → its index in its order's history
	for _, no := range orderNos {
		hist := e.history(no)
		requireInSequence(t, hist)
		for i, h := range hist {
			at[no+" "+h.EventID] = i
		}
		o, err := e.store.Get(t.Context(), no)
		require.NoError(t, err)
		require.Equal(t, hist[len(hist)-1].EventID, o.Remark, "%s ends as its last change said", no)
	}
	for c := range clients {
		last := map[string]int{}
		for _, key := range sent[c] {
			i, ok := at[key]
			require.True(t, ok, "%s applied", key)
			no := strings.Fields(key)[0]
			require.Greater(t, i, last[no], "client %d: %s applied before its earlier change", c, key)
			last[no] = i
		}
	}
}

// A task enqueued with MaxRetry(0) that has to wait, for its turn and for
// the lock, is never archived for it.
func TestMaxRetryZeroWaitsWithoutBeingArchived(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-M0")
	r := newRuns()
	for range 2 {
		e.startWorker(worker.Config{
			Concurrency:  4,
			Waits:        map[string]worker.Wait{"modify": {MinDelay: 5 * time.Millisecond, MaxDelay: 10 * time.Millisecond, Deadline: 20 * time.Millisecond}},
			BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 20 * time.Millisecond,
			OnDone: r.add, Kinds: slowKinds(30 * time.Millisecond),
		}, nil)
	}
	p := e.producer(producer.Config{MaxRetry: -1})
	const n = 12
	for i := range n {
		_, err := p.EnqueueModify(t.Context(), "SO-M0", tasks.Changes{Remark: new(strconv.Itoa(i))}, producer.WithMaxRetry(0))
		require.NoError(t, err)
	}
	// And one enqueued by hand without a position, with asynq's MaxRetry at
	// 1 (a budget of 0 by tasks.MaxRetry's rule).
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "by-hand", OrderNo: "SO-M0", Changes: tasks.Changes{Address: new("9 Hand St")}})
	require.NoError(t, err)
	_, err = e.cli.Enqueue(task, asynq.Queue(tasks.QueueModify), asynq.TaskID("by-hand"), asynq.MaxRetry(1), asynq.Retention(time.Hour))
	require.NoError(t, err)
	e.drain(time.Minute)

	archived, err := e.insp.ListArchivedTasks(tasks.QueueModify)
	require.NoError(t, err)
	require.Empty(t, archived, "waiting archived a task")
	hist := e.history("SO-M0")
	require.Len(t, hist, n+2)
	requireInSequence(t, hist)
	r.mu.Lock()
	defer r.mu.Unlock()
	waited := 0
	for _, d := range r.all {
		if d.Outcome == worker.OutcomeWaiting || d.Outcome == worker.OutcomeBusy {
			waited++
		}
	}
	require.Positive(t, waited, "the test must make tasks wait")
}

// quickGapConfig is a worker's configuration with gap wait gap that
// reports its runs to r and waits briefly for a turn or a busy lock, so
// that tasks go back to their queue and try again often.
func quickGapConfig(gap time.Duration, r *runs) worker.Config {
	return worker.Config{GapWait: gap, OnDone: r.add,
		Waits:        map[string]worker.Wait{"modify": {MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: 100 * time.Millisecond}},
		BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond}
}

// Each kind of gap is skipped after the gap wait, and only then: a position
// whose producer died before enqueueing, and a task deleted from the queue.
// A refused enqueue's position is passed at once.
func TestGapsAreSkippedAfterTheWait(t *testing.T) {
	const gap = 2 * time.Second
	e := newEnv(t)
	e.seed("SO-GAP")
	r := newRuns()
	e.startWorker(quickGapConfig(gap, r), nil)
	p := e.producer(producer.Config{ParkFor: gap})
	q := e.sequencer()

	// 1. A producer that took a position and died.
	reserved := time.Now()
	dead, err := q.Reserve(t.Context(), "SO-GAP", tasks.PositionLabel(tasks.TypeModify, "never-sent"), "")
	require.NoError(t, err)
	after, err := p.EnqueueModify(t.Context(), "SO-GAP", tasks.Changes{Remark: new("after the dead one")}, producer.WithEventID("after-dead"))
	require.NoError(t, err)
	d := r.waitFor(t, "after-dead", 30*time.Second, worker.OutcomeOK)
	require.GreaterOrEqual(t, time.Since(reserved), gap, "skipped only after the gap wait")
	require.Equal(t, 1, d.Skipped)
	require.Equal(t, after.Seq, d.Seq)

	// 2. A task deleted from the queue while it waited to run.
	later, err := p.EnqueueModify(t.Context(), "SO-GAP", tasks.Changes{Remark: new("deleted")},
		producer.WithEventID("deleted"), producer.WithProcessIn(time.Hour))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-GAP", tasks.Changes{Remark: new("after the deleted one")}, producer.WithEventID("after-deleted"))
	require.NoError(t, err)
	r.waitFor(t, "after-deleted", 30*time.Second, worker.OutcomeWaiting)
	require.NoError(t, e.insp.DeleteTask(tasks.QueueModify, "deleted"))
	d = r.waitFor(t, "after-deleted", 30*time.Second, worker.OutcomeOK)
	require.Equal(t, 1, d.Skipped)

	// 3. An enqueue refused as a duplicate: its position is voided, no wait.
	_, err = p.EnqueueModify(t.Context(), "SO-GAP", tasks.Changes{Remark: new("after the deleted one")}, producer.WithEventID("after-deleted"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	_, err = p.EnqueueModify(t.Context(), "SO-GAP", tasks.Changes{Remark: new("last")}, producer.WithEventID("last"))
	require.NoError(t, err)
	d = r.waitFor(t, "last", 30*time.Second, worker.OutcomeOK)
	// Without the gap wait: its first run found its turn (a gap would have
	// sent it back to its queue, waiting, until the gap wait passed),
	// however long that run took to begin.
	require.Equal(t, []string{worker.OutcomeOK}, r.outcomes("last"), "a voided position is passed without the gap wait")
	require.Zero(t, d.Skipped)

	st, err := q.Status(t.Context(), "SO-GAP")
	require.NoError(t, err)
	require.Empty(t, st.Pending)
	reasons := map[int64]string{}
	for _, s := range st.Log {
		reasons[s.Pos] = s.Reason
	}
	require.Contains(t, reasons[dead], "never-sent is not in queue order_modify")
	require.Contains(t, reasons[later.Seq], "deleted is not in queue order_modify")
	require.Len(t, reasons, 3, "the two gaps and the void")
	hist := e.history("SO-GAP")
	requireInSequence(t, hist)
	o, err := e.store.Get(t.Context(), "SO-GAP")
	require.NoError(t, err)
	require.Equal(t, "last", o.Remark)
}

// A queue missing from asynq's set of queues (a failover lost the listing
// that its first enqueue made) makes asynq's Inspector answer "queue not
// found" for tasks that exist: the gap check then lists the queue again
// and finds the head's task, instead of skipping its position.
func TestGapCheckListsAnUnlistedQueueAgain(t *testing.T) {
	const gap = time.Second
	e := newEnv(t)
	if e.db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	e.seed("SO-UNL")
	r := newRuns()
	e.startWorker(quickGapConfig(gap, r), nil)
	p := e.producer(producer.Config{ParkFor: time.Second}) // a parked change comes back as soon as the gap wait allows
	head, err := p.EnqueueModify(t.Context(), "SO-UNL", tasks.Changes{Remark: new("in an hour")},
		producer.WithEventID("later"), producer.WithProcessIn(time.Hour))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-UNL", tasks.Changes{Remark: new("behind")}, producer.WithEventID("behind"))
	require.NoError(t, err)
	r.waitFor(t, "behind", 30*time.Second, worker.OutcomeWaiting)
	require.NoError(t, e.db.Client.SRem(t.Context(), asynqredis.AllQueues, tasks.QueueModify).Err())

	require.Eventually(t, func() bool {
		listed, err := e.db.Client.SIsMember(t.Context(), asynqredis.AllQueues, tasks.QueueModify).Result()
		return err == nil && listed
	}, 30*time.Second, 20*time.Millisecond, "the gap check lists the queue again")
	st, err := e.sequencer().Status(t.Context(), "SO-UNL")
	require.NoError(t, err)
	require.NotEmpty(t, st.Pending)
	require.Equal(t, head.Seq, st.Pending[0].Pos, "the head's position is not skipped")
	for _, s := range st.Log {
		require.NotEqual(t, head.Seq, s.Pos, "the head's position is not settled: %+v", s)
	}

	// Once the task is gone for real, the position is skipped.
	require.NoError(t, e.insp.DeleteTask(tasks.QueueModify, "later"))
	d := r.waitFor(t, "behind", 30*time.Second, worker.OutcomeOK)
	require.Equal(t, 1, d.Skipped)
}

// An archived task uses up its position at once: a rejected change, and a
// task found on another kind's queue.
func TestArchivedTaskUsesUpItsPosition(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-ARCH")
	r := newRuns()
	e.startWorker(worker.Config{GapWait: time.Hour, OnDone: r.add}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueExchange(t.Context(), "SO-ARCH", []tasks.Item{{SKU: "X", Qty: 1}}, producer.WithNewOrderNo("SO-ARCH-B"), producer.WithEventID("x"))
	require.NoError(t, err)
	// Rejected: the order is exchanged by then.
	_, err = p.EnqueueModify(t.Context(), "SO-ARCH", tasks.Changes{Remark: new("too late")}, producer.WithEventID("late"))
	require.NoError(t, err)
	d := r.waitFor(t, "late", 30*time.Second, worker.OutcomeRejected)
	require.ErrorContains(t, d.Err, "SO-ARCH-B", "the rejection names the replacement")
	// The store's commit passed the turn on; the archive is noted in the
	// order's sequence log.
	requireNote(t, e, "SO-ARCH", d.Seq, tasks.PositionLabel(tasks.TypeModify, "late"), "archived: ", "SO-ARCH-B")

	// A modify on the exchange queue, with a real position.
	q := e.sequencer()
	pos, err := q.Reserve(t.Context(), "SO-ARCH-B", tasks.PositionLabel(tasks.TypeModify, "misplaced"), "")
	require.NoError(t, err)
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "misplaced", OrderNo: "SO-ARCH-B", Seq: pos, Changes: tasks.Changes{Remark: new("wrong queue")}})
	require.NoError(t, err)
	_, err = e.cli.Enqueue(task, asynq.Queue(tasks.QueueExchange), asynq.TaskID("misplaced"), asynq.MaxRetry(3))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-ARCH-B", tasks.Changes{Remark: new("right after")}, producer.WithEventID("right-after"))
	require.NoError(t, err)
	r.waitFor(t, "right-after", 30*time.Second, worker.OutcomeOK)
	info := e.taskInfo(tasks.QueueExchange, "misplaced")
	require.Equal(t, asynq.TaskStateArchived, info.State)
	require.Contains(t, info.LastErr, "its queue is order_modify")
	b, err := e.store.Get(t.Context(), "SO-ARCH-B")
	require.NoError(t, err)
	require.Equal(t, "right after", b.Remark)
}

// An exchange takes its place in its order's sequence: the modifies
// accepted before it apply before it and reach the replacement through the
// copied fields; those after it are rejected naming the replacement; a
// modify of the replacement sent after it waits for the creation.
func TestExchangeInTheMiddleOfASequence(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-MID")
	r := newRuns()
	for range 2 {
		e.startWorker(worker.Config{Concurrency: 4, OnDone: r.add, Kinds: slowKinds(20 * time.Millisecond)}, nil)
	}
	p := e.producer(producer.Config{})
	send := func(id string, f func() (producer.Result, error)) {
		t.Helper()
		_, err := f()
		require.NoError(t, err, id)
	}
	send("m1", func() (producer.Result, error) {
		return p.EnqueueModify(t.Context(), "SO-MID", tasks.Changes{Address: new("1 First St")}, producer.WithEventID("m1"))
	})
	send("m2", func() (producer.Result, error) {
		return p.EnqueueModify(t.Context(), "SO-MID", tasks.Changes{Remark: new("second")}, producer.WithEventID("m2"))
	})
	send("x", func() (producer.Result, error) {
		return p.EnqueueExchange(t.Context(), "SO-MID", []tasks.Item{{SKU: "NEW", Qty: 2}},
			producer.WithEventID("x"), producer.WithNewOrderNo("SO-MID-B"))
	})
	send("m3", func() (producer.Result, error) {
		return p.EnqueueModify(t.Context(), "SO-MID", tasks.Changes{Remark: new("third")}, producer.WithEventID("m3"))
	})
	send("b1", func() (producer.Result, error) {
		return p.EnqueueModify(t.Context(), "SO-MID-B", tasks.Changes{Remark: new("on the replacement")}, producer.WithEventID("b1"))
	})
	e.drain(time.Minute)

	b, err := e.store.Get(t.Context(), "SO-MID-B")
	require.NoError(t, err)
	require.Equal(t, "1 First St", b.Address, "m1 reached the replacement")
	require.Equal(t, "on the replacement", b.Remark, "b1 waited for the creation, then applied")
	require.Equal(t, []tasks.Item{{SKU: "NEW", Qty: 2}}, b.Items)
	m3 := e.taskInfo(tasks.QueueModify, "m3")
	require.Equal(t, asynq.TaskStateArchived, m3.State)
	require.Contains(t, m3.LastErr, "SO-MID-B")
	require.Zero(t, m3.Retried)
	for _, id := range []string{"m1", "m2", "b1"} {
		require.Equal(t, asynq.TaskStateCompleted, e.taskInfo(tasks.QueueModify, id).State, id)
	}
	requireInSequence(t, e.history("SO-MID"))
}

// gateFirstExchange returns the worker's kinds with the first exchange's
// write held up: entered is closed when it reaches its write, which waits
// until gate is closed (or its run ends).
func gateFirstExchange() (kinds []worker.Kind, entered, gate chan struct{}) {
	entered, gate = make(chan struct{}), make(chan struct{})
	var gated atomic.Bool
	kinds = storehook.Kinds(nil, func(ctx context.Context, typ, ev, no string) error {
		if typ == tasks.TypeExchange && gated.CompareAndSwap(false, true) {
			close(entered)
			select {
			case <-gate:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	})
	return kinds, entered, gate
}

// A creation's position is held by the exchange that creates the order: a
// task of the exchanged order, which holds a position of that order. It is
// no gap: however long the exchange is held up past the gap wait, the
// replacement's changes wait for it, and nothing is skipped.
func TestACreationHeldUpPastTheGapWaitIsNoGap(t *testing.T) {
	const gap = time.Second
	e := newEnv(t)
	e.seed("SO-CG")
	hold, entered, gate := gateFirstExchange()
	r := newRuns()
	cfg := quickGapConfig(gap, r)
	cfg.Kinds, cfg.Concurrency = hold, 4
	e.startWorker(cfg, nil)
	p := e.producer(producer.Config{ParkFor: gap})
	_, err := p.EnqueueExchange(t.Context(), "SO-CG", []tasks.Item{{SKU: "N", Qty: 1}}, producer.WithEventID("cg-x"), producer.WithNewOrderNo("SO-CG-B"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-CG-B", tasks.Changes{Remark: new("behind the creation")}, producer.WithEventID("cg-behind"))
	require.NoError(t, err)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the exchange never reached its write")
	}
	// The modify comes back from its park every gap wait, and each time
	// past the first the head (the creation) has waited longer than the
	// gap wait: the gap check looks at it.
	for since := time.Now(); time.Since(since) < 3*gap; {
		r.waitFor(t, "cg-behind", 30*time.Second, worker.OutcomeWaiting)
	}
	close(gate)
	d := r.waitFor(t, "cg-behind", 30*time.Second, worker.OutcomeOK)
	require.Zero(t, d.Skipped, "the creation's position was not skipped")
	b, err := e.store.Get(t.Context(), "SO-CG-B")
	require.NoError(t, err)
	require.Equal(t, "behind the creation", b.Remark)
}

// A modify of a replacement that is still being created waits for it; if
// the exchange that was to create it is rejected, so is the modify, with
// the reason.
func TestModifyOfAReplacementBeingCreated(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-RC")
	hold, _, gate := gateFirstExchange()
	r := newRuns()
	e.startWorker(worker.Config{Concurrency: 4, OnDone: r.add, Kinds: hold,
		Waits:        map[string]worker.Wait{"modify": {MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: 100 * time.Millisecond}},
		BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueExchange(t.Context(), "SO-RC", []tasks.Item{{SKU: "N", Qty: 1}}, producer.WithEventID("x1"), producer.WithNewOrderNo("SO-RC-B"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-RC-B", tasks.Changes{Remark: new("early")}, producer.WithEventID("early"))
	require.NoError(t, err)
	// It is parked at acceptance, behind the creation: it does not run
	// while the exchange is held up.
	e.waitState(tasks.QueueModify, "early", asynq.TaskStateRetry)
	close(gate)
	r.waitFor(t, "early", 30*time.Second, worker.OutcomeOK)
	b, err := e.store.Get(t.Context(), "SO-RC-B")
	require.NoError(t, err)
	require.Equal(t, "early", b.Remark)

	// An exchange of an order that is exchanged already is rejected: the
	// modify of its would-be replacement is rejected with the reason.
	_, err = p.EnqueueExchange(t.Context(), "SO-RC", []tasks.Item{{SKU: "N", Qty: 1}}, producer.WithEventID("x2"), producer.WithNewOrderNo("SO-RC-C"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-RC-C", tasks.Changes{Remark: new("never")}, producer.WithEventID("never"))
	require.NoError(t, err)
	d := r.waitFor(t, "never", 30*time.Second, worker.OutcomeRejected)
	require.ErrorContains(t, d.Err, "x2")
	require.ErrorContains(t, d.Err, "SO-RC-B", "the reason the exchange was rejected")
	// asynq records x2's end after "never" learns of it (and after its
	// ErrorHandler): wait for it.
	e.waitState(tasks.QueueExchange, "x2", asynq.TaskStateArchived)
}

// A task that keeps failing is archived by the worker once it is out of
// its failure budget; its position is used up and the next change goes.
func TestFailureBudgetThenArchive(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-FAIL")
	var fails atomic.Int32
	failing := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error {
		if ev == "doomed" {
			fails.Add(1)
			return errors.New("upstream said 500")
		}
		return nil
	})
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add, Kinds: failing, Failures: map[string]worker.FailurePolicy{"modify": worker.Continue}}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueModify(t.Context(), "SO-FAIL", tasks.Changes{Remark: new("x")}, producer.WithEventID("doomed"), producer.WithMaxRetry(1))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-FAIL", tasks.Changes{Remark: new("after")}, producer.WithEventID("after-doomed"))
	require.NoError(t, err)
	first := r.waitFor(t, "doomed", 30*time.Second, worker.OutcomeError)
	require.Zero(t, first.Retried)
	// Speed the backoff up: run the retried task now.
	require.Eventually(t, func() bool { return e.insp.RunTask(tasks.QueueModify, "doomed") == nil }, 10*time.Second, 10*time.Millisecond)
	d := r.waitFor(t, "doomed", 30*time.Second, worker.OutcomeRejected)
	require.ErrorContains(t, d.Err, "out of its failure budget")
	require.EqualValues(t, 2, fails.Load(), "one attempt and one retry")
	r.waitFor(t, "after-doomed", 30*time.Second, worker.OutcomeOK)
	// asynq records the archive just after the run's OnDone, which the
	// next change's run may beat.
	e.waitState(tasks.QueueModify, "doomed", asynq.TaskStateArchived)
	requireNote(t, e, "SO-FAIL", d.Seq, tasks.PositionLabel(tasks.TypeModify, "doomed"), "archived: ", "out of its failure budget")
}

// TestFailureBudgetThenHalt is the default failure policy of the
// contract's kinds: a modify that fails past its budget (MaxRetry 0) is
// archived and halts its order, which keeps it as its head, listed as
// halted with the error, and applies nothing behind it.
func TestFailureBudgetThenHalt(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-HALT")
	failing := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error {
		if ev == "doomed" {
			return errors.New("upstream said 500")
		}
		return nil
	})
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add, Kinds: failing}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueModify(t.Context(), "SO-HALT", tasks.Changes{Remark: new("x")}, producer.WithEventID("doomed"), producer.WithMaxRetry(0))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-HALT", tasks.Changes{Remark: new("after")}, producer.WithEventID("after-doomed"))
	require.NoError(t, err)
	d := r.waitFor(t, "doomed", 30*time.Second, worker.OutcomeRejected)
	require.ErrorContains(t, d.Err, "out of its failure budget")
	e.waitState(tasks.QueueModify, "doomed", asynq.TaskStateArchived)
	st, err := e.sequencer().Status(t.Context(), "SO-HALT")
	require.NoError(t, err)
	require.NotNil(t, st.Paused, "the order is not halted")
	require.Equal(t, tasks.PositionLabel(tasks.TypeModify, "doomed"), st.Paused.Halted)
	require.Contains(t, st.Paused.Reason, "upstream said 500")
	require.Equal(t, int64(2), st.Waiting, "the halted head and the change behind it")
	requireNote(t, e, "SO-HALT", d.Seq, tasks.PositionLabel(tasks.TypeModify, "doomed"), "halted: ", "out of its failure budget")
	require.NotContains(t, r.outcomes("after-doomed"), worker.OutcomeOK, "the change behind the halted head was applied")
}

// requireNote checks that the sequence log of order no has a note of
// position pos under label whose reason starts with prefix and contains
// want.
func requireNote(t *testing.T, e *env, no string, pos int64, label, prefix, want string) {
	t.Helper()
	st, err := e.sequencer().Status(t.Context(), no)
	require.NoError(t, err)
	for _, l := range st.Log {
		if l.Kind == "note" && l.Pos == pos && l.Label == label {
			require.True(t, strings.HasPrefix(l.Reason, prefix), l.Reason)
			require.Contains(t, l.Reason, want)
			return
		}
	}
	t.Fatalf("no note of position %d (%s) in %s's log: %+v", pos, label, no, st.Log)
}

// A handler that panics releases its order's lock on the way out.
func TestPanicReleasesTheOrder(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-PANIC")
	var panicked atomic.Bool
	boom := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error {
		if ev == "boom" && panicked.CompareAndSwap(false, true) {
			panic("handler bug")
		}
		return nil
	})
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add, Kinds: boom}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueModify(t.Context(), "SO-PANIC", tasks.Changes{Remark: new("b")}, producer.WithEventID("boom"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := e.insp.GetTaskInfo(tasks.QueueModify, "boom")
		return err == nil && strings.Contains(info.LastErr, "panic")
	}, 30*time.Second, 10*time.Millisecond)
	n, err := e.db.Client.Exists(t.Context(), e.db.Prefix+"lock:{SO-PANIC}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock was released, not left to its lease")
}

// The lock step reads the payload as strictly as the handler: a payload
// that names its order twice, or with a near-miss key, is archived without
// taking any order's lock (found in review: the lock step took SO2's lock
// before the strict parser refused the task).
func TestMalformedPayloadTakesNoLock(t *testing.T) {
	e := newEnv(t)
	e.seed("SO2")
	e.seed("SO3")
	waits := make(chan string, 10)
	c := e.db.NewClient(t)
	space, err := keyorder.NewSequencer(c, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	l, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	// SO2 is held: a task that took its lock would wait for it.
	held, err := l.Acquire(t.Context(), "SO2", "someone else")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	r := newRuns()
	w, err := worker.New(c, e.store, worker.Config{KeyPrefix: e.db.Prefix, OnDone: r.add, Logger: zaptest.NewLogger(t),
		OnLockWait: func(orderNo, _, _ string) { waits <- orderNo }})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)
	for id, payload := range map[string]string{
		"twice":     `{"event_id":"twice","order_no":"SO3","order_no":"SO2","changes":{"remark":"x"}}`,
		"near-miss": `{"event_id":"near-miss","order_no":"SO3","ORDER_NO":"SO2","changes":{"remark":"x"}}`,
	} {
		e.enqueue(asynq.NewTask(tasks.TypeModify, []byte(payload)), tasks.QueueModify, id)
	}
	for _, id := range []string{"twice", "near-miss"} {
		r.final(t, id)
	}
	r.mu.Lock()
	all := slices.Clone(r.all)
	r.mu.Unlock()
	for _, d := range all { // every run, not only the final one
		require.Equal(t, worker.OutcomeRejected, d.Outcome, "%s: %v", d.TaskID, d.Err)
		require.False(t, d.Locked, d.TaskID)
	}
	select {
	case key := <-waits:
		t.Fatalf("a malformed task waited for the lock of %s", key)
	default:
	}
	for _, id := range []string{"twice", "near-miss"} {
		e.waitState(tasks.QueueModify, id, asynq.TaskStateArchived)
		require.Zero(t, e.taskInfo(tasks.QueueModify, id).Retried)
	}
}

// A task that arrives after its position was skipped (its producer stalled
// past the gap wait between taking the position and enqueueing) applies
// only if no later change has been applied to its order: it never undoes
// a later word. So does a change run again by hand after its dedupe record
// expired.
func TestLateTaskNeverUndoesALaterChange(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-LATE")
	r := newRuns()
	e.startWorker(worker.Config{GapWait: time.Second, OnDone: r.add,
		Waits:        map[string]worker.Wait{"modify": {MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: 100 * time.Millisecond}},
		BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond}, nil)
	// after-1 is parked behind the position without a task: it comes back
	// after ParkFor, set to the workers' GapWait as the producer asks.
	p := e.producer(producer.Config{ParkFor: time.Second})
	q := e.sequencer()
	late := func(id string, pos int64, remark string) {
		t.Helper()
		task, err := tasks.NewTask(tasks.ModifyPayload{EventID: id, OrderNo: "SO-LATE", Seq: pos, Changes: tasks.Changes{Remark: new(remark)}})
		require.NoError(t, err)
		e.enqueue(task, tasks.QueueModify, id)
	}

	// A position skipped, and the change after it applied: the late task
	// is archived with the reason.
	pos1, err := q.Reserve(t.Context(), "SO-LATE", tasks.PositionLabel(tasks.TypeModify, "late-1"), "")
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-LATE", tasks.Changes{Remark: new("later word")}, producer.WithEventID("after-1"))
	require.NoError(t, err)
	require.Equal(t, 1, r.waitFor(t, "after-1", 30*time.Second, worker.OutcomeOK).Skipped)
	late("late-1", pos1, "earlier word")
	d := r.waitFor(t, "late-1", 30*time.Second, worker.OutcomeRejected)
	require.ErrorIs(t, d.Err, orders.ErrPassed)
	require.ErrorContains(t, d.Err, "the newest applied")
	e.waitState(tasks.QueueModify, "late-1", asynq.TaskStateArchived)

	// A position skipped with nothing applied after it: the late task
	// applies, in its order still.
	pos2, err := q.Reserve(t.Context(), "SO-LATE", tasks.PositionLabel(tasks.TypeModify, "late-2"), "")
	require.NoError(t, err)
	st, err := q.Status(t.Context(), "SO-LATE")
	require.NoError(t, err)
	require.Len(t, st.Pending, 1)
	_, err = q.Skip(t.Context(), "SO-LATE", pos2, st.Pending[0].Record, "its task was not found")
	require.NoError(t, err)
	late("late-2", pos2, "late but last")
	r.waitFor(t, "late-2", 30*time.Second, worker.OutcomeOK)

	// The same change run again by hand, its record gone (deleted here,
	// expired in life): refused by the sequence, since a later one applied.
	_, err = p.EnqueueModify(t.Context(), "SO-LATE", tasks.Changes{Remark: new("last word")}, producer.WithEventID("after-2"))
	require.NoError(t, err)
	r.waitFor(t, "after-2", 30*time.Second, worker.OutcomeOK)
	keys, err := e.db.Client.Keys(t.Context(), e.db.Prefix+"order:{SO-LATE}:ev:*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, e.db.Client.Del(t.Context(), keys...).Err())
	e.waitState(tasks.QueueModify, "late-2", asynq.TaskStateCompleted)
	require.NoError(t, e.insp.DeleteTask(tasks.QueueModify, "late-2"))
	late("late-2", pos2, "late but last")
	d = r.waitFor(t, "late-2", 30*time.Second, worker.OutcomeRejected)
	require.ErrorIs(t, d.Err, orders.ErrPassed)

	o, err := e.store.Get(t.Context(), "SO-LATE")
	require.NoError(t, err)
	require.Equal(t, "last word", o.Remark)
	requireInSequence(t, e.history("SO-LATE"))
}

// An operator's hold parks a held order's head again and again without
// spending a retry, even with a failure budget of 0 (MaxRetry(0)) and a
// short gap wait: nothing is archived, and after the resume the changes
// apply in order.
func TestHoldParksWithoutArchivingAtMaxRetryZero(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-HOLD")
	r := newRuns()
	e.startWorker(quickGapConfig(100*time.Millisecond, r), nil)
	q := e.sequencer()
	_, err := q.Pause(t.Context(), "SO-HOLD", "test", "hold across parks")
	require.NoError(t, err)
	p := e.producer(producer.Config{ParkFor: time.Second})
	for _, id := range []string{"hold-1", "hold-2"} {
		_, err := p.EnqueueModify(t.Context(), "SO-HOLD", tasks.Changes{Remark: new(id)}, producer.WithEventID(id), producer.WithMaxRetry(0))
		require.NoError(t, err)
	}
	for range 3 { // parked, back, parked again: well past any retry
		r.waitFor(t, "hold-1", 30*time.Second, worker.OutcomeWaiting)
	}
	info := e.taskInfo(tasks.QueueModify, "hold-1")
	require.Zero(t, info.Retried, "a hold spends no retry")
	require.Empty(t, e.history("SO-HOLD")[1:], "nothing applied while held")

	_, st, err := q.Resume(t.Context(), "SO-HOLD")
	require.NoError(t, err)
	require.NoError(t, keyorder.Wake(t.Context(), e.db.Client, orderkeys.Locate(tasks.Shards{}, tasks.Kinds()), "SO-HOLD", st.Wake))
	r.waitFor(t, "hold-1", 30*time.Second, worker.OutcomeOK)
	r.waitFor(t, "hold-2", 30*time.Second, worker.OutcomeOK)
	archived, err := e.insp.ListArchivedTasks(tasks.QueueModify)
	require.NoError(t, err)
	require.Empty(t, archived)
	requireInSequence(t, e.history("SO-HOLD"))
}

// A change whose run outlived its deadline with no failure budget left
// (MaxRetry 0: asynq counts such a run, which the worker never sees end)
// is archived in its turn without running again, as the engine's Runner
// does, and the change behind it goes on.
func TestAChangePastItsBudgetIsArchivedWithoutRunningAgain(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-PB")
	var runs atomic.Int32
	hook := func(ctx context.Context, _, ev, _ string) error {
		if ev == "pb-1" {
			runs.Add(1)
			<-ctx.Done() // past the task's deadline
			return context.Cause(ctx)
		}
		return nil
	}
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add, Kinds: storehook.Kinds(nil, hook), Failures: map[string]worker.FailurePolicy{"modify": worker.Continue}}, nil)
	p := e.producer(producer.Config{Timeout: time.Second})
	for _, id := range []string{"pb-1", "pb-2"} {
		_, err := p.EnqueueModify(t.Context(), "SO-PB", tasks.Changes{Remark: new(id)}, producer.WithEventID(id), producer.WithMaxRetry(0))
		require.NoError(t, err)
	}
	q := tasks.Shards{}.Placements(tasks.Modify, "SO-PB")[0]
	require.Eventually(t, func() bool {
		info, err := e.insp.GetTaskInfo(q, "pb-1")
		if err == nil && info.State == asynq.TaskStateRetry && info.Retried > 0 {
			_ = e.insp.RunTask(q, "pb-1") // skip asynq's backoff of the run that timed out
		}
		return err == nil && info.State == asynq.TaskStateArchived
	}, 20*time.Second, 5*time.Millisecond, "the change that timed out was never archived")
	require.Equal(t, int32(1), runs.Load(), "a change of budget 0 was applied again after its run timed out")
	info, err := e.insp.GetTaskInfo(q, "pb-1")
	require.NoError(t, err)
	require.Contains(t, info.LastErr, "out of its failure budget")
	d := r.waitFor(t, "pb-1", 10*time.Second, worker.OutcomeRejected)
	require.ErrorIs(t, d.Err, keyorder.ErrOutOfBudget)
	r.waitFor(t, "pb-2", 10*time.Second, worker.OutcomeOK)
	var applied []string
	for _, h := range e.history("SO-PB") {
		if h.EventID != "" {
			applied = append(applied, h.EventID)
		}
	}
	require.Equal(t, []string{"pb-2"}, applied, "only pb-2 was applied")
}
