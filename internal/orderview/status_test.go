package orderview_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// env is a test's Redis with a store and a reader on it.
type env struct {
	db     *redistest.DB
	store  *redisstore.Store
	reader *orderview.Reader
}

func newEnv(t *testing.T, cfg orderview.Config) *env {
	t.Helper()
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	cfg.KeyPrefix = db.Prefix
	r, err := orderview.New(db.Client, store, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(db.Client)
		for _, k := range tasks.Kinds() {
			_ = insp.DeleteQueue(k.Queue, true)
		}
	})
	return &env{db: db, store: store, reader: r}
}

func TestDefaultGapWaitIsTheWorkers(t *testing.T) {
	require.Equal(t, worker.DefaultGapWait, orderview.DefaultGapWait)
}

// taskByID returns the status's task id.
func taskByID(t *testing.T, st orderview.Status, id string) orderview.Task {
	t.Helper()
	for _, tk := range st.Tasks {
		if tk.TaskID == id {
			return tk
		}
	}
	t.Fatalf("no task %s in %+v", id, st.Tasks)
	return orderview.Task{}
}

// An order with a change applied, one archived in its turn, the next one
// retrying after a failure and one parked behind it: the status finds every
// task through the order's records and says what each means.
func TestStatusOfAnOrderWithRetriedParkedAndArchivedTasks(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	s := orderviewtest.Build(t, e.db.Client, e.db.Prefix, "SO1001")
	st, err := e.reader.Status(t.Context(), "SO1001")
	require.NoError(t, err)

	require.NotNil(t, st.Order)
	assert.Equal(t, "2 New Rd, "+s.Applied, st.Order.Address, "only the first change is applied")
	assert.EqualValues(t, 2, st.Order.Version)
	assert.False(t, st.Lock.Held)

	sq := st.Sequence
	require.True(t, sq.Exists)
	assert.Equal(t, s.Seq[s.Archived], sq.Done, "the archived change used up its position")
	assert.Equal(t, s.Seq[s.Parked], sq.Last)
	require.Len(t, sq.Waiting, 2)
	head, behind := sq.Waiting[0], sq.Waiting[1]
	assert.Equal(t, orderview.Position{Seq: s.Seq[s.Retried], Next: true, State: orderview.PositionReserved,
		Label: "order:modify " + s.Retried, TaskID: s.Retried, Queue: tasks.QueueModify, TaskState: "retry",
		ReservedAt: head.ReservedAt, RetryAt: head.RetryAt}, head)
	assert.False(t, head.RetryAt.IsZero(), "the failed head said when it runs again")
	assert.Equal(t, s.Parked, behind.TaskID)
	assert.False(t, behind.Next)
	assert.Equal(t, "retry", behind.TaskState)
	assert.Nil(t, sq.Gap, "the head's task exists and runs again")
	require.Len(t, sq.Log, 1)
	assert.Equal(t, orderview.LogNote, sq.Log[0].Kind)
	assert.Equal(t, s.Seq[s.Archived], sq.Log[0].Seq)
	assert.Equal(t, s.Archived, sq.Log[0].TaskID)
	assert.Contains(t, sq.Log[0].Reason, "archived: ")
	assert.Contains(t, sq.Log[0].Reason, orderviewtest.FailArchived)

	var ids []string
	for _, tk := range st.Tasks {
		ids = append(ids, tk.TaskID)
	}
	assert.Equal(t, []string{s.Applied, s.Archived, s.Retried, s.Parked}, ids, "by position")

	applied := taskByID(t, st, s.Applied)
	assert.Equal(t, "completed", applied.State)
	assert.Equal(t, orderview.SourceHistory, applied.Source)
	assert.Contains(t, applied.Note, "applied: version 2")
	assert.False(t, applied.CompletedAt.IsZero())

	archived := taskByID(t, st, s.Archived)
	assert.Equal(t, "archived", archived.State)
	assert.Equal(t, orderview.SourceLog, archived.Source)
	assert.Contains(t, archived.Note, "out of its failure budget")
	assert.Contains(t, archived.LastError, orderviewtest.FailArchived)

	retried := taskByID(t, st, s.Retried)
	assert.Equal(t, "retry", retried.State)
	assert.Equal(t, orderview.SourcePosition, retried.Source)
	assert.Equal(t, 1, retried.Retried)
	assert.Equal(t, 5, retried.MaxRetry)
	assert.Equal(t, orderviewtest.FailRetried, retried.LastError)
	assert.False(t, retried.NextProcessAt.IsZero())
	assert.True(t, strings.HasPrefix(retried.Note, "its turn: failed 1 of 6 allowed times; runs again at "), retried.Note)

	parked := taskByID(t, st, s.Parked)
	assert.Equal(t, "retry", parked.State)
	assert.Zero(t, parked.Retried, "parking is not a failure")
	assert.True(t, strings.HasPrefix(parked.Note, "waits for its turn (1 position is ahead of it): parked in asynq's retry set, not failed"), parked.Note)

	require.Len(t, st.History, 2)
	assert.EqualValues(t, 2, st.HistoryTotal)
	assert.Equal(t, s.Applied, st.History[1].EventID)

	// The failing head leads: which change, its attempts, its last error,
	// its next run, and what ends it.
	lead := st.Summary[0]
	assert.True(t, strings.HasPrefix(lead, "Its next change fails: task "+s.Retried+" (order:modify, position "+
		strconv.FormatInt(s.Seq[s.Retried], 10)+") failed 1 of 6 allowed times, last at "), lead)
	assert.Contains(t, lead, ": "+orderviewtest.FailRetried+". It runs again at ")
	assert.Contains(t, lead, "Retry it now (producer order retry SO1001")
	summary := strings.Join(st.Summary, "\n")
	assert.Contains(t, summary, "SO1001 is active, version 2")
	assert.Contains(t, summary, "2 accepted change(s) not applied yet; next in line is position")
	assert.Contains(t, summary, "1 task(s) wait for their turn, parked")
	assert.Contains(t, summary, "1 of its tasks are archived")
}

