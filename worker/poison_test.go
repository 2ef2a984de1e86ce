package worker_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/stretchr/testify/require"
)

// No raw task's seq can hold an order back: a seq that the order's
// sequence did not hand out to the task is applied without order and never
// recorded (no live sequence), or archived (beyond a live sequence's last
// position, malformed). After each, a change through the producer applies.
func TestRawSeqNeverPoisonsAnOrder(t *testing.T) {
	e := newEnv(t)
	e.seed("SO22")
	e.seed("SO23")
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add}, nil)
	p := e.producer(producer.Config{})
	raw := func(id, no string, seq string) {
		t.Helper()
		payload := fmt.Sprintf(`{"order_no":%q,"event_id":%q,"seq":%s,"changes":{"remark":"poison %s"}}`, no, id, seq, id)
		e.enqueue(asynq.NewTask(tasks.TypeModify, []byte(payload)), tasks.QueueModify, id)
	}
	applies := func(no, id string) int64 {
		t.Helper()
		res, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new("valid " + id)}, producer.WithEventID(id))
		require.NoError(t, err)
		d := r.final(t, id)
		require.Equal(t, worker.OutcomeOK, d.Outcome, "%s after a raw task: %v", id, d.Err)
		require.Equal(t, worker.ModeTurn, d.Mode)
		o, err := e.store.Get(t.Context(), no)
		require.NoError(t, err)
		require.Equal(t, "valid "+id, o.Remark)
		return res.Seq
	}
	newest := func(no string) string {
		t.Helper()
		return e.db.Client.HGet(t.Context(), e.db.Prefix+"order:{"+no+"}", "seq").Val()
	}

	// The probe's reproduction: SO22 has no live sequence.
	raw("raw-p", "SO22", "9000000000000000")
	d := r.final(t, "raw-p")
	require.Equal(t, worker.OutcomeOK, d.Outcome, "%v", d.Err)
	require.Equal(t, worker.ModePassed, d.Mode, "applied without order")
	require.Empty(t, newest("SO22"), "the forged position is not recorded")
	applies("SO22", "after-p")

	// Malformed seqs are archived with the reason, taking no lock.
	for id, seq := range map[string]string{"raw-neg": "-5", "raw-big": "9007199254740993", "raw-zero": "0"} {
		raw(id, "SO22", seq)
		d := r.final(t, id)
		require.Equal(t, worker.OutcomeRejected, d.Outcome, "%s: %v", id, d.Err)
		require.ErrorContains(t, d.Err, "seq: must be an integer from 1 to 9007199254740991")
		require.False(t, d.Locked)
		e.waitState(tasks.QueueModify, id, asynq.TaskStateArchived)
		applies("SO22", "after-"+id)
	}

	// SO23 gets a live sequence, then SO25 one that starts after it (a new
	// sequence starts at Redis TIME in µs).
	e.seed("SO25")
	last23 := applies("SO23", "live-23")
	other := applies("SO25", "live-25")
	require.Greater(t, other, last23)
	for id, seq := range map[string]int64{"raw-other": other, "raw-ahead": last23 + 1000} {
		raw(id, "SO23", strconv.FormatInt(seq, 10))
		d := r.final(t, id)
		require.Equal(t, worker.OutcomeRejected, d.Outcome, "%s: %v", id, d.Err)
		require.ErrorIs(t, d.Err, keyorder.ErrBadPosition)
		require.ErrorContains(t, d.Err, "was never handed out")
		e.waitState(tasks.QueueModify, id, asynq.TaskStateArchived)
		requireNote(t, e, "SO23", seq, tasks.PositionLabel(tasks.TypeModify, id), "archived: ", "was never handed out")
		applies("SO23", "after-"+id)
	}
	// A position of SO23 that it already passed, on SO23 again: checked
	// against the newest applied and refused, recording nothing.
	raw("raw-passed", "SO23", strconv.FormatInt(last23, 10))
	d = r.final(t, "raw-passed")
	require.Equal(t, worker.OutcomeRejected, d.Outcome, "%v", d.Err)
	require.Equal(t, worker.ModePassed, d.Mode)
	requireNote(t, e, "SO23", last23, tasks.PositionLabel(tasks.TypeModify, "raw-passed"), "archived: ", "is not after position")
	before := newest("SO23")
	applies("SO23", "after-passed")
	require.NotEqual(t, before, newest("SO23"))
	requireInSequence(t, e.history("SO22"))
	requireInSequence(t, e.history("SO23"))
}

