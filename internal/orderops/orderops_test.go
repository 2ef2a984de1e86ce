package orderops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// env is a test's Redis, order store, producer, a real worker and the Ops.
type env struct {
	t     *testing.T
	db    *redistest.DB
	store *redisstore.Store
	p     *producer.Producer
	ops   *orderops.Ops
	seq   *keyorder.Sequencer
	insp  *asynq.Inspector

	mu   sync.Mutex
	done []worker.Done
	ran  chan struct{} // closed and replaced on every run
}

// newEnv starts a worker whose writes run hook first (nil for none).
func newEnv(t *testing.T, hook storehook.Hook) *env {
	t.Helper()
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	e := &env{t: t, db: db, store: store, insp: asynq.NewInspectorFromRedisClient(db.Client), ran: make(chan struct{})}
	t.Cleanup(func() {
		for _, q := range tasks.Kinds() {
			_ = e.insp.DeleteQueue(q.Queue, true)
		}
	})
	e.p, err = producer.New(db.NewClient(t), producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.p.Close() })
	e.ops, err = orderops.New(db.NewClient(t), orderops.Config{KeyPrefix: db.Prefix, Logger: zaptest.NewLogger(t), Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.ops.Close()) })
	e.seq, err = keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)

	w, err := worker.New(db.NewClient(t), store, worker.Config{
		Kinds:     storehook.Kinds(nil, hook),
		KeyPrefix: db.Prefix, LockTTL: 5 * time.Second, Logger: zaptest.NewLogger(t),
		DelayedTaskCheckInterval: 100 * time.Millisecond, TaskCheckInterval: 100 * time.Millisecond,
		OnDone: e.add,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	return e
}

func (e *env) add(d worker.Done) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.done = append(e.done, d)
	close(e.ran)
	e.ran = make(chan struct{})
}

// waitRun waits for a run of event id with outcome.
func (e *env) waitRun(id, outcome string) worker.Done {
	e.t.Helper()
	timer := time.NewTimer(15 * time.Second)
	defer timer.Stop()
	for {
		e.mu.Lock()
		for _, d := range e.done {
			if d.EventID == id && d.Outcome == outcome {
				e.mu.Unlock()
				return d
			}
		}
		ran := e.ran
		e.mu.Unlock()
		select {
		case <-ran:
		case <-timer.C:
			e.t.Fatalf("no run of %s with outcome %s", id, outcome)
		}
	}
}

func (e *env) modify(id, remark string) int64 {
	e.t.Helper()
	r, err := e.p.EnqueueModify(e.t.Context(), "SO1", tasks.Changes{Remark: &remark}, producer.WithEventID(id))
	require.NoError(e.t, err)
	return r.Seq
}

// applied returns the event IDs the order's history applied, in order.
func (e *env) applied(no string) []string {
	e.t.Helper()
	h, err := orders.AllHistory(e.t.Context(), e.store, no)
	require.NoError(e.t, err)
	var ids []string
	var last int64
	for _, x := range h {
		if x.EventID == "" {
			continue
		}
		require.Greater(e.t, x.Seq, last, "applied out of order")
		last = x.Seq
		ids = append(ids, x.EventID)
	}
	return ids
}

func (e *env) waitApplied(no string, want ...string) {
	e.t.Helper()
	require.EventuallyWithT(e.t, func(c *assert.CollectT) {
		assert.Equal(c, want, e.applied(no))
	}, 15*time.Second, 20*time.Millisecond)
}

// logEntry returns the sequence log's last entry of kind whose reason has
// text.
func (e *env) logEntry(kind, text string) keyorder.Settled {
	e.t.Helper()
	st, err := e.seq.Status(e.t.Context(), "SO1")
	require.NoError(e.t, err)
	for i := len(st.Log) - 1; i >= 0; i-- {
		if st.Log[i].Kind == kind && strings.Contains(st.Log[i].Reason, text) {
			return st.Log[i]
		}
	}
	e.t.Fatalf("no %s entry with %q in %+v", kind, text, st.Log)
	return keyorder.Settled{}
}

