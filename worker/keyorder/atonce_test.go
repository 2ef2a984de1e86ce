package keyorder_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file run Client.EnqueueAtOnce, the engine's one
// enqueue script, with what a producer adds to it.

// A claim is set with the task; a second enqueue under the same claim
// writes nothing and says whose the claim is.
func TestEnqueueAtOnceClaims(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	claim := db.Prefix + "claim:{K}"
	x := keyorder.AtOnce{Label: "first", Claim: claim, ClaimValue: "mine", ClaimTTL: time.Minute}
	e, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), x, asynq.TaskID("one"))
	require.NoError(t, err)
	require.Positive(t, e.Pos)
	require.Zero(t, e.LinkPos)
	v, err := db.Client.Get(t.Context(), claim).Result()
	require.NoError(t, err)
	require.Equal(t, "mine", v)
	ttl, err := db.Client.PTTL(t.Context(), claim).Result()
	require.NoError(t, err)
	require.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 5)

	before := dbsize(t, db)
	x.ClaimValue = "theirs"
	_, err = c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 2)), x, asynq.TaskID("two"))
	var claimed *keyorder.ClaimedError
	require.ErrorAs(t, err, &claimed)
	require.ErrorIs(t, err, keyorder.ErrClaimed)
	require.Equal(t, "mine", claimed.Value)
	require.Equal(t, before, dbsize(t, db), "a claimed enqueue wrote")
	st, err := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{}).Sequencer().Status(t.Context(), "K")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Waiting, "a claimed enqueue took a position")
	require.Equal(t, "first", st.Pending[0].Label, "the position is under the label given")
}

// A task ID that its queue holds already is claimed all the same, and
// takes no position.
func TestEnqueueAtOnceExistingTaskIsClaimed(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	first, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), keyorder.AtOnce{}, asynq.TaskID("one"))
	require.NoError(t, err)
	claim := db.Prefix + "claim:{K}"
	x := keyorder.AtOnce{Claim: claim, ClaimValue: "again", ClaimTTL: time.Minute}
	_, err = c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), x, asynq.TaskID("one"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	v, err := db.Client.Get(t.Context(), claim).Result()
	require.NoError(t, err)
	require.Equal(t, "again", v)
	second, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 2)), keyorder.AtOnce{}, asynq.TaskID("two"))
	require.NoError(t, err)
	require.Equal(t, first.Pos+1, second.Pos, "the refused enqueue took a position")
}

// A linked key's next position is reserved in the same script: ready,
// never parked, and not capped by MaxWaiting; the task's own position is.
func TestEnqueueAtOnceLinksAPosition(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newCappedClient(t, db.Client, db.Prefix, 1, keyorder.ClientConfig{})
	link := keyorder.AtOnce{Link: "NEW", LinkLabel: "creation", LinkRef: "c:one"}
	e, err := c.EnqueueAtOnce(t.Context(), "OLD", asynq.NewTask("t", payload(t, "OLD", 1)), link, asynq.TaskID("one"))
	require.NoError(t, err)
	require.Positive(t, e.LinkPos)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	st, err := r.Sequencer().Status(t.Context(), "NEW")
	require.NoError(t, err)
	require.Equal(t, e.LinkPos, st.Pending[0].Pos)
	require.Equal(t, "creation", st.Pending[0].Label)
	// A second link into NEW passes MaxWaiting (1): the link is not capped.
	link.LinkRef = "c:two"
	_, err = c.EnqueueAtOnce(t.Context(), "OTHER", asynq.NewTask("t", payload(t, "OTHER", 1)), link, asynq.TaskID("two"))
	require.NoError(t, err)
	// OLD is full: nothing is written, the link included.
	before := dbsize(t, db)
	link.LinkRef = "c:three"
	_, err = c.EnqueueAtOnce(t.Context(), "OLD", asynq.NewTask("t", payload(t, "OLD", 2)), link, asynq.TaskID("three"))
	require.ErrorIs(t, err, keyorder.ErrFull)
	require.Equal(t, before, dbsize(t, db))
}

// Piped commands ride in the script's round trip, also when the script
// has to be loaded again (a Redis that lost its script cache).
func TestEnqueueAtOnceRunsThePipeAfterTheScript(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "SCRIPT FLUSH on a Redis of the test's own")
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for i, flush := range []bool{false, true} {
		if flush {
			require.NoError(t, db.Client.ScriptFlush(t.Context()).Err())
		}
		var echo *redis.StringCmd
		x := keyorder.AtOnce{Pipe: func(pipe redis.Pipeliner) { echo = pipe.Echo(t.Context(), "after") }}
		_, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", i)), x)
		require.NoError(t, err)
		require.Equal(t, "after", echo.Val(), "flush %v", flush)
	}
}

// What cannot go in one script is refused, having written nothing.
func TestEnqueueAtOnceRefusesWhatTakesTwoSteps(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for _, opt := range []asynq.Option{asynq.ProcessIn(time.Minute), asynq.ProcessAt(time.Now().Add(time.Minute)), asynq.Deadline(time.Now().Add(time.Minute))} {
		_, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), keyorder.AtOnce{}, opt)
		require.ErrorIs(t, err, keyorder.ErrNotAtOnce, "option %v", opt)
	}
	_, err := c.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), keyorder.AtOnce{Claim: "c", ClaimValue: "v"})
	require.Error(t, err, "a claim without a TTL")
	require.False(t, errors.Is(err, keyorder.ErrNotAtOnce))
	require.Zero(t, dbsize(t, db))

	cl := redistest.NewCluster(t)
	cc := newClient(t, cl.NewClient(t), cl.Prefix, keyorder.ClientConfig{})
	_, err = cc.EnqueueAtOnce(t.Context(), "K", asynq.NewTask("t", payload(t, "K", 1)), keyorder.AtOnce{})
	require.ErrorIs(t, err, keyorder.ErrNotAtOnce, "on a Cluster")
}