// A position without a task holds the order up for the gap wait: the
// status says which, why, and how long is left; the lock's holder is
// named.
func TestStatusOfAGapAndAHeldLock(t *testing.T) {
	now := time.Now()
	e := newEnv(t, orderview.Config{GapWait: time.Minute, Now: func() time.Time { return now }})
	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO-G", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	space, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	l, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	ghost := tasks.PositionLabel(tasks.TypeModify, "ev-ghost")
	gp, err := space.Reserve(t.Context(), "SO-G", ghost, "")
	require.NoError(t, err)
	p, err := producer.New(e.db.Client, producer.Config{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	r, err := p.EnqueueModify(t.Context(), "SO-G", tasks.Changes{Remark: new("behind")}, producer.WithEventID("ev-behind"))
	require.NoError(t, err)
	lease, err := l.Acquire(t.Context(), "SO-G", "order:exchange ev-holder")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(t.Context()) })

	st, err := e.reader.Status(t.Context(), "SO-G")
	require.NoError(t, err)
	assert.Equal(t, orderview.Lock{Held: true, Holder: "order:exchange ev-holder", TaskID: "ev-holder", Queue: "order_exchange", Fence: lease.Fence(),
		LeaseMS: st.Lock.LeaseMS}, st.Lock)
	assert.Positive(t, st.Lock.LeaseMS)
	g := st.Sequence.Gap
	require.NotNil(t, g)
	assert.Equal(t, gp, g.Seq)
	assert.Equal(t, ghost, g.Label)
	assert.Equal(t, "ev-ghost", g.TaskID)
	assert.Contains(t, g.Reason, "task ev-ghost is not in queue order_modify")
	assert.EqualValues(t, time.Minute.Milliseconds(), g.GapWaitMS)
	assert.Equal(t, max(time.Minute.Milliseconds()-g.AgeMS, 0), g.LeftMS)
	assert.Positive(t, g.LeftMS)
	require.Len(t, st.Sequence.Waiting, 2)
	assert.Equal(t, orderview.TaskMissing, st.Sequence.Waiting[0].TaskState)
	// Accepted behind an unfinished position, the change is parked in
	// asynq's retry set (only the head waits in the queue).
	assert.Equal(t, "retry", st.Sequence.Waiting[1].TaskState)
	behind := taskByID(t, st, "ev-behind")
	assert.Equal(t, r.Seq, behind.Seq)
	assert.Zero(t, behind.Retried, "parking is not a failure")
	assert.True(t, strings.HasPrefix(behind.Note, "waits for its turn (1 position is ahead of it): parked in asynq's retry set, not failed"), behind.Note)
	summary := strings.Join(st.Summary, "\n")
	assert.Contains(t, summary, "Locked by order:exchange ev-holder")
	assert.Contains(t, summary, "holds the order up: task ev-ghost is not in queue order_modify")
	assert.Contains(t, summary, "It is skipped in ")

	// Past the gap wait, it is skipped as soon as a task behind it runs.
	now = now.Add(2 * time.Minute)
	st, err = e.reader.Status(t.Context(), "SO-G")
	require.NoError(t, err)
	require.NotNil(t, st.Sequence.Gap)
	assert.Zero(t, st.Sequence.Gap.LeftMS)
	assert.Contains(t, strings.Join(st.Summary, "\n"), "now that the gap wait (1m0s) is over, as soon as a task behind it runs")
}