// note returns the order's last history note whose detail starts with
// prefix.
func (e *env) note(no, prefix string) orders.Entry {
	e.t.Helper()
	h, err := orders.AllHistory(e.t.Context(), e.store, no)
	require.NoError(e.t, err)
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Type == orders.TypeNote && strings.HasPrefix(h[i].Detail, prefix) {
			return h[i]
		}
	}
	e.t.Fatalf("no note %q in the history of %s: %+v", prefix, no, h)
	return orders.Entry{}
}

// failWhile fails every write of event id while on is true.
func failWhile(id string, on *atomic.Bool) storehook.Hook {
	return func(_ context.Context, _, ev, _ string) error {
		if ev == id && on.Load() {
			return errors.New("upstream said 500")
		}
		return nil
	}
}

// waitState waits until task id of queue is in state.
func (e *env) waitState(queue, id string, state asynq.TaskState) {
	e.t.Helper()
	require.EventuallyWithT(e.t, func(c *assert.CollectT) {
		info, err := e.insp.GetTaskInfo(queue, id)
		if assert.NoError(c, err) {
			assert.Equal(c, state, info.State)
		}
	}, 15*time.Second, 10*time.Millisecond)
}

// failOn fails every write of event id.
func failOn(id string) storehook.Hook {
	return func(_ context.Context, _, ev, _ string) error {
		if ev == id {
			return errors.New("upstream said 500")
		}
		return nil
	}
}

// A held order accepts changes but applies none; resumed, it applies them
// in order at once (the parked head is brought back, not left to its park
// delay).
func TestHoldAndResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	_, err := e.ops.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO1", By: "alice"})
	require.ErrorIs(t, err, orderops.ErrInvalid, "hold needs a reason")
	res, err := e.ops.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO1", By: "alice", Reason: "customer on the phone"})
	require.NoError(t, err)
	require.Contains(t, res.Detail, "on hold")
	_, err = e.ops.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO1", By: "bob", Reason: "again"})
	require.ErrorIs(t, err, orderops.ErrRefused)

	e.modify("h-1", "one")
	e.modify("h-2", "two")
	e.modify("h-3", "three")
	d := e.waitRun("h-1", worker.OutcomeWaiting)
	require.ErrorContains(t, d.Err, "on hold")
	require.Empty(t, e.applied("SO1"), "nothing is applied while held")
	st, err := e.seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Waiting, "the changes are accepted")
	require.Equal(t, "alice", st.Paused.By)

	_, err = e.ops.Do(ctx, orderops.Retry, orderops.Request{OrderNo: "SO1", By: "bob"})
	require.ErrorIs(t, err, orderops.ErrRefused, "no retry of a held head")

	_, err = e.ops.Do(ctx, orderops.Resume, orderops.Request{OrderNo: "SO1", By: "bob", Reason: "done"})
	require.NoError(t, err)
	e.waitApplied("SO1", "h-1", "h-2", "h-3") // well within the park delay (GAP_WAIT, 30 s)
	require.Equal(t, "hold by alice: customer on the phone", e.logEntry("action", "hold by").Reason)
	require.Equal(t, "resume by bob: done", e.logEntry("action", "resume by").Reason)
	// and in the order's history, with the principal as the writer
	held, resumed := e.note("SO1", "hold by"), e.note("SO1", "resume by")
	require.Equal(t, "hold by alice: customer on the phone", held.Detail)
	require.Equal(t, "alice", held.Worker)
	require.Equal(t, "resume by bob: done", resumed.Detail)
	require.Equal(t, "bob", resumed.Worker)
	require.False(t, held.EndedAt.After(resumed.EndedAt))
	_, err = e.ops.Do(ctx, orderops.Resume, orderops.Request{OrderNo: "SO1", By: "bob"})
	require.ErrorIs(t, err, orderops.ErrRefused)
}

