package keyorder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The engine runs as narrow Redis users, those the order domain ships
// (docs/engine.md, "Redis rights"): the Client as the intake's (its
// sequences read-write, and in its queues only the writes asynq's Client
// makes), the Runner as the worker's (its locks, fences and sequences, its
// notice channel, and the queues as an asynq server), and the blocked
// read as the read-only dashboard's. A hot key drains in holds (the hold
// takes tasks out of asynq and records their ends with its own scripts),
// and a failure at MaxRetry(0) is archived and passes the turn on.
func TestTheEngineAsNarrowRedisUsers(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	as := func(p acl.Process) *redistest.DB {
		rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
		require.NoError(t, err)
		return db.AsUser(t, rules...)
	}
	runnerUser, clientUser, readUser := as(acl.Worker), as(acl.Intake), as(acl.Dashboard)

	c := newClient(t, clientUser.Client, db.Prefix, keyorder.ClientConfig{})
	const hot = 30
	hotKey(t, c, "HOT", hot) // all but the first parked before a Runner starts
	failed := enqueue(t, c, "FAIL", 1, asynq.MaxRetry(0))
	enqueue(t, c, "FAIL", 2, asynq.MaxRetry(0))

	r := newRunner(t, runnerUser.Client, db.Prefix, keyorder.RunnerConfig{})
	require.NoError(t, r.CheckNotices(t.Context()), "the worker's user may use the notice channel")
	rc := newRecorder()
	startServer(t, runnerUser.Client, r, 4, rc.wrap(func(_ context.Context, b body, _ keyorder.Run) error {
		if b.Key == "FAIL" && b.N == 1 {
			return errors.New("boom")
		}
		return nil
	}))
	eventually(t, func() bool { return len(rc.succeeded("HOT")) == hot && len(rc.succeeded("FAIL")) == 1 }, "not every task ran")
	require.Equal(t, seq(hot), rc.succeeded("HOT"))
	require.Equal(t, []int{2}, rc.succeeded("FAIL"))
	require.Empty(t, rc.overlaps)
	held := 0
	for _, x := range rc.all() {
		if x.Held > 0 {
			held++
		}
	}
	require.Positive(t, held, "no task of the hot key ran in a hold")
	requireState(t, db.Client, failed, asynq.TaskStateArchived, "boom")

	// A key on hold (an operator's action, with more rights) with a task
	// waiting: the blocked read and its head, as the read-only user.
	admin := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	require.NoError(t, admin.Hold(t.Context(), "PAUSED", "ops", "audit"))
	paused := enqueue(t, c, "PAUSED", 1)
	// And a key whose lock a task that no longer exists holds, its tasks
	// in a queue no server serves: the read looks for the holder's task in
	// every queue, and at the lock, as the read-only user too.
	adminClient := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	enqueue(t, adminClient, "STALE", 1, asynq.Queue("idle"))
	enqueue(t, adminClient, "STALE", 2, asynq.Queue("idle"))
	locker, err := keyorder.New(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.Config{TTL: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locker.Close()) })
	_, err = locker.Acquire(t.Context(), "STALE", "order ghost-task", keyorder.Wait{})
	require.NoError(t, err)
	reader := newRunner(t, readUser.Client, db.Prefix, keyorder.RunnerConfig{})
	eventually(t, func() bool {
		blocked, err := reader.Blocked(t.Context(), keyorder.BlockedQuery{Queues: []string{"default", "idle"}, After: time.Nanosecond})
		require.NoError(t, err, "the blocked read needs only read rights")
		got := map[string]keyorder.Blocked{}
		for _, b := range blocked.Keys {
			got[b.Head.Key] = b
		}
		return len(got) == 2 && got["PAUSED"].Reason == keyorder.BlockedHeld && got["PAUSED"].Head.TaskID == paused.TaskID &&
			got["STALE"].Reason == keyorder.BlockedStale && got["STALE"].Stale.State == keyorder.StateMissing
	}, "the key on hold and the stale one are not listed")
	require.Len(t, rc.succeeded("PAUSED"), 0, "a task of a key on hold ran")
}