// A replacement that its exchange has not created yet has a sequence, led
// by its creation, but no order; a number nobody knows is an empty view;
// a malformed one is an error.
func TestStatusOfAReplacementBeingCreatedAndOfNothing(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO-X", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	p, err := producer.New(e.db.Client, producer.Config{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	_, err = p.EnqueueExchange(t.Context(), "SO-X", []tasks.Item{{SKU: "B", Qty: 1}}, producer.WithEventID("ev-x"), producer.WithNewOrderNo("SO-X2"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO-X2", tasks.Changes{Remark: new("on the new one")}, producer.WithEventID("ev-x2"))
	require.NoError(t, err)

	st, err := e.reader.Status(t.Context(), "SO-X2")
	require.NoError(t, err)
	assert.Nil(t, st.Order)
	assert.Contains(t, st.Summary[0], "SO-X2 is not in the order store yet")
	require.Len(t, st.Sequence.Waiting, 2)
	creation := st.Sequence.Waiting[0]
	assert.Equal(t, tasks.CreationLabel("ev-x", "SO-X"), creation.Label)
	assert.Equal(t, "ev-x", creation.TaskID)
	assert.Equal(t, tasks.QueueExchange, creation.Queue)
	assert.Equal(t, "pending", creation.TaskState)
	assert.Nil(t, st.Sequence.Gap, "the exchange will come")
	x := taskByID(t, st, "ev-x")
	assert.Equal(t, tasks.TypeExchange, x.Type)
	assert.Contains(t, x.Note, "the exchange of SO-X that creates SO-X2")
	assert.True(t, strings.HasPrefix(taskByID(t, st, "ev-x2").Note, "waits for its turn (1 position is ahead of it): parked in asynq's retry set"),
		"behind the creation, the change is parked: %s", taskByID(t, st, "ev-x2").Note)

	st, err = e.reader.Status(t.Context(), "SO-NONE")
	require.NoError(t, err)
	assert.Nil(t, st.Order)
	assert.False(t, st.Sequence.Exists)
	assert.Empty(t, st.Tasks)
	assert.NotNil(t, st.Tasks)
	assert.NotNil(t, st.Sequence.Waiting)
	require.Len(t, st.Summary, 1)
	assert.Contains(t, st.Summary[0], "Nothing is known of SO-NONE")

	_, err = e.reader.Status(t.Context(), "S O")
	require.ErrorIs(t, err, orders.ErrInvalid)
}