// Retry now runs a failing head at once instead of after its backoff
// (15 s at least), and the change behind it follows.
func TestRetryNow(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	failed := false
	e := newEnv(t, func(_ context.Context, _, ev, _ string) error {
		mu.Lock()
		defer mu.Unlock()
		if ev == "r-1" && !failed {
			failed = true
			return errors.New("upstream said 500")
		}
		return nil
	})
	ctx := t.Context()
	seq := e.modify("r-1", "one")
	e.modify("r-2", "two")
	e.waitRun("r-1", worker.OutcomeError)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := e.insp.GetTaskInfo(tasks.QueueModify, "r-1")
		if assert.NoError(c, err) {
			assert.Equal(c, asynq.TaskStateRetry, info.State)
		}
	}, 10*time.Second, 10*time.Millisecond)

	res, err := e.ops.Do(ctx, orderops.Retry, orderops.Request{OrderNo: "SO1", By: "carol", Reason: "upstream fixed"})
	require.NoError(t, err)
	require.Equal(t, seq, res.Seq)
	require.Equal(t, "r-1", res.TaskID)
	e.waitApplied("SO1", "r-1", "r-2")
	entry := e.logEntry("action", "retry now")
	require.Equal(t, "retry now by carol: upstream fixed", entry.Reason)
	require.Equal(t, seq, entry.Pos)
	n := e.note("SO1", "retry now")
	require.Equal(t, fmt.Sprintf("retry now position %d by carol: upstream fixed", seq), n.Detail)
	require.Equal(t, "carol", n.Worker)
}

// A modify that fails past its budget (MaxRetry 0) halts its order: a
// resume is refused, and a retry runs it again in its place, the halt
// ended, and the change behind it follows, in order.
func TestRetryAHaltedOrderRunsItsHeadInPlace(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	failed := false
	e := newEnv(t, func(_ context.Context, _, ev, _ string) error {
		mu.Lock()
		defer mu.Unlock()
		if ev == "h-1" && !failed {
			failed = true
			return errors.New("upstream said 500")
		}
		return nil
	})
	ctx := t.Context()
	r, err := e.p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("one")}, producer.WithEventID("h-1"), producer.WithMaxRetry(0))
	require.NoError(t, err)
	e.modify("h-2", "two")
	e.waitRun("h-1", worker.OutcomeRejected)
	e.waitState(tasks.QueueModify, "h-1", asynq.TaskStateArchived)
	st, err := e.seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.NotNil(t, st.Paused, "not halted")
	require.Equal(t, tasks.PositionLabel(tasks.TypeModify, "h-1"), st.Paused.Halted)

	_, err = e.ops.Do(ctx, orderops.Resume, orderops.Request{OrderNo: "SO1", By: "carol", Reason: "go on"})
	require.ErrorIs(t, err, orderops.ErrRefused, "a resume of a halted order")
	require.ErrorContains(t, err, "retry it in its place or skip it")

	res, err := e.ops.Do(ctx, orderops.Retry, orderops.Request{OrderNo: "SO1", By: "carol", Reason: "upstream fixed"})
	require.NoError(t, err)
	require.Equal(t, r.Seq, res.Seq)
	require.Equal(t, "h-1", res.TaskID)
	e.waitApplied("SO1", "h-1", "h-2")
	st, err = e.seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.Nil(t, st.Paused, "still halted")
}

// Skip archives a failing head with the reason and uses up its position:
// the order goes on with the changes behind it, in order.
func TestSkip(t *testing.T) {
	t.Parallel()
	e := newEnv(t, failOn("s-1"))
	ctx := t.Context()
	seq := e.modify("s-1", "bad")
	e.modify("s-2", "two")
	e.modify("s-3", "three")
	e.waitRun("s-1", worker.OutcomeError)
	e.waitState(tasks.QueueModify, "s-1", asynq.TaskStateRetry) // no longer active: a skip refuses a running head

	_, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "dave"})
	require.ErrorIs(t, err, orderops.ErrInvalid, "skip needs a reason")
	res, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "dave", Reason: "bad address, customer informed"})
	require.NoError(t, err)
	require.Equal(t, seq, res.Seq)
	e.waitApplied("SO1", "s-2", "s-3")
	info, err := e.insp.GetTaskInfo(tasks.QueueModify, "s-1")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)
	require.Equal(t, "skipped by dave: bad address, customer informed", info.LastErr, "the archived task carries the skip's reason")
	require.Zero(t, info.Retried-1, "its failure count stays")
	entry := e.logEntry("skip", "skipped by dave")
	require.Equal(t, seq, entry.Pos)
	require.Equal(t, "skipped by dave: bad address, customer informed", entry.Reason)
	n := e.note("SO1", "skipped")
	require.Equal(t, fmt.Sprintf("skipped position %d by dave: bad address, customer informed", seq), n.Detail)
	require.Equal(t, "dave", n.Worker)

	_, err = e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "dave", Reason: "again"})
	require.ErrorIs(t, err, orderops.ErrRefused, "nothing waits")
}