// Every archived change of an order with a live sequence is noted in the
// order's sequence log, with its event ID and reason, so the order's status
// still shows it once asynq has dropped the task (asynq keeps at most
// 10,000 archived tasks per queue): one without a position, and one whose
// ID is not its event ID, too.
func TestArchivedChangeStaysFindable(t *testing.T) {
	e := newEnv(t)
	e.seed("SO26")
	e.seed("SO27")
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add}, nil)
	p := e.producer(producer.Config{})
	_, err := p.EnqueueModify(t.Context(), "SO26", tasks.Changes{Remark: new("live")}, producer.WithEventID("live-26"))
	require.NoError(t, err)
	r.final(t, "live-26")

	// Without a position: an exchange to a taken number (SO27).
	x, err := tasks.NewTask(tasks.ExchangePayload{EventID: "free-x", OrderNo: "SO26", NewOrderNo: "SO27", Items: []tasks.Item{{SKU: "B", Qty: 1}}})
	require.NoError(t, err)
	e.enqueue(x, tasks.QueueExchange, "free-x")
	d := r.final(t, "free-x")
	require.Equal(t, worker.OutcomeRejected, d.Outcome, "%v", d.Err)
	requireNote(t, e, "SO26", 0, tasks.PositionLabel(tasks.TypeExchange, "free-x"), "archived: ", "SO27")

	// A task ID that is not the event ID.
	m, err := tasks.NewTask(tasks.ModifyPayload{EventID: "ev-26", OrderNo: "SO26", Changes: tasks.Changes{Remark: new("x")}})
	require.NoError(t, err)
	e.enqueue(m, tasks.QueueModify, "not-ev-26")
	r.final(t, "not-ev-26")
	requireNote(t, e, "SO26", 0, tasks.PositionLabel(tasks.TypeModify, "ev-26"), "archived: ", "is not the payload's event_id")

	// asynq drops the archived tasks: the notes stay.
	e.waitState(tasks.QueueExchange, "free-x", asynq.TaskStateArchived)
	require.NoError(t, e.insp.DeleteTask(tasks.QueueExchange, "free-x"))
	e.waitState(tasks.QueueModify, "not-ev-26", asynq.TaskStateArchived)
	require.NoError(t, e.insp.DeleteTask(tasks.QueueModify, "not-ev-26"))
	requireNote(t, e, "SO26", 0, tasks.PositionLabel(tasks.TypeExchange, "free-x"), "archived: ", "SO27")
}

// A task whose ID is not its payload's event_id is archived with that
// reason, with a position or without: the order's view, the gap check and
// the dashboard would not find it.
func TestTaskIDMustBeTheEventID(t *testing.T) {
	e := newEnv(t)
	e.seed("SO24")
	r := newRuns()
	e.startWorker(worker.Config{OnDone: r.add}, nil)
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "ev-24", OrderNo: "SO24", Changes: tasks.Changes{Remark: new("x")}})
	require.NoError(t, err)
	e.enqueue(task, tasks.QueueModify, "not-ev-24")
	d := r.final(t, "not-ev-24")
	require.Equal(t, worker.OutcomeRejected, d.Outcome, "%v", d.Err)
	require.ErrorContains(t, d.Err, `task ID "not-ev-24" is not the payload's event_id "ev-24"`)
	require.False(t, d.Locked)
	e.waitState(tasks.QueueModify, "not-ev-24", asynq.TaskStateArchived)
	o, err := e.store.Get(t.Context(), "SO24")
	require.NoError(t, err)
	require.Equal(t, "seeded", o.Remark, "nothing applied")
}

// final waits for the run of task id that ends its work (applied or
// archived) among every run recorded so far.
func (r *runs) final(t *testing.T, id string) worker.Done {
	t.Helper()
	d, i := r.await(30*time.Second, func() int { return 0 }, func(d worker.Done) bool {
		return d.TaskID == id && (d.Outcome == worker.OutcomeOK || d.Outcome == worker.OutcomeRejected)
	})
	if i < 0 {
		t.Fatalf("no final run of task %s", id)
	}
	return d
}