// The status shows the latest entries of a long history, read as one page.
func TestStatusShowsTheLatestHistory(t *testing.T) {
	e := newEnv(t, orderview.Config{HistoryLen: 3})
	for i := range 7 {
		require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO7", Remark: "r" + string(rune('0'+i)), Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	st, err := e.reader.Status(t.Context(), "SO7")
	require.NoError(t, err)
	require.Len(t, st.History, 3)
	assert.EqualValues(t, 7, st.HistoryTotal)
	for i, h := range st.History {
		assert.EqualValues(t, 5+i, h.Version)
	}
}

// With shards, the status finds an order's tasks in their placements: in
// its order's shard, in the queue a draining count put it in, and a
// replacement's creation in the exchanged order's exchange shard.
func TestStatusFindsTasksInTheirShards(t *testing.T) {
	mid := tasks.Shards{Count: 3, Draining: []int{1}}
	e := newEnv(t, orderview.Config{Shards: mid})
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(e.db.Client)
		for _, q := range mid.AllQueues(tasks.Kinds()) {
			_ = insp.DeleteQueue(q, true)
		}
	})
	newProducer := func(s tasks.Shards) *producer.Producer {
		p, err := producer.New(e.db.Client, producer.Config{KeyPrefix: e.db.Prefix, Shards: s})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	_, err := newProducer(tasks.Shards{}).EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("old")}, producer.WithEventID("old"))
	require.NoError(t, err)
	p3 := newProducer(mid)
	_, err = p3.EnqueueModify(t.Context(), "SO1001", tasks.Changes{Remark: new("new")}, producer.WithEventID("new"))
	require.NoError(t, err)
	_, err = p3.EnqueueExchange(t.Context(), "SO123", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithEventID("x"), producer.WithNewOrderNo("SO123-X"))
	require.NoError(t, err)
	space, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	l, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	lease, err := l.Acquire(t.Context(), "SO1001", "order:modify old")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(t.Context()) })

	st, err := e.reader.Status(t.Context(), "SO1001")
	require.NoError(t, err)
	assert.Equal(t, "order_modify", st.Lock.Queue, "the holder's task, found where the old count put it")
	require.Len(t, st.Sequence.Waiting, 2)
	assert.Equal(t, []string{"order_modify", "order_modify:2"}, []string{st.Sequence.Waiting[0].Queue, st.Sequence.Waiting[1].Queue})
	assert.Equal(t, []string{"pending", "retry"}, []string{st.Sequence.Waiting[0].TaskState, st.Sequence.Waiting[1].TaskState},
		"both found: the head pending, the change behind it parked in its shard's retry set")
	assert.Equal(t, "order_modify", taskByID(t, st, "old").Queue)
	assert.Equal(t, "order_modify:2", taskByID(t, st, "new").Queue)

	st, err = e.reader.Status(t.Context(), "SO123-X")
	require.NoError(t, err)
	require.Len(t, st.Sequence.Waiting, 1)
	assert.Equal(t, "order_exchange:1", st.Sequence.Waiting[0].Queue, "the creation is held by the exchange of SO123, in SO123's shard")
	assert.Equal(t, "pending", st.Sequence.Waiting[0].TaskState)

	// A reader that does not know the draining count misses the old task.
	r3, err := orderview.New(e.db.Client, e.store, orderview.Config{KeyPrefix: e.db.Prefix, Shards: tasks.Shards{Count: 3}})
	require.NoError(t, err)
	st, err = r3.Status(t.Context(), "SO1001")
	require.NoError(t, err)
	assert.Equal(t, "order_modify:2", st.Sequence.Waiting[0].Queue)
	assert.Equal(t, orderview.TaskMissing, st.Sequence.Waiting[0].TaskState)
}

// forgeBacklog writes the sequence of order no with waiting positions
// after the cursor 1000, the first records of which are written (with
// labels naming no task), as a huge or forged backlog looks.
func forgeBacklog(t *testing.T, db *redistest.DB, no string, waiting, records int) {
	t.Helper()
	fields := []any{"n", 1000 + waiting, "d", 1000}
	for i := 1; i <= records; i++ {
		fields = append(fields, "p:"+strconv.Itoa(1000+i), "1700000000000 m ev-"+strconv.Itoa(i))
	}
	require.NoError(t, db.Client.HSet(t.Context(), db.Prefix+"lock:{"+no+"}:seq", fields...).Err())
}

// A backlog of 3,000 changes, or a forged one of 20,000,000, is read as one
// page of MaxPositions positions, and counted.
func TestStatusOfALongBacklogIsOnePage(t *testing.T) {
	e := newEnv(t, orderview.Config{MaxPositions: 5})
	forgeBacklog(t, e.db, "SO-BIG", 3000, 60)
	st, err := e.reader.Status(t.Context(), "SO-BIG")
	require.NoError(t, err)
	require.Len(t, st.Sequence.Waiting, 5)
	assert.Equal(t, int64(1001), st.Sequence.Waiting[0].Seq)
	assert.True(t, st.Sequence.Waiting[0].Next)
	assert.Equal(t, int64(2995), st.Sequence.More)
	assert.Contains(t, strings.Join(st.Summary, " "), "3,000 accepted change(s) not applied yet; next in line is position 1001.")

	forgeBacklog(t, e.db, "SO50", 20000000, 0)
	st, err = e.reader.Status(t.Context(), "SO50")
	require.NoError(t, err)
	assert.Empty(t, st.Sequence.Waiting)
	assert.Equal(t, int64(20000000), st.Sequence.More)

	// The forged backlog costs a page's work: the commands Redis runs are
	// counted on a server of the test's own (a clock would fail on a loaded
	// machine).
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Dedicated(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	own := &redistest.DB{Client: rdb, Prefix: "forged:"}
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: own.Prefix})
	require.NoError(t, err)
	r, err := orderview.New(rdb, store, orderview.Config{KeyPrefix: own.Prefix})
	require.NoError(t, err)
	forgeBacklog(t, own, "SO50", 20000000, 60)
	calls := redistest.CallsDuring(t, rdb, func() { st, err = r.Status(t.Context(), "SO50") })
	require.NoError(t, err)
	assert.Len(t, st.Sequence.Waiting, orderview.DefaultMaxPositions)
	assert.LessOrEqual(t, calls.Total(), int64(2*orderview.DefaultMaxPositions), "a page's commands at most: %v", calls)

	_, err = orderview.New(e.db.Client, e.store, orderview.Config{MaxPositions: keyorder.MaxStatusPage + 1})
	require.ErrorContains(t, err, "MaxPositions")
}