// Skipping an exchange head settles its replacement's creation: the
// replacement's change accepted after it stops waiting, and says why.
func TestSkipAnExchangeSettlesItsCreation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, failOn("x-1"))
	ctx := t.Context()
	_, err := e.p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "B", Qty: 2}}, producer.WithEventID("x-1"), producer.WithNewOrderNo("SO2"))
	require.NoError(t, err)
	remark := "for the replacement"
	_, err = e.p.EnqueueModify(ctx, "SO2", tasks.Changes{Remark: &remark}, producer.WithEventID("x-2"))
	require.NoError(t, err)
	e.waitRun("x-1", worker.OutcomeError)
	e.waitState(tasks.QueueExchange, "x-1", asynq.TaskStateRetry) // no longer active: a skip refuses a running head

	res, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "erin", Reason: "wrong items"})
	require.NoError(t, err)
	require.Contains(t, res.Detail, "SO2")
	d := e.waitRun("x-2", worker.OutcomeRejected)
	require.ErrorContains(t, d.Err, "skipped by erin: wrong items")
}

// A skip that races the head's own run never lets the change be both
// applied and skipped: the head's write is held inside its turn (the task
// is active) while the skip runs; the skip is refused, the head is applied
// once, and the change behind it after.
func TestSkipRacesTheHeadsRun(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	writes := 0
	e := newEnv(t, func(ctx context.Context, _, ev, _ string) error {
		if ev != "race-1" {
			return nil
		}
		mu.Lock()
		writes++
		mu.Unlock()
		once.Do(func() { close(entered) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	ctx := t.Context()
	e.modify("race-1", "one")
	e.modify("race-2", "two")
	select {
	case <-entered:
	case <-time.After(15 * time.Second):
		t.Fatal("the head never wrote")
	}
	skipped := make(chan error, 1)
	go func() {
		_, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "frank", Reason: "race"})
		skipped <- err
	}()
	var err error
	select {
	case err = <-skipped:
	case <-time.After(15 * time.Second):
		t.Fatal("the skip never returned")
	}
	close(release)
	e.waitApplied("SO1", "race-1", "race-2")
	mu.Lock()
	require.Equal(t, 1, writes, "applied once")
	mu.Unlock()
	require.ErrorIs(t, err, orderops.ErrRefused)
	require.ErrorContains(t, err, "runs right now")
	st, serr := e.seq.Status(ctx, "SO1")
	require.NoError(t, serr)
	for _, l := range st.Log {
		require.NotEqual(t, "skip", l.Kind, "never both applied and skipped: %+v", l)
	}
}

// A hold of an order that has no sequence and that the store does not
// hold is refused, and leaves no key behind (a held sequence never
// expires); one the store holds is held, with no change accepted yet. An
// Ops without a store that keeps notes writes none.
func TestHoldOfAnUnknownOrderAndNoNoteWithoutAnAnnotator(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	_, err := e.ops.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO9", By: "alice", Reason: "before it exists"})
	require.ErrorIs(t, err, orderops.ErrRefused)
	require.ErrorContains(t, err, "unknown")
	n, err := e.db.Client.Exists(ctx, e.seq.SeqKey("SO9")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no sequence key is left behind")
	_, err = e.store.History(ctx, "SO9", orders.HistoryQuery{})
	require.ErrorIs(t, err, orders.ErrNotFound, "a note never creates an order")

	plain, err := orderops.New(e.db.NewClient(t), orderops.Config{KeyPrefix: e.db.Prefix, Store: noteless{e.store}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, plain.Close()) })
	_, err = plain.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO1", By: "alice", Reason: "no notes"})
	require.NoError(t, err, "SO1 has no change yet, but the store holds it")
	h, err := orders.AllHistory(ctx, e.store, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 1, "only the put: the noteless store keeps no notes")
	st, err := e.seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.NotNil(t, st.Paused, "the hold took effect")
}

// noteless is an order store that keeps no notes: it has orders.Store's
// methods only (no orders.Annotator).
type noteless struct{ orders.Store }

// A flood of actions by one principal is refused past its burst, with
// when to try again, before anything is read or written; another
// principal still acts. However many actions are noted, every applied
// change stays in the order's history.
func TestRateLimitAndFlood(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	e.modify("f-1", "one")
	e.waitApplied("SO1", "f-1")
	now := time.Unix(1_700_000_000, 0)
	ops, err := orderops.New(e.db.NewClient(t), orderops.Config{KeyPrefix: e.db.Prefix, Store: e.store, Rate: 0.5, Burst: 3,
		Now: func() time.Time { return now }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ops.Close()) })
	for _, a := range []orderops.Action{orderops.Hold, orderops.Resume, orderops.Hold} {
		_, err := ops.Do(ctx, a, orderops.Request{OrderNo: "SO1", By: "alice", Reason: "x"})
		require.NoError(t, err)
	}
	_, err = ops.Do(ctx, orderops.Resume, orderops.Request{OrderNo: "SO1", By: "alice"})
	var rl *orderops.RateLimitError
	require.ErrorAs(t, err, &rl)
	require.ErrorIs(t, err, orderops.ErrRateLimited)
	require.Equal(t, 2*time.Second, rl.RetryAfter, "a token every 2 s")
	st, err := e.seq.Status(ctx, "SO1")
	require.NoError(t, err)
	require.NotNil(t, st.Paused, "the refused resume did nothing")
	_, err = ops.Do(ctx, orderops.Resume, orderops.Request{OrderNo: "SO1", By: "bob"})
	require.NoError(t, err, "each principal has its own bucket")
	now = now.Add(2 * time.Second)
	_, err = ops.Do(ctx, orderops.Hold, orderops.Request{OrderNo: "SO1", By: "alice", Reason: "y"})
	require.NoError(t, err, "alice's bucket refilled")

	// A flood without a limit: more notes than the history keeps entries.
	flood, err := orderops.New(e.db.NewClient(t), orderops.Config{KeyPrefix: e.db.Prefix, Store: e.store, Rate: orderops.Unlimited})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, flood.Close()) })
	for i := range 1002 {
		a := orderops.Resume
		if i%2 == 1 {
			a = orderops.Hold
		}
		_, err := flood.Do(ctx, a, orderops.Request{OrderNo: "SO1", By: "mallory", Reason: "flood"})
		require.NoError(t, err)
	}
	h, err := orders.AllHistory(ctx, e.store, "SO1")
	require.NoError(t, err)
	var writes []string
	for _, x := range h {
		if x.Type != orders.TypeNote {
			writes = append(writes, x.Type+" "+x.EventID)
		}
	}
	require.Equal(t, []string{orders.TypePut + " ", orders.TypeModify + " f-1"}, writes, "every applied change is still in the history")
}

