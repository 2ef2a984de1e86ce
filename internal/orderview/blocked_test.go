package orderview_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
)

// later is how far ahead of the wall clock the list's reader looks, so
// that every head has waited past BLOCKED_AFTER without a sleep.
const later = 2 * time.Minute

// blockedEnv drives orders into the states the list reports with a real
// worker on rdb, whose store fails the changes in fail, and whose gap wait
// (an hour) no test outlasts.
type blockedEnv struct {
	rdb    redis.UniversalClient
	prefix string
	shards tasks.Shards
	store  *redisstore.Store
	p      *producer.Producer
	// parked holds the changes the producer parked at acceptance (behind
	// unfinished changes of their order, in asynq's retry set): they are
	// in the state a run that waits leaves them in without a run.
	parked map[string]bool
}

const testGapWait = time.Hour

func newBlockedEnv(t *testing.T, rdb redis.UniversalClient, prefix string, shards tasks.Shards) *blockedEnv {
	t.Helper()
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix, Shards: shards})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	t.Cleanup(func() {
		// The queues live outside the prefix; on a Cluster, shared by the
		// package's tests and by repeats (-count), a completed task left
		// behind would make the next run's change a duplicate. DeleteQueue
		// leaves the completed tasks, so they go first.
		insp := asynq.NewInspectorFromRedisClient(rdb)
		for _, q := range shards.AllQueues(tasks.Kinds()) {
			_, _ = insp.DeleteAllCompletedTasks(q)
			_ = insp.DeleteQueue(q, true)
		}
	})
	return &blockedEnv{rdb: rdb, prefix: prefix, shards: shards, store: store, p: p, parked: map[string]bool{}}
}

// accepted records whether the producer parked the change r at acceptance
// (only the head of an order waits in the queue; on a Cluster the
// producer parks none, the worker parks them when they run).
func (e *blockedEnv) accepted(t *testing.T, r producer.Result) {
	t.Helper()
	info, err := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo(r.Queue, r.TaskID)
	require.NoError(t, err)
	if info.State == asynq.TaskStateRetry && info.Retried == 0 {
		e.parked[r.EventID] = true
	}
}

func (e *blockedEnv) reader(t *testing.T, now func() time.Time) *orderview.Reader {
	t.Helper()
	r, err := orderview.New(e.rdb, e.store, orderview.Config{KeyPrefix: e.prefix, GapWait: testGapWait, Shards: e.shards, Now: now})
	require.NoError(t, err)
	return r
}

func (e *blockedEnv) put(t *testing.T, nos ...string) {
	t.Helper()
	for _, no := range nos {
		require.NoError(t, e.store.Put(t.Context(), orders.Order{No: no, Address: "1 Old Rd", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))
	}
}

func (e *blockedEnv) modify(t *testing.T, no, id string, opts ...producer.Option) {
	t.Helper()
	r, err := e.p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new(id)}, append(opts, producer.WithEventID(id))...)
	require.NoError(t, err)
	e.accepted(t, r)
}

func (e *blockedEnv) exchange(t *testing.T, no, id, newNo string) {
	t.Helper()
	r, err := e.p.EnqueueExchange(t.Context(), no, []tasks.Item{{SKU: "TEA", Qty: 2}}, producer.WithEventID(id), producer.WithNewOrderNo(newNo))
	require.NoError(t, err)
	e.accepted(t, r)
}

// run runs a worker until each of the events in want has ended a run with
// its outcome (worker.OutcomeError: failed; worker.OutcomeWaiting: parked),
// then shuts it down: the tasks keep their states. A change the producer
// parked at acceptance is parked already: it does not run before its park
// ends (the producer's ParkFor, 30s), and waiting for that would let the
// failing heads run again on their backoff (15s or more) meanwhile.
func (e *blockedEnv) run(t *testing.T, fail map[string]bool, want map[string]string) {
	t.Helper()
	failing := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error {
		if fail[ev] {
			return errors.New("upstream said 503 for " + ev)
		}
		return nil
	})
	done := make(chan worker.Done, 1000)
	w, err := worker.New(e.rdb, e.store, worker.Config{
		Kinds: failing, KeyPrefix: e.prefix, Shards: e.shards, GapWait: testGapWait, LockTTL: 5 * time.Second,
		Logger: zaptest.NewLogger(t), TaskCheckInterval: 50 * time.Millisecond, DelayedTaskCheckInterval: 50 * time.Millisecond,
		OnDone: func(d worker.Done) {
			select {
			case done <- d:
			default:
			}
		},
	})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	defer w.Shutdown()
	got := map[string]bool{}
	for id, outcome := range want {
		if outcome == worker.OutcomeWaiting && e.parked[id] {
			got[id] = true
		}
	}
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for len(got) < len(want) {
		select {
		case d := <-done:
			if want[d.EventID] == d.Outcome {
				got[d.EventID] = true
			}
		case <-timeout.C:
			t.Fatalf("not all changes reached their state within 60s: want %v, got %v", want, got)
		}
	}
}

