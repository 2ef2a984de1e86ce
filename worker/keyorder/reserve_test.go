package keyorder_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file run the engine's two-step enqueue
// (Client.Reserve, then Reservation.Enqueue or Void), which a Cluster and
// a task scheduled for later take, with what a producer adds to it.

// A reservation's task, enqueued in a second step (scheduled for later),
// runs in its turn behind a task enqueued before it, with its claim set.
func TestReserveThenEnqueue(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	enqueue(t, c, "K", 1)
	claim := db.Prefix + "claim:{two}"
	res, err := c.Reserve(t.Context(), "K", keyorder.AtOnce{Label: keyorder.Label("default", "two"), Claim: claim, ClaimValue: "mine", ClaimTTL: time.Minute})
	require.NoError(t, err)
	require.Empty(t, res.Claimed, "a new claim")
	v, err := db.Client.Get(t.Context(), claim).Result()
	require.NoError(t, err)
	require.Equal(t, "mine", v)
	e, err := res.Enqueue(t.Context(), asynq.NewTask("order", payload(t, "K", 2)), asynq.TaskID("two"), asynq.ProcessIn(50*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, res.Pos, e.Pos)

	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "the tasks did not both run")
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
	for _, x := range rc.all() {
		if x.N == 2 {
			require.Equal(t, res.Pos, x.Pos)
		}
	}
}

// A claim that exists is reported, and the positions are taken all the
// same; Void gives them back, and the key's next task takes its turn at
// once.
func TestReserveReportsAClaimAndVoids(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	claim := db.Prefix + "claim:{ev}"
	require.NoError(t, db.Client.Set(t.Context(), claim, "theirs", time.Minute).Err())
	res, err := c.Reserve(t.Context(), "K", keyorder.AtOnce{Label: "k1", Claim: claim, ClaimValue: "mine", ClaimTTL: time.Minute,
		Link: "NEW", LinkLabel: "creation", LinkRef: "c:ev"})
	require.NoError(t, err)
	require.Equal(t, "theirs", res.Claimed)
	require.Positive(t, res.Pos)
	require.Positive(t, res.LinkPos)
	require.NoError(t, res.Void(t.Context(), "the event ID was taken"))
	seq := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{}).Sequencer()
	for key, pos := range map[string]int64{"K": res.Pos, "NEW": res.LinkPos} {
		st, err := seq.Status(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, pos, st.Done, "%s: the voided position is passed", key)
		require.Zero(t, st.Waiting, key)
	}
	v, err := db.Client.Get(t.Context(), claim).Result()
	require.NoError(t, err)
	require.Equal(t, "theirs", v, "someone else's claim stays")
}

// Past MaxWaiting, nothing stays: the linked position is given back and
// the claim set by the call is released.
func TestReserveFullGivesBackWhatItTook(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newCappedClient(t, db.Client, db.Prefix, 1, keyorder.ClientConfig{})
	enqueue(t, c, "K", 1)
	claim := db.Prefix + "claim:{over}"
	_, err := c.Reserve(t.Context(), "K", keyorder.AtOnce{Label: "k2", Claim: claim, ClaimValue: "mine", ClaimTTL: time.Minute,
		Link: "NEW", LinkLabel: "creation", LinkRef: "c:over"})
	var full *keyorder.FullError
	require.ErrorAs(t, err, &full)
	require.EqualValues(t, 1, full.Max)
	n, err := db.Client.Exists(t.Context(), claim).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the claim made by the refused call stays")
	st, err := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{}).Sequencer().Status(t.Context(), "NEW")
	require.NoError(t, err)
	require.Zero(t, st.Waiting, "the linked position stays waiting")
}

// A Redis that lost its script cache (a restart) is given the script
// again, and the claim that the first round set counts as the call's own.
func TestReserveAfterScriptFlush(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "SCRIPT FLUSH on a Redis of the test's own")
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	require.NoError(t, db.Client.ScriptFlush(t.Context()).Err())
	var echo *redis.StringCmd
	claim := db.Prefix + "claim:{flush}"
	res, err := c.Reserve(t.Context(), "K", keyorder.AtOnce{Label: "k1", Claim: claim, ClaimValue: "mine", ClaimTTL: time.Minute,
		Pipe: func(pipe redis.Pipeliner) { echo = pipe.Echo(t.Context(), "after") }})
	require.NoError(t, err)
	require.Empty(t, res.Claimed, "the first round's claim is the call's own")
	require.Positive(t, res.Pos)
	require.Equal(t, "after", echo.Val())
}