// The plain intake user may not act: every action is refused before
// anything is written.
func TestIntakeUserMayNotAct(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	user := e.db.AsUser(t, rules...)
	ops, err := orderops.New(user.Client, orderops.Config{KeyPrefix: e.db.Prefix, Store: e.store})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ops.Close()) })
	for _, a := range orderops.Actions() {
		_, err := ops.Do(ctx, a, orderops.Request{OrderNo: "SO1", By: "eve", Reason: "x"})
		require.ErrorIs(t, err, orderops.ErrNotAllowed, a)
	}
	n, err := e.db.Client.Exists(ctx, e.seq.SeqKey("SO1")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no hold was written")
}

func TestDecodeBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, reason, err string
	}{
		{"empty", "", "", ""},
		{"blank", " \n", "", ""},
		{"reason", `{"reason": "fraud check"}`, "fraud check", ""},
		{"null reason", `{"reason": null}`, "", ""},
		{"no field", `{}`, "", ""},
		{"repeated reason", `{"reason": "a", "reason": "b"}`, "", "repeated"},
		{"unknown field", `{"reason": "a", "by": "admin#1"}`, "", "unknown field"},
		{"case of the name", `{"Reason": "a"}`, "", "unknown field"},
		{"not a string", `{"reason": 5}`, "", "must be a string"},
		{"two objects", `{"reason": "a"} {}`, "", "nothing after"},
		{"array", `["a"]`, "", "one JSON object"},
		{"not JSON", `reason=a`, "", "one JSON object"},
		{"not UTF-8", "{\"reason\": \"\xff\"}", "", "UTF-8"},
		{"too large", `{"reason": "` + strings.Repeat("a", orderops.MaxBodyLen) + `"}`, "", "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := orderops.DecodeBody([]byte(tt.body))
			if tt.err == "" {
				require.NoError(t, err)
				require.Equal(t, tt.reason, b.Reason)
				return
			}
			require.ErrorIs(t, err, orderops.ErrInvalid)
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestCLIPrincipal(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"alice", "ops-lead", "admin", "admin#x", "key#"} {
		p, err := orderops.CLIPrincipal(ok)
		require.NoError(t, err, ok)
		require.Equal(t, "cli:"+ok, p)
	}
	for _, bad := range []string{"", " ", "admin#1", "ADMIN#12", "key#3", "anonymous", "cli:alice"} {
		_, err := orderops.CLIPrincipal(bad)
		require.ErrorIs(t, err, orderops.ErrInvalid, "%q", bad)
	}
}

// A principal or reason that a note could not hold is refused before
// anything is done.
func TestControlCharactersRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, req := range []orderops.Request{
		{OrderNo: "SO1", By: "alice\n", Reason: "x"},
		{OrderNo: "SO1", By: "alice", Reason: "line\nbreak"},
		{OrderNo: "SO1", By: "alice", Reason: "invoice\u202etxt.exe"}, // a format character: the bidirectional override
		{OrderNo: "SO1", By: "alice", Reason: "a\u2066b\u2069"},
		{OrderNo: "SO1", By: "alice", Reason: "zero\u200bwidth"},
		{OrderNo: "SO1", By: "al\u202eice", Reason: "x"},
	} {
		_, err := e.ops.Do(t.Context(), orderops.Hold, req)
		require.ErrorIs(t, err, orderops.ErrInvalid)
	}
}