func byOrder(page orderview.BlockedPage) map[string]orderview.BlockedOrder {
	m := map[string]orderview.BlockedOrder{}
	for _, b := range page.Orders {
		m[b.OrderNo] = b
	}
	return m
}

// With a real worker: a change the upstream keeps failing, a head whose
// task was deleted, a head scheduled for later and a chain of exchanges
// each show with their reason, age and explanation; the orders that are
// fine do not show.
func TestBlockedListsEachReason(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	driveReasons(t, b)
	checkReasons(t, b)
}

// driveReasons leaves, with a worker, SOF failing, SOG waiting for a
// deleted task, SOS's head scheduled, SOA waiting for its creation by an
// exchange of SOB, itself waiting for its creation by an exchange of SOC,
// whose head fails; SOK is fine.
func driveReasons(t *testing.T, b *blockedEnv) {
	t.Helper()
	b.put(t, "SOF", "SOG", "SOS", "SOC", "SOK")
	b.modify(t, "SOF", "F1")
	b.modify(t, "SOF", "F2")
	b.modify(t, "SOG", "G1")
	b.modify(t, "SOG", "G2")
	b.modify(t, "SOS", "S1", producer.WithProcessIn(time.Hour))
	b.modify(t, "SOS", "S2")
	b.modify(t, "SOC", "C1")
	b.exchange(t, "SOC", "E1", "SOB")
	b.exchange(t, "SOB", "E2", "SOA")
	b.modify(t, "SOA", "A1")
	b.modify(t, "SOK", "K1")
	insp := asynq.NewInspectorFromRedisClient(b.rdb)
	require.NoError(t, insp.DeleteTask(b.shards.Placements(tasks.Modify, "SOG")[0], "G1"))
	b.run(t, map[string]bool{"F1": true, "C1": true}, map[string]string{
		"F1": worker.OutcomeError, "F2": worker.OutcomeWaiting, "G2": worker.OutcomeWaiting, "S2": worker.OutcomeWaiting,
		"C1": worker.OutcomeError, "E1": worker.OutcomeWaiting, "E2": worker.OutcomeWaiting, "A1": worker.OutcomeWaiting,
		"K1": worker.OutcomeOK,
	})
}

