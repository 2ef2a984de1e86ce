package keyorder_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// blockedByKey reads every blocked key of queue "default" as of an hour
// from now, with linked, and maps them by key.
func blockedByKey(t *testing.T, r *keyorder.Runner, q keyorder.BlockedQuery) (keyorder.BlockedKeys, map[string]keyorder.Blocked) {
	t.Helper()
	if q.Queues == nil {
		q.Queues = []string{"default"}
	}
	if q.Now.IsZero() {
		q.Now = time.Now().Add(time.Hour)
	}
	got, err := r.Blocked(t.Context(), q)
	require.NoError(t, err)
	out := map[string]keyorder.Blocked{}
	for _, b := range got.Keys {
		out[b.Head.Key] = b
	}
	return got, out
}

// The blocked read, without a worker: a key on hold (with a task, and
// only in the index of holds), a head whose task was deleted, one that
// holds another position of its key, one scheduled for later, one active
// on a worker that is gone, one whose lock a task that no longer exists
// holds, one that only waits, one whose sequence is malformed, and one
// found only through the task that linked it.
func TestBlockedReadsEachReason(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	seq := space(t, db.Client, db.Prefix, keyorder.SeqConfig{})
	insp := asynq.NewInspectorFromRedisClient(db.Client)

	// H is held with a task. I was held, and its sequence is gone: the
	// index of holds (best effort) still lists it, but the sequence says
	// whether a key is on hold, and I is not.
	require.NoError(t, r.Hold(ctx, "H", "ops", "audit"))
	h1 := enqueue(t, c, "H", 1)
	require.NoError(t, r.Hold(ctx, "I", "ops", "gone"))
	require.NoError(t, db.Client.Del(ctx, seq.SeqKey("I")).Err())

	// HU is held, and its head's task is in a queue asynq's set of queues
	// lost (a failover): the hold is what matters, the task stays unread.
	unlisted := "blocked_unlisted_" + strings.ReplaceAll(db.Prefix, ":", "")
	t.Cleanup(func() { _ = insp.DeleteQueue(unlisted, true) })
	require.NoError(t, r.Hold(ctx, "HU", "ops", "audit"))
	enqueue(t, c, "HU", 1, asynq.Queue(unlisted))
	require.NoError(t, db.Client.SRem(ctx, asynqwire.AllQueues, unlisted).Err())

	// G's head was deleted; the task behind it waits parked.
	g1 := enqueue(t, c, "G", 1)
	enqueue(t, c, "G", 2)
	require.NoError(t, insp.DeleteTask(g1.Queue, g1.TaskID))

	// P's head names a task that holds P's next position.
	_, err := seq.Reserve(ctx, "P", keyorder.Label("default", "p-dup"), "")
	require.NoError(t, err)
	pdup := enqueue(t, c, "P", 2, asynq.TaskID("p-dup"))

	// S's head runs only in an hour.
	s1 := enqueue(t, c, "S", 1, asynq.ProcessIn(time.Hour))
	enqueue(t, c, "S", 2)

	// D's head was taken by a worker that died: active, its lease ended.
	d1 := enqueue(t, c, "D", 1)
	enqueue(t, c, "D", 2)
	ended := time.Now().Add(-time.Minute).Truncate(time.Second)
	require.NoError(t, db.Client.LRem(ctx, asynqwire.PendingKey("default"), 0, d1.TaskID).Err())
	require.NoError(t, db.Client.LPush(ctx, asynqwire.ActiveKey("default"), d1.TaskID).Err())
	require.NoError(t, db.Client.HSet(ctx, asynqwire.TaskKey("default", d1.TaskID), "state", "active").Err())
	require.NoError(t, db.Client.ZAdd(ctx, asynqwire.LeaseKey("default"), redis.Z{Score: float64(ended.Unix()), Member: d1.TaskID}).Err())

	// L's lock is held by a task no queue has; its head is pending.
	l1 := enqueue(t, c, "L", 1)
	enqueue(t, c, "L", 2)
	locker, err := keyorder.New(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.Config{TTL: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locker.Close()) })
	_, err = locker.Acquire(ctx, "L", "order ghost-task", keyorder.Wait{})
	require.NoError(t, err)

	// W's head is pending, with nothing wrong: it waits.
	w1 := enqueue(t, c, "W", 1)
	enqueue(t, c, "W", 2)

	// U's sequence was written by hand.
	enqueue(t, c, "U", 1)
	enqueue(t, c, "U", 2)
	require.NoError(t, db.Client.HSet(ctx, seq.SeqKey("U"), "n", "not a number").Err())

	// Y's only position is linked to X's task x2, which runs in an hour:
	// only x2 names Y.
	enqueue(t, c, "X", 1)
	res, err := c.Reserve(ctx, "X", keyorder.AtOnce{Label: keyorder.Label("default", "x2"),
		Link: "Y", LinkLabel: keyorder.Label("default", "x2"), LinkRef: "x2"})
	require.NoError(t, err)
	x2, err := res.Enqueue(ctx, asynq.NewTask("order", payload(t, "X", 2)), asynq.TaskID("x2"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	linked := func(t *asynq.Task) []string {
		if k, err := keyOf(t); err == nil && k == "X" {
			return []string{"Y"}
		}
		return nil
	}

	all, got := blockedByKey(t, r, keyorder.BlockedQuery{After: time.Nanosecond, Linked: linked})
	require.False(t, all.Truncated)
	for i := 1; i < len(all.Keys); i++ {
		require.False(t, all.Keys[i].Since.Before(all.Keys[i-1].Since), "oldest first")
	}

	require.Equal(t, keyorder.BlockedHeld, got["H"].Reason, "%+v", got["H"])
	require.Equal(t, h1.TaskID, got["H"].Head.TaskID)
	require.Equal(t, "ops", got["H"].Head.Held.By)
	require.Equal(t, got["H"].Head.Held.At, got["H"].Since)
	require.Equal(t, keyorder.BlockedHeld, got["HU"].Reason, "%+v", got["HU"])
	require.Empty(t, got["HU"].Head.State, "a task of an unlisted queue is not read")
	require.Equal(t, unlisted, got["HU"].Head.Queue)
	require.NotContains(t, got, "I", "a key the index alone lists is not on hold")

	require.Equal(t, keyorder.BlockedGap, got["G"].Reason, "%+v", got["G"])
	require.Contains(t, got["G"].Fate, g1.TaskID+" is not in queue default")
	require.Equal(t, keyorder.StateMissing, got["G"].Head.State)
	require.Equal(t, keyorder.BlockedGap, got["P"].Reason, "%+v", got["P"])
	require.Contains(t, got["P"].Fate, fmt.Sprintf("p-dup holds position %d, not this one", pdup.Pos))

	require.Equal(t, keyorder.BlockedScheduled, got["S"].Reason, "%+v", got["S"])
	require.Equal(t, s1.TaskID, got["S"].Head.TaskID)
	require.WithinDuration(t, time.Now().Add(time.Hour), got["S"].Head.NextRunAt, time.Minute)

	require.Equal(t, keyorder.BlockedStale, got["D"].Reason, "%+v", got["D"])
	require.Equal(t, d1.TaskID, got["D"].Stale.TaskID)
	require.WithinDuration(t, ended, got["D"].Stale.LeaseEnded, 0)

	require.Equal(t, keyorder.BlockedStale, got["L"].Reason, "%+v", got["L"])
	require.Equal(t, &keyorder.Stale{Holder: "order ghost-task", HolderTTL: got["L"].Stale.HolderTTL, TaskID: "ghost-task",
		Queue: "default", State: keyorder.StateMissing}, got["L"].Stale)
	require.Positive(t, got["L"].Stale.HolderTTL)
	require.Equal(t, l1.TaskID, got["L"].Head.TaskID)

	require.Equal(t, keyorder.BlockedWaiting, got["W"].Reason, "%+v", got["W"])
	require.Equal(t, w1.TaskID, got["W"].Head.TaskID)
	require.Equal(t, "pending", got["W"].Head.State)

	require.Equal(t, keyorder.BlockedUnreadable, got["U"].Reason, "%+v", got["U"])
	require.ErrorIs(t, got["U"].Err, keyorder.ErrMalformed)

	// Y waits for x2, which holds a position of X, not of Y: that is no
	// gap, and Y runs when x2 does.
	require.Equal(t, keyorder.BlockedScheduled, got["Y"].Reason, "%+v", got["Y"])
	require.Equal(t, "x2", got["Y"].Head.TaskID)
	require.Equal(t, x2.LinkPos, got["Y"].Head.Pos)

	// Without Linked, Y is not found; the others are.
	_, without := blockedByKey(t, r, keyorder.BlockedQuery{After: time.Nanosecond})
	require.NotContains(t, without, "Y")
	require.Contains(t, without, "X")

	// A head younger than After is not blocked; a key on hold is, and so
	// is one whose age cannot be read.
	_, young := blockedByKey(t, r, keyorder.BlockedQuery{Now: time.Now(), After: time.Hour})
	require.Equal(t, []string{"H", "HU", "U"}, sortedKeys(young))

	// A bound below the sets' size reads only their first tasks, and says
	// so.
	some, _ := blockedByKey(t, r, keyorder.BlockedQuery{Scan: 1, After: time.Nanosecond})
	require.True(t, some.Truncated)
	require.Less(t, some.Candidates, all.Candidates)

	_, err = r.Blocked(ctx, keyorder.BlockedQuery{})
	require.Error(t, err, "no queues")
	_, err = r.Blocked(ctx, keyorder.BlockedQuery{Queues: []string{"default"}, Scan: -1})
	require.Error(t, err, "a negative bound")
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Blocked(done, keyorder.BlockedQuery{Queues: []string{"default"}})
	require.ErrorIs(t, err, context.Canceled)
}

func sortedKeys(m map[string]keyorder.Blocked) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A position that a task of another key linked ([keyorder.AtOnce].Link)
// waits for that task, which holds a position of its own key: the Runner
// does not take it for a gap, however long it waits; a task that holds
// another position of the same key is one.
func TestHeadFateOfALinkedPosition(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	x1 := enqueue(t, c, "X", 1)
	x2, err := c.EnqueueAtOnce(ctx, "X", asynq.NewTask("order", payload(t, "X", 2)),
		keyorder.AtOnce{Link: "Y", LinkLabel: keyorder.Label("default", "x2"), LinkRef: "x2"}, asynq.TaskID("x2"))
	require.NoError(t, err)
	require.Equal(t, x1.Pos+1, x2.Pos)
	require.NotEqual(t, x2.Pos, x2.LinkPos, "Y's sequence is not X's")

	why, later, err := r.HeadFate(ctx, "Y", x2.LinkPos, keyorder.Label("default", "x2"))
	require.NoError(t, err)
	require.Empty(t, why, "x2 comes for Y's position")
	require.Positive(t, later, "x2 waits parked behind x1: Y's head comes back when it runs")

	// The same task named by a position of its own key that it does not
	// hold is a gap.
	why, _, err = r.HeadFate(ctx, "X", x1.Pos, keyorder.Label("default", "x2"))
	require.NoError(t, err)
	require.Contains(t, why, fmt.Sprintf("x2 holds position %d, not this one", x2.Pos))
}

// A key whose only position is a head that fails and backs off for an
// hour is listed as failing behind 2,001 members of the retry set that
// name no task (ghosts, ZADDed by the intake's Redis user, scored just
// before the head): they do not count towards Scan, and the read says
// how many it passed over and that it is not truncated.
func TestBlockedReadsPastGhosts(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...)
	const q = "blocked_ghosts"
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	f1 := enqueue(t, c, "F", 1, asynq.Queue(q), asynq.MaxRetry(25))

	// One failed run by a real asynq server, which backs off an hour.
	srv := asynq.NewServerFromRedisClient(db.Client, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 1,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return errors.New("upstream said 503")
	})))
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(q, f1.TaskID)
		return err == nil && info.State == asynq.TaskStateRetry
	}, 10*time.Second, 10*time.Millisecond)
	srv.Shutdown()
	due, err := db.Client.ZScore(ctx, asynqwire.RetryKey(q), f1.TaskID).Result()
	require.NoError(t, err)
	const n = 2001
	zs := make([]redis.Z, n)
	for i := range zs {
		zs[i] = redis.Z{Score: due - 3, Member: fmt.Sprintf("fake-%d", i)}
	}
	require.NoError(t, intake.Client.ZAdd(ctx, asynqwire.RetryKey(q), zs...).Err())

	all, got := blockedByKey(t, r, keyorder.BlockedQuery{Queues: []string{q}, After: time.Nanosecond})
	require.Equal(t, keyorder.BlockedFailing, got["F"].Reason, "%+v", all)
	require.Equal(t, n, all.Ghosts)
	require.False(t, all.Truncated, "the ghosts are no tasks: the set holds one")
}