// A replacement's creation is not skipped while the exchange that makes it
// may still run: the skip is refused, naming the exchange and its order to
// act on instead, and nothing is lost: once the exchange goes through, the
// replacement is created and its change applied.
func TestSkipACreationIsRefusedWhileItsExchangeMayRun(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	e := newEnv(t, failWhile("c-1", &failing))
	ctx := t.Context()
	_, err := e.p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "B", Qty: 2}}, producer.WithEventID("c-1"), producer.WithNewOrderNo("SO2"))
	require.NoError(t, err)
	remark := "for the replacement"
	_, err = e.p.EnqueueModify(ctx, "SO2", tasks.Changes{Remark: &remark}, producer.WithEventID("c-2"))
	require.NoError(t, err)
	e.waitRun("c-1", worker.OutcomeError)
	e.waitState(tasks.QueueExchange, "c-1", asynq.TaskStateRetry)

	_, err = e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO2", By: "gina", Reason: "stuck"})
	require.ErrorIs(t, err, orderops.ErrRefused)
	require.ErrorContains(t, err, "its creation by exchange c-1 of order SO1, whose task is retry")
	require.ErrorContains(t, err, "skip or hold that exchange (order SO1) instead")
	st, err := e.seq.Status(ctx, "SO2")
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Waiting, "nothing of SO2 was skipped")

	failing.Store(false)
	_, err = e.ops.Do(ctx, orderops.Retry, orderops.Request{OrderNo: "SO1", By: "gina", Reason: "upstream fixed"})
	require.NoError(t, err)
	e.waitRun("c-2", worker.OutcomeOK)
	o, err := e.store.Get(ctx, "SO2")
	require.NoError(t, err)
	require.Equal(t, remark, o.Remark, "the replacement was created and its change applied")
}