func checkReasons(t *testing.T, b *blockedEnv) {
	t.Helper()
	now := time.Now().Add(later)
	r := b.reader(t, func() time.Time { return now })
	page, err := r.Blocked(t.Context(), orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)
	assert.NotContains(t, got, "SOK", "an order whose changes are applied is not blocked")

	f := got["SOF"]
	require.Equal(t, orderview.ReasonFailing, f.Reason, "%+v", f)
	require.NotNil(t, f.Failing)
	assert.Equal(t, "F1", f.Failing.TaskID)
	assert.Contains(t, f.Failing.LastError, "upstream said 503 for F1")
	assert.Equal(t, 1, f.Failing.Retried)
	assert.False(t, f.Failing.NextRunAt.IsZero())
	assert.EqualValues(t, 2, f.Waiting)
	assert.InDelta(t, later.Milliseconds(), f.AgeMS, float64(30*time.Second/time.Millisecond))
	assert.Contains(t, f.Explanation, "failed 1 time(s)")

	g := got["SOG"]
	require.Equal(t, orderview.ReasonGap, g.Reason, "%+v", g)
	require.NotNil(t, g.Gap)
	assert.Equal(t, "G1", g.Gap.TaskID)
	assert.EqualValues(t, testGapWait.Milliseconds(), g.Gap.GapWaitMS)
	assert.InDelta(t, (testGapWait - later).Milliseconds(), g.Gap.LeftMS, float64(30*time.Second/time.Millisecond))
	assert.Contains(t, g.Explanation, "will not come")

	s := got["SOS"]
	require.Equal(t, orderview.ReasonScheduled, s.Reason, "%+v", s)
	require.NotNil(t, s.Scheduled)
	assert.Equal(t, "S1", s.Scheduled.TaskID)
	assert.WithinDuration(t, time.Now().Add(time.Hour), s.Scheduled.RunAt, time.Minute)

	a := got["SOA"]
	require.Equal(t, orderview.ReasonCreation, a.Reason, "%+v", a)
	require.NotNil(t, a.Creation)
	assert.Equal(t, "E2", a.Creation.Exchange)
	assert.Equal(t, "SOB", a.Creation.From)
	assert.Equal(t, "retry", a.Creation.ExchangeState)
	assert.True(t, a.Creation.FromWaits, "SOB's head is its own creation, not E2")
	assert.Equal(t, []string{"SOA", "SOB", "SOC"}, a.Creation.Chain)
	assert.False(t, a.Creation.Cycle)
	assert.Contains(t, a.Explanation, "SOA → SOB → SOC")

	bb := got["SOB"]
	require.Equal(t, orderview.ReasonCreation, bb.Reason, "found through the exchange that creates it: %+v", bb)
	assert.Equal(t, "E1", bb.Creation.Exchange)
	assert.True(t, bb.Creation.FromWaits, "SOC's head is C1, which fails")
	assert.Equal(t, "order:modify C1", bb.Creation.FromHead)
	assert.Equal(t, orderview.ReasonFailing, got["SOC"].Reason)

	for i := 1; i < len(page.Orders); i++ {
		assert.False(t, page.Orders[i].Since.Before(page.Orders[i-1].Since), "oldest first")
	}
	assert.Equal(t, len(page.Orders), page.Total)
	assert.Equal(t, 2, page.Counts[orderview.ReasonFailing])
	assert.Equal(t, 2, page.Counts[orderview.ReasonCreation])
	assert.Equal(t, page.Orders[0].AgeMS, page.OldestAgeMS)

	// Pages of one, by cursor, list the same orders in the same order.
	var paged []string
	q := orderview.BlockedQuery{Limit: 1}
	for range 20 {
		p, err := r.Blocked(t.Context(), q)
		require.NoError(t, err)
		for _, o := range p.Orders {
			paged = append(paged, o.OrderNo)
		}
		if p.NextCursor == "" {
			break
		}
		q.Cursor = p.NextCursor
	}
	var all []string
	for _, o := range page.Orders {
		all = append(all, o.OrderNo)
	}
	assert.Equal(t, all, paged)

	only, err := r.Blocked(t.Context(), orderview.BlockedQuery{Reason: orderview.ReasonGap})
	require.NoError(t, err)
	require.Len(t, only.Orders, 1)
	assert.Equal(t, "SOG", only.Orders[0].OrderNo)

	// Before BLOCKED_AFTER has passed nothing is listed.
	fresh := b.reader(t, time.Now)
	page, err = fresh.Blocked(t.Context(), orderview.BlockedQuery{})
	require.NoError(t, err)
	assert.Empty(t, page.Orders)
	assert.NotZero(t, page.Candidates)
}

func TestBlockedRefusesABadQuery(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	for _, q := range []orderview.BlockedQuery{{Limit: -1}, {Limit: orderview.MaxBlockedLimit + 1}, {Reason: "bored"}} {
		_, err := e.reader.Blocked(t.Context(), q)
		require.ErrorIs(t, err, orderview.ErrBadQuery, "%+v", q)
	}
	for _, c := range []string{"x", "12", "12.", "12.a b", "a.SO1"} {
		_, err := e.reader.Blocked(t.Context(), orderview.BlockedQuery{Cursor: c})
		require.ErrorIs(t, err, orderview.ErrBadCursor, c)
	}
}