func TestCount(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0"}, {7, "7"}, {999, "999"}, {1000, "1,000"}, {2980, "2,980"}, {20000000, "20,000,000"},
		{123456789012, "123,456,789,012"}, {-1234, "-1,234"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, orderview.Count(tt.n), tt.n)
	}
}

// A task whose queue is missing from asynq's set of queues (lost in a
// failover, say) exists: the status shows its position as unlisted, not
// as a gap of a missing task, and says so; the blocked list names the
// order as unreadable with the cause, rather than as a gap whose task
// will not come. Neither writes asynq's set of queues.
func TestAnUnlistedQueueIsNoMissingTask(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	if e.db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	ctx := t.Context()
	orderviewtest.Later(t, e.db.Client, e.db.Prefix, "SO31")
	require.NoError(t, e.db.Client.SRem(ctx, asynqredis.AllQueues, tasks.QueueModify).Err())

	st, err := e.reader.Status(ctx, "SO31")
	require.NoError(t, err)
	require.Len(t, st.Sequence.Waiting, 1)
	head := st.Sequence.Waiting[0]
	assert.Equal(t, orderview.TaskUnlisted, head.TaskState)
	assert.Equal(t, tasks.QueueModify, head.Queue)
	assert.Nil(t, st.Sequence.Gap, "the task exists: no gap")
	assert.Contains(t, strings.Join(st.Summary, "\n"), "Task SO31-later exists in queue order_modify, which is missing from asynq's set of queues")

	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	now := time.Now().Add(time.Hour)
	page, err := b.reader(t, func() time.Time { return now }).Blocked(ctx, orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)
	require.Equal(t, orderview.ReasonUnreadable, got["SO31"].Reason, "%+v", got["SO31"])
	assert.Contains(t, got["SO31"].Explanation, "missing from asynq's set of queues")

	listed, err := e.db.Client.SIsMember(ctx, asynqredis.AllQueues, tasks.QueueModify).Result()
	require.NoError(t, err)
	assert.False(t, listed, "a view only reads")
}

// A held order's status leads with the hold: who holds it, since when,
// why, what waits, and what resumes it; the sequence carries the hold.
func TestStatusLeadsWithTheHold(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	ctx := t.Context()
	orderviewtest.Later(t, e.db.Client, e.db.Prefix, "SO41")
	seq, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	pause, err := seq.Pause(ctx, "SO41", "ops@example.com", "customer asked")
	require.NoError(t, err)

	st, err := e.reader.Status(ctx, "SO41")
	require.NoError(t, err)
	require.NotNil(t, st.Sequence.Hold)
	assert.Equal(t, orderview.Hold{By: "ops@example.com", Reason: "customer asked", At: pause.At.UTC()}, *st.Sequence.Hold)
	lead := st.Summary[0]
	assert.True(t, strings.HasPrefix(lead, "On hold: held by ops@example.com since "+pause.At.UTC().Format(time.RFC3339)+" (customer asked)."), lead)
	assert.Contains(t, lead, "1 wait")
	assert.Contains(t, lead, "producer order resume SO41")
	assert.Contains(t, lead, "POST /v1/orders/SO41/actions/resume")

	_, _, err = seq.Resume(ctx, "SO41")
	require.NoError(t, err)
	st, err = e.reader.Status(ctx, "SO41")
	require.NoError(t, err)
	assert.Nil(t, st.Sequence.Hold)
	assert.NotContains(t, strings.Join(st.Summary, "\n"), "On hold")
}