// A replacement's creation whose exchange will never run (its task was
// deleted) may be skipped, and the change that waited for it is rejected
// with a reason that names the skip: who and why.
func TestSkipACreationWhoseExchangeIsGoneNamesTheSkip(t *testing.T) {
	t.Parallel()
	e := newEnv(t, failOn("g-1"))
	ctx := t.Context()
	_, err := e.p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "B", Qty: 2}}, producer.WithEventID("g-1"), producer.WithNewOrderNo("SO2"))
	require.NoError(t, err)
	remark := "for the replacement"
	_, err = e.p.EnqueueModify(ctx, "SO2", tasks.Changes{Remark: &remark}, producer.WithEventID("g-2"))
	require.NoError(t, err)
	e.waitRun("g-1", worker.OutcomeError)
	e.waitState(tasks.QueueExchange, "g-1", asynq.TaskStateRetry)
	require.NoError(t, e.insp.DeleteTask(tasks.QueueExchange, "g-1"))

	res, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO2", By: "hal", Reason: "exchange withdrawn"})
	require.NoError(t, err)
	require.Equal(t, "g-1", res.TaskID)
	d := e.waitRun("g-2", worker.OutcomeRejected)
	require.ErrorIs(t, d.Err, orders.ErrNotFound)
	require.ErrorContains(t, d.Err, "was skipped at ")
	require.ErrorContains(t, d.Err, ": skipped by hal: exchange withdrawn")
}

// A change whose position an operator skipped, run anyway afterwards (from
// the archive), finds its order past its position: it is rejected with a
// reason that names the skip.
func TestAPassedChangeNamesTheSkip(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	e := newEnv(t, failWhile("p-1", &failing))
	ctx := t.Context()
	e.modify("p-1", "one")
	e.modify("p-2", "two")
	e.waitRun("p-1", worker.OutcomeError)
	_, err := e.ops.Do(ctx, orderops.Skip, orderops.Request{OrderNo: "SO1", By: "ivy", Reason: "duplicate of p-2"})
	require.NoError(t, err)
	e.waitApplied("SO1", "p-2")

	failing.Store(false)
	require.NoError(t, e.insp.RunTask(tasks.QueueModify, "p-1"))
	d := e.waitRun("p-1", worker.OutcomeRejected)
	require.ErrorIs(t, d.Err, orders.ErrPassed)
	require.ErrorContains(t, d.Err, ": skipped by ivy: duplicate of p-2")
	e.waitApplied("SO1", "p-2")
}

// The limit of one order's actions is kept in Redis: two processes (here
// two Ops, as the intake-admin user) share it, every CLI principal counts
// as one, and all principals together have a limit of their own, so that
// repeating actions cannot push an order's audit trail out in minutes.
func TestOrderActionLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	rules, err := acl.Rules(acl.IntakeAdmin, acl.Options{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	admin := e.db.AsUser(t, rules...)
	var procs []*orderops.Ops
	for range 2 {
		ops, err := orderops.New(admin.NewClient(t), orderops.Config{KeyPrefix: e.db.Prefix, Store: e.store,
			Rate: 1000, Burst: 1000, OrderRate: 1, OrderBurst: 2})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, ops.Close()) })
		procs = append(procs, ops)
	}
	act := func(i int, by string) error {
		t.Helper()
		a := orderops.Hold
		st, err := e.seq.Status(ctx, "SO1")
		require.NoError(t, err)
		if st.Paused != nil {
			a = orderops.Resume
		}
		_, err = procs[i%2].Do(ctx, a, orderops.Request{OrderNo: "SO1", By: by, Reason: "x"})
		return err
	}
	var rl *orderops.RateLimitError
	require.NoError(t, act(0, "alice"))
	require.NoError(t, act(1, "alice"), "the second process shares alice's bucket")
	require.ErrorAs(t, act(0, "alice"), &rl)
	require.InDelta(t, time.Hour.Seconds(), rl.RetryAfter.Seconds(), 5, "one action an hour")
	require.NoError(t, act(0, orderops.CLIPrefix+"ann"))
	require.NoError(t, act(1, orderops.CLIPrefix+"ben"))
	require.ErrorIs(t, act(0, orderops.CLIPrefix+"cid"), orderops.ErrRateLimited, "every CLI principal is one")
	require.NoError(t, act(0, "bob"))
	require.NoError(t, act(1, "bob"))
	require.NoError(t, act(0, "carol"))
	require.NoError(t, act(1, "carol"))
	require.ErrorIs(t, act(0, "dave"), orderops.ErrRateLimited, "the order's total: 4 x OrderBurst at once")
	h, err := orders.AllHistory(ctx, e.store, "SO1")
	require.NoError(t, err)
	notes := 0
	for _, x := range h {
		if x.Type == orders.TypeNote {
			notes++
		}
	}
	require.Equal(t, 8, notes, "a refused action writes nothing")
}