// Two replacements that wait for each other's creation are a cycle; an
// order an operator holds is listed as held with who and why; a head whose
// task is active on a dead worker (its asynq lease ended) is lock_stale.
// The sequences and asynq's records are written as the producer, the
// holds and asynq's dequeue write them.
func TestBlockedCycleHeldAndStaleLock(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	ctx := t.Context()
	seq, err := keyorder.NewSequencer(b.rdb, keyorder.SeqConfig{Prefix: b.prefix + "lock:"})
	require.NoError(t, err)
	// SOX waits for its creation by exchange X2 of SOY, which waits for its
	// creation by exchange X1 of SOX.
	_, err = seq.Reserve(ctx, "SOX", tasks.CreationLabel("X2", "SOY"), keyorder.CreationRef("X2"))
	require.NoError(t, err)
	_, err = seq.Reserve(ctx, "SOY", tasks.CreationLabel("X1", "SOX"), keyorder.CreationRef("X1"))
	require.NoError(t, err)
	b.modify(t, "SOX", "X1m", producer.WithProcessIn(time.Hour)) // puts SOX among the candidates

	// SOH is held.
	b.put(t, "SOH", "SOD")
	b.modify(t, "SOH", "H1", producer.WithProcessIn(time.Hour))
	pause, err := seq.Pause(ctx, "SOH", "ops@example.com", "customer asked")
	require.NoError(t, err)
	at := pause.At

	// SOD's head D1 was taken by a worker that died: active, its lease
	// ended a minute ago (asynq's dequeue moves it so).
	b.modify(t, "SOD", "D1")
	q := tasks.QueueModify
	ended := time.Now().Add(-time.Minute).Truncate(time.Second)
	require.NoError(t, b.rdb.LRem(ctx, asynqredis.PendingKey(q), 0, "D1").Err())
	require.NoError(t, b.rdb.LPush(ctx, asynqredis.ActiveKey(q), "D1").Err())
	require.NoError(t, b.rdb.HSet(ctx, asynqredis.TaskKey(q, "D1"), "state", "active").Err())
	require.NoError(t, b.rdb.ZAdd(ctx, asynqredis.LeaseKey(q), redis.Z{Score: float64(ended.Unix()), Member: "D1"}).Err())

	now := time.Now().Add(later)
	page, err := b.reader(t, func() time.Time { return now }).Blocked(ctx, orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)

	x := got["SOX"]
	require.Equal(t, orderview.ReasonCreation, x.Reason, "%+v", x)
	assert.True(t, x.Creation.Cycle)
	assert.Equal(t, []string{"SOX", "SOY", "SOX"}, x.Creation.Chain)
	assert.Equal(t, orderview.TaskMissing, x.Creation.ExchangeState)
	assert.Contains(t, x.Explanation, "cycle")

	h := got["SOH"]
	require.Equal(t, orderview.ReasonHeld, h.Reason, "%+v", h)
	assert.Equal(t, &orderview.Hold{By: "ops@example.com", Reason: "customer asked", At: at}, h.Hold)
	assert.Equal(t, at, h.Since)
	assert.InDelta(t, now.Sub(at).Milliseconds(), h.AgeMS, 1000)

	d := got["SOD"]
	require.Equal(t, orderview.ReasonLockStale, d.Reason, "%+v", d)
	assert.Equal(t, "D1", d.Lock.TaskID)
	assert.Equal(t, "active", d.Lock.TaskState)
	assert.Equal(t, ended.UTC(), d.Lock.LeaseEndedAt)
	assert.Contains(t, d.Explanation, "gone")
}

// The same list on a Redis Cluster with three queue shards per kind: the
// sets are read in every shard queue, on the master of each.
func TestBlockedOnAClusterWithShards(t *testing.T) {
	db := redistest.NewCluster(t)
	b := newBlockedEnv(t, db.Client, db.Prefix, tasks.Shards{Count: 3})
	driveReasons(t, b)
	checkReasons(t, b)
}

// One order whose sequence cannot be read (a hash forged by hand) is
// listed as unreadable; it does not fail the list and hide the others.
func TestBlockedListsAnUnreadableSequence(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	ctx := t.Context()
	seq, err := keyorder.NewSequencer(b.rdb, keyorder.SeqConfig{Prefix: b.prefix + "lock:"})
	require.NoError(t, err)
	b.put(t, "SOBAD", "SOOK")
	b.modify(t, "SOBAD", "B1", producer.WithProcessIn(time.Hour))
	b.modify(t, "SOOK", "K1", producer.WithProcessIn(time.Hour))
	require.NoError(t, b.rdb.HSet(ctx, seq.SeqKey("SOBAD"), "n", "not a number").Err())

	now := time.Now().Add(time.Hour)
	page, err := b.reader(t, func() time.Time { return now }).Blocked(ctx, orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)
	require.Equal(t, orderview.ReasonUnreadable, got["SOBAD"].Reason, "%+v", got["SOBAD"])
	require.Contains(t, got["SOBAD"].Explanation, "bad n")
	require.Equal(t, orderview.ReasonScheduled, got["SOOK"].Reason, "%+v", got["SOOK"])
	require.Equal(t, 1, page.Counts[orderview.ReasonUnreadable])
}