// An enqueue refused for its task ID, or for its payload, gives the
// positions back: the key's next task does not wait for them.
func TestReservationEnqueueRefusedVoids(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	first := enqueue(t, c, "K", 1)
	seq := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{}).Sequencer()
	for name, enq := range map[string]func(*keyorder.Reservation) error{
		"a task ID its queue holds": func(res *keyorder.Reservation) error {
			_, err := res.Enqueue(t.Context(), asynq.NewTask("order", payload(t, "K", 2)), asynq.TaskID(first.TaskID))
			require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
			return err
		},
		"a payload with a seq": func(res *keyorder.Reservation) error {
			_, err := res.Enqueue(t.Context(), asynq.NewTask("order", []byte(`{"seq":1}`)), asynq.TaskID("bad"))
			require.ErrorIs(t, err, keyorder.ErrPayload)
			return err
		},
	} {
		res, err := c.Reserve(t.Context(), "K", keyorder.AtOnce{Label: "k-" + name})
		require.NoError(t, err, name)
		require.Error(t, enq(res), name)
		st, err := seq.Status(t.Context(), "K")
		require.NoError(t, err)
		voided := false
		for _, e := range st.Log {
			voided = voided || e.Kind == "void" && e.Pos == res.Pos
		}
		require.True(t, voided, "%s: the refused enqueue's position was not voided: %+v", name, st.Log)
	}
}

// Reserve refuses, having written nothing, what it cannot take.
func TestReserveRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	before := dbsize(t, db)
	for name, x := range map[string]keyorder.AtOnce{
		"no label":               {},
		"a claim TTL < 1ms":      {Label: "l", Claim: db.Prefix + "c", ClaimValue: "v", ClaimTTL: time.Microsecond},
		"a link without a label": {Label: "l", Link: "NEW"},
	} {
		_, err := c.Reserve(context.Background(), "K", x)
		require.Error(t, err, name)
	}
	require.Equal(t, before, dbsize(t, db))
	_, err := c.Reserve(t.Context(), "", keyorder.AtOnce{Label: "l"})
	require.Error(t, err, "a blank key")
}

// On a Cluster, a master that lost the engine's script (a replica promoted
// in a failover starts without it) refuses the reservation of its key
// only: the linked key's, taken on another master in the same round trip,
// is not taken a second time when the script is loaded again.
func TestReserveOnClusterWhenOneMasterLostTheScript(t *testing.T) {
	t.Parallel()
	db := redistest.DedicatedCluster(t)
	keys := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprint("RK-", i) })
	own, link := keys[0], keys[1]
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	seq := space(t, db.Client, db.Prefix, keyorder.SeqConfig{})
	for _, k := range keys[:2] { // the script on both masters, and a position waiting on each
		_, err := c.Reserve(t.Context(), k, keyorder.AtOnce{Label: "warm"})
		require.NoError(t, err)
	}
	master, err := db.Client.MasterForKey(t.Context(), seq.SeqKey(own))
	require.NoError(t, err)
	require.NoError(t, master.ScriptFlush(t.Context()).Err())
	other, err := db.Client.MasterForKey(t.Context(), seq.SeqKey(link))
	require.NoError(t, err)
	require.NotEqual(t, master.Options().Addr, other.Options().Addr, "the keys share a master")

	res, err := c.Reserve(t.Context(), own, keyorder.AtOnce{Label: "k", Link: link, LinkLabel: "creation", LinkRef: "c:k"})
	require.NoError(t, err)
	require.Positive(t, res.Pos)
	require.Positive(t, res.LinkPos)
	for k, want := range map[string]int64{own: 2, link: 2} {
		st, err := seq.Status(t.Context(), k)
		require.NoError(t, err)
		require.Equal(t, want, st.Waiting, "%s: positions waiting (a position taken twice leaves a gap)", k)
	}
}

// A repeat reserves a second position under the same reference while the
// first still waits (an exchange sent again after its answer was lost),
// and the work finishes by the reference before the repeat voids its own:
// the finish lands on the repeat's position, and the first one, whose
// work will end nowhere else, is voided with it, so that the positions
// behind both go at once rather than after the gap check. The repeat's
// void comes after and changes nothing.
func TestFinishByReferenceVoidsTheRepeatsTwin(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	q := space(t, db.Client, db.Prefix, keyorder.SeqConfig{})
	ctx := t.Context()
	const key, ref = "SO-TWIN", "create:x-1"
	first, err := q.Reserve(ctx, key, "c x-1", ref)
	require.NoError(t, err)
	repeat, err := q.Reserve(ctx, key, "c x-1 again", ref)
	require.NoError(t, err)
	behind, err := q.Reserve(ctx, key, "m after", "")
	require.NoError(t, err)
	require.Less(t, first, repeat)

	st, err := q.Finish(ctx, key, 0, "", ref, "created")
	require.NoError(t, err)
	require.True(t, st.Done)
	s, err := q.Status(ctx, key)
	require.NoError(t, err)
	require.Equal(t, behind-1, s.Done, "the cursor passed both reservations of the reference: the change behind is next")

	st, err = q.Void(ctx, key, repeat, "c x-1 again", "the enqueue was refused as a duplicate")
	require.NoError(t, err)
	require.False(t, st.Done, "settled already")
}
