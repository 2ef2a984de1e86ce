package worker_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// The workers wait for a scheduled head as far ahead as the producers
// schedule, and no further: the same bound by default. A head in the
// retry set may wait as long as its failures' backoff, when that is
// longer.
func TestAheadBoundIsTheProducers(t *testing.T) {
	t.Parallel()
	scheduled := &asynq.TaskInfo{State: asynq.TaskStateScheduled, Retried: 30}
	assert.Equal(t, producer.DefaultMaxScheduleAhead, worker.AheadBound(worker.Config{}, scheduled))
	assert.Equal(t, tasks.DefaultMaxScheduleAhead, producer.DefaultMaxScheduleAhead)
	assert.Equal(t, time.Hour, worker.AheadBound(worker.Config{MaxScheduleAhead: time.Hour}, scheduled))
	assert.Equal(t, producer.DefaultMaxScheduleAhead, worker.AheadBound(worker.Config{},
		&asynq.TaskInfo{State: asynq.TaskStateRetry, Retried: 10}), "10 failures back off for about 3 h")
	assert.Greater(t, worker.AheadBound(worker.Config{}, &asynq.TaskInfo{State: asynq.TaskStateRetry, Retried: 20}),
		44*time.Hour, "20 failures may back off for 44 h")
}

// A head whose task a Redis user moved two days out in asynq's scheduled
// set (further than any producer schedules) does not hold its order until
// then: the gap check brings it forward, and it runs, then the change
// behind it, within about the gap wait.
func TestAHeadScheduledTooFarAheadIsBroughtForward(t *testing.T) {
	t.Parallel()
	const no = "SO-AHEAD"
	e := newEnv(t)
	e.seed(no)
	r := newRuns()
	e.startWorker(quickGapConfig(500*time.Millisecond, r), nil)
	p := e.producer(producer.Config{ParkFor: time.Second}) // the change behind it is parked for the gap check's sake at most this long
	ctx := t.Context()

	far, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: new("far")}, producer.WithEventID("ahead-far"), producer.WithProcessIn(time.Hour))
	require.NoError(t, err)
	// A Redis user (the intake's may ZADD the scheduled sets) moves it.
	require.NoError(t, e.db.Client.ZAdd(ctx, asynqredis.ScheduledKey(far.Queue),
		redis.Z{Score: float64(time.Now().Add(48 * time.Hour).Unix()), Member: "ahead-far"}).Err())
	info, err := e.insp.GetTaskInfo(far.Queue, "ahead-far")
	require.NoError(t, err)
	require.Greater(t, time.Until(info.NextProcessAt), 47*time.Hour)
	_, err = p.EnqueueModify(ctx, no, tasks.Changes{Remark: new("behind")}, producer.WithEventID("ahead-behind"))
	require.NoError(t, err)

	d := r.waitFor(t, "ahead-far", 30*time.Second, worker.OutcomeOK) // a bound, not a pace: the gap wait is 0.5 s
	assert.Equal(t, far.Seq, d.Seq)
	d = r.waitFor(t, "ahead-behind", 30*time.Second, worker.OutcomeOK)
	assert.Zero(t, d.Skipped, "brought forward, not skipped")
	requireInSequence(t, e.history(no))
	o, err := e.store.Get(ctx, no)
	require.NoError(t, err)
	assert.Equal(t, "behind", o.Remark)
}

// A retry count that no failure earned (the task message, which the
// intake's Redis user may write, says a million) does not stretch the
// bound past the backoff of asynq's default budget (F7r).
func TestAheadBoundTrustsNoRetryCountPastTheBudget(t *testing.T) {
	t.Parallel()
	b := worker.AheadBound(worker.Config{}, &asynq.TaskInfo{State: asynq.TaskStateRetry, Retried: 1_000_000})
	require.LessOrEqual(t, b, keyorder.DefaultMaxRetryWait)
	require.Less(t, b, 365*24*time.Hour, "a head a year out is brought forward")
}