// One order whose sequence key has the wrong Redis type (a string the
// intake's Redis user may write) is listed as unreadable, with the error,
// and the other orders are still listed: a per-order read error never
// fails the list. So is an order held while its sequence is a string.
func TestBlockedListsAWronglyTypedSequence(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	ctx := t.Context()
	seq, err := keyorder.NewSequencer(b.rdb, keyorder.SeqConfig{Prefix: b.prefix + "lock:"})
	require.NoError(t, err)
	orderviewtest.Later(t, e.db.Client, e.db.Prefix, "SO21", "SO22")
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	intake := e.db.AsUser(t, rules...)
	_, err = seq.Pause(ctx, "SO23", "ops", "check")
	require.NoError(t, err)
	for _, no := range []string{"SO21", "SO23"} {
		orderviewtest.WrongTypeSeq(t, intake.Client, e.db.Prefix, no)
	}

	now := time.Now().Add(time.Hour)
	page, err := b.reader(t, func() time.Time { return now }).Blocked(ctx, orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)
	for _, no := range []string{"SO21", "SO23"} {
		require.Equal(t, orderview.ReasonUnreadable, got[no].Reason, "%+v", got[no])
		require.Contains(t, got[no].Explanation, "WRONGTYPE")
	}
	require.Equal(t, orderview.ReasonScheduled, got["SO22"].Reason, "%+v", got["SO22"])
	require.Equal(t, 2, page.Counts[orderview.ReasonUnreadable])

	// Only the caller's end fails the list.
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.reader(t, func() time.Time { return now }).Blocked(done, orderview.BlockedQuery{})
	require.ErrorIs(t, err, context.Canceled)
}

// The same list on a Sentinel group, through its failover client.
func TestBlockedOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	b := newBlockedEnv(t, db.Client, db.Prefix, tasks.Shards{})
	driveReasons(t, b)
	checkReasons(t, b)
}

// An order whose only change is its failing head is listed as failing
// behind 2,001 members of the retry set that name no task (ghosts), which
// the intake's Redis user ZADDed just before the head's retry: the page
// counts them and is not truncated.
func TestBlockedListsAFailingHeadBehindGhosts(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	ctx := t.Context()
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	intake := e.db.AsUser(t, rules...)
	b.put(t, "SO24")
	b.modify(t, "SO24", "fail-24")
	b.run(t, map[string]bool{"fail-24": true}, map[string]string{"fail-24": worker.OutcomeError})
	retry := asynqredis.RetryKey(tasks.QueueModify)
	due, err := b.rdb.ZScore(ctx, retry, "fail-24").Result()
	require.NoError(t, err)
	const n = 2001
	zs := make([]redis.Z, n)
	for i := range zs {
		zs[i] = redis.Z{Score: due - 3, Member: "fake-" + strconv.Itoa(i)}
	}
	require.NoError(t, intake.Client.ZAdd(ctx, retry, zs...).Err())

	now := time.Now().Add(later)
	page, err := b.reader(t, func() time.Time { return now }).Blocked(ctx, orderview.BlockedQuery{})
	require.NoError(t, err)
	got := byOrder(page)
	require.Equal(t, orderview.ReasonFailing, got["SO24"].Reason, "%+v", page)
	require.Equal(t, 1, page.Counts[orderview.ReasonFailing])
	require.Equal(t, n, page.Ghosts)
	require.False(t, page.Truncated)
}

// With a real worker, a modify that fails past its budget (MaxRetry 0)
// halts its order, listed as halted with the failure and the task, the
// change behind it waiting.
func TestBlockedListsAHaltedOrder(t *testing.T) {
	e := newEnv(t, orderview.Config{})
	b := newBlockedEnv(t, e.db.Client, e.db.Prefix, tasks.Shards{})
	b.put(t, "SOH")
	b.modify(t, "SOH", "H1", producer.WithMaxRetry(0))
	b.modify(t, "SOH", "H2")
	b.run(t, map[string]bool{"H1": true}, map[string]string{"H1": worker.OutcomeRejected})
	r := b.reader(t, time.Now)
	page, err := r.Blocked(t.Context(), orderview.BlockedQuery{Reason: orderview.ReasonHalted})
	require.NoError(t, err)
	h, ok := byOrder(page)["SOH"]
	require.True(t, ok, "%+v", page)
	require.Equal(t, orderview.ReasonHalted, h.Reason)
	require.NotNil(t, h.Halted)
	assert.Equal(t, "H1", h.Halted.TaskID)
	assert.Contains(t, h.Halted.LastError, "upstream said 503 for H1")
	assert.False(t, h.Halted.At.IsZero())
	assert.EqualValues(t, 2, h.Waiting)
	assert.Contains(t, h.Explanation, "retries it in its place or skips it")
	assert.EqualValues(t, 1, page.Counts[orderview.ReasonHalted])
}
