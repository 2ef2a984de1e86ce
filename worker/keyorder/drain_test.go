package keyorder_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// drainFixture is a Locker, its Turns and the fake queue behind them.
type drainFixture struct {
	db    *redistest.DB
	l     *keyorder.Locker
	q     *keyorder.Sequencer
	f     *fakeTasks
	turns *keyorder.Turns
}

func newDrainFixture(t *testing.T, cfg keyorder.Config) *drainFixture {
	t.Helper()
	db := redistest.New(t)
	l := newLocker(t, db, cfg)
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	return &drainFixture{db: db, l: l, q: l.Sequencer(), f: f, turns: newTurns(t, l, f, time.Minute)}
}

// take takes turn's lock, which must be its turn.
func (d *drainFixture) take(t *testing.T, key string, turn keyorder.Turn) *keyorder.Lease {
	t.Helper()
	lease, _, err := d.turns.Take(t.Context(), key, "holder of "+turn.Label, turn, quick)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, lease.Mode())
	return lease
}

// park tries turn, which is not next: its holder parks at once.
func (d *drainFixture) park(t *testing.T, key string, turn keyorder.Turn) {
	t.Helper()
	_, _, err := d.turns.Take(t.Context(), key, "holder of "+turn.Label, turn, quick)
	var park *keyorder.ParkError
	require.ErrorAs(t, err, &park)
	require.True(t, park.Err.Parked, "%s is parked", turn.Label)
}

// requireHeld checks that key's lock is held with fence: another holder
// (a task without a position) gets a BusyError after its short deadline.
func (d *drainFixture) requireHeld(t *testing.T, key, meta string, fence int64) {
	t.Helper()
	h, err := d.q.Holder(t.Context(), key)
	require.NoError(t, err)
	require.True(t, h.Held)
	require.Equal(t, meta, h.Meta)
	require.Equal(t, fence, h.Fence)
	start := time.Now()
	_, err = d.l.AcquireTurn(t.Context(), key, "unordered", keyorder.Turn{},
		keyorder.Wait{MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, Deadline: 50 * time.Millisecond})
	var busy *keyorder.BusyError
	require.ErrorAs(t, err, &busy, "the lock is still held")
	require.Equal(t, meta, busy.Holder)
	require.Less(t, time.Since(start), 5*time.Second)
}

// requireFree checks that key's lock is free.
func (d *drainFixture) requireFree(t *testing.T, key string) {
	t.Helper()
	lease, err := d.l.TryAcquire(t.Context(), key, "unordered")
	require.NoError(t, err, "the lock is free")
	require.NoError(t, lease.Release(t.Context()))
}

func (d *drainFixture) done(t *testing.T, key string) int64 {
	t.Helper()
	st, err := d.q.Status(t.Context(), key)
	require.NoError(t, err)
	return st.Done
}

// With Drain, a finished turn whose work succeeded passes on to a parked
// next holder while the lock is kept (renewed, with the same fence): the
// holder goes on with that position in the same hold (Lease.Next), and
// calls nobody back. A second Pass without Drain releases, and the
// sequence moves on.
func TestDrainKeepsTheLockForAParkedNext(t *testing.T) {
	t.Parallel()
	// A TTL of a second: renewed every third of it, the lease outlives a
	// renewal that a loaded machine delays by up to two thirds.
	d := newDrainFixture(t, keyorder.Config{TTL: time.Second})
	const key = "SO-drain"
	pos := reserve(t, d.q, key, 3)
	lease := d.take(t, key, pos[0])
	hold := lease.Keep(t.Context())
	require.Equal(t, hold, lease.HoldContext())
	fence, meta := lease.Fence(), "holder of "+pos[0].Label
	d.park(t, key, pos[1])

	lease.Drain(true)
	next, kept := d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.True(t, kept, "the next holder is parked: the lock is kept for it")
	require.Equal(t, pos[1], next)
	k, ok := lease.Kept()
	require.True(t, ok)
	require.Equal(t, pos[1], k)
	require.Empty(t, d.f.wokenLabels(), "kept: nobody is called back")
	require.Equal(t, pos[0].Pos, d.done(t, key), "the first's turn is finished")
	d.requireHeld(t, key, meta, fence)
	_, err := d.l.AcquireTurn(t.Context(), key, "holder of "+pos[1].Label, pos[1],
		keyorder.Wait{MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, Deadline: 50 * time.Millisecond})
	require.ErrorIs(t, err, keyorder.ErrBusy, "the parked holder, run anyway, does not get in either")

	time.Sleep(1200 * time.Millisecond) // past the TTL: the renewal goes on
	require.NoError(t, hold.Err(), "the hold's context lives on")
	d.requireHeld(t, key, meta, fence)

	require.NoError(t, lease.Next(pos[1]))
	require.Equal(t, pos[1], lease.Turn())
	require.Equal(t, fence, lease.Fence(), "the same fence")
	require.Equal(t, keyorder.ModeTurn, lease.Mode())
	_, ok = lease.Kept()
	require.False(t, ok, "moved on: kept for nobody now")
	require.Equal(t, hold, lease.HoldContext())

	// The third parks behind the second; Next turned the drain off, so
	// this Pass releases and calls it back.
	d.park(t, key, pos[2])
	next, kept = d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.False(t, kept)
	require.Zero(t, next)
	require.Equal(t, []string{pos[2].Label}, d.f.wokenLabels())
	require.Equal(t, pos[1].Pos, d.done(t, key), "the second's turn is finished")
	require.Error(t, hold.Err(), "the hold ended with the release")
	require.NotErrorIs(t, context.Cause(hold), keyorder.ErrLost)
	d.requireFree(t, key)
	third := d.take(t, key, pos[2])
	require.Greater(t, third.Fence(), fence)
	d.turns.Pass(t.Context(), third, true, time.Time{}, true)
	require.Equal(t, pos[2].Pos, d.done(t, key))
}

// Drain keeps the lock only when the turn passes to a parked holder after
// work that succeeded, and the key is not paused; otherwise Pass releases
// as without it (calling the parked next holder back).
func TestDrainDoesNotKeep(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		parkNext  bool
		pause     bool
		done, ok  bool
		wantWoken bool // the next holder is called back
		wantDone  bool // the first's turn is finished
	}{
		{name: "the next is not parked", done: true, ok: true, wantDone: true},
		{name: "the key is paused", parkNext: true, pause: true, done: true, ok: true, wantWoken: true, wantDone: true},
		{name: "the work failed", parkNext: true, done: true, ok: false, wantWoken: true, wantDone: true},
		{name: "the turn is not done", parkNext: true, done: false, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := newDrainFixture(t, keyorder.Config{})
			const key = "SO-nodrain"
			pos := reserve(t, d.q, key, 2)
			lease := d.take(t, key, pos[0])
			if tt.parkNext {
				d.park(t, key, pos[1])
			}
			if tt.pause {
				_, err := d.q.Pause(t.Context(), key, "alice", "customer called")
				require.NoError(t, err)
			}
			lease.Drain(true)
			next, kept := d.turns.Pass(t.Context(), lease, tt.done, time.Time{}, tt.ok)
			require.False(t, kept)
			require.Zero(t, next)
			_, ok := lease.Kept()
			require.False(t, ok)
			d.requireFree(t, key)
			if tt.wantWoken {
				require.Equal(t, []string{pos[1].Label}, d.f.wokenLabels())
			} else {
				require.Empty(t, d.f.wokenLabels())
			}
			if tt.wantDone {
				require.Equal(t, pos[0].Pos, d.done(t, key))
			} else {
				require.Equal(t, pos[0].Pos-1, d.done(t, key), "the turn stays")
			}
			if tt.pause {
				// Called back, the next holder parks again on the pause.
				_, _, err := d.turns.Take(t.Context(), key, "holder of "+pos[1].Label, pos[1], quick)
				var park *keyorder.ParkError
				require.ErrorAs(t, err, &park)
				require.NotNil(t, park.Err.Paused)
			}
		})
	}
}

// keep takes pos[0], parks pos[1] and passes pos[0]'s turn on with Drain:
// the lease is kept for pos[1].
func (d *drainFixture) keep(t *testing.T, key string, pos []keyorder.Turn) *keyorder.Lease {
	t.Helper()
	lease := d.take(t, key, pos[0])
	d.park(t, key, pos[1])
	lease.Drain(true)
	next, kept := d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.True(t, kept)
	require.Equal(t, pos[1], next)
	return lease
}

// A holder that does not go on with the position its lease was kept for
// releases it with Turns.Release, which calls that position's holder
// back, or with Turns.ReleaseKept, which leaves that to the caller.
func TestReleaseOfAKeptLease(t *testing.T) {
	t.Parallel()
	t.Run("Release calls the next back", func(t *testing.T) {
		t.Parallel()
		d := newDrainFixture(t, keyorder.Config{})
		const key = "SO-kept"
		pos := reserve(t, d.q, key, 2)
		lease := d.keep(t, key, pos)
		d.turns.Release(t.Context(), lease)
		require.Equal(t, []string{pos[1].Label}, d.f.wokenLabels())
		d.requireFree(t, key)
		require.Equal(t, pos[0].Pos, d.done(t, key), "the first's turn stays finished, the second's is next")
		require.Error(t, lease.Next(pos[1]), "released: it goes on with nothing")
		second := d.take(t, key, pos[1])
		d.turns.Pass(t.Context(), second, true, time.Time{}, true)
		require.Equal(t, pos[1].Pos, d.done(t, key))
	})
	t.Run("ReleaseKept calls nobody", func(t *testing.T) {
		t.Parallel()
		d := newDrainFixture(t, keyorder.Config{})
		const key = "SO-kept"
		pos := reserve(t, d.q, key, 2)
		lease := d.keep(t, key, pos)
		d.turns.ReleaseKept(t.Context(), lease)
		require.Empty(t, d.f.wokenLabels(), "the caller sends the next holder to its queue itself")
		d.requireFree(t, key)
		require.Equal(t, pos[0].Pos, d.done(t, key))
		second := d.take(t, key, pos[1])
		d.turns.Pass(t.Context(), second, true, time.Time{}, true)
	})
}

// Lease.Next moves a lease only onto the position it was kept for, once.
func TestLeaseNextRefusesATurnItWasNotKeptFor(t *testing.T) {
	t.Parallel()
	d := newDrainFixture(t, keyorder.Config{})
	const key = "SO-next"
	pos := reserve(t, d.q, key, 3)

	// Not kept: a lease whose Pass released, and one never passed.
	unkept := d.take(t, key, pos[0])
	require.Error(t, unkept.Next(pos[1]), "not kept")
	d.turns.Pass(t.Context(), unkept, false, time.Time{}, false)
	require.Error(t, unkept.Next(pos[1]), "released")

	lease := d.keep(t, key, pos)
	for _, turn := range []keyorder.Turn{
		{},
		pos[0],
		pos[2],
		{Pos: pos[1].Pos, Label: "m someone-else"},
		{Pos: pos[1].Pos},
	} {
		require.Error(t, lease.Next(turn), "%+v", turn)
		require.Equal(t, pos[0], lease.Turn(), "a refused Next moves nothing")
	}
	require.NoError(t, lease.Next(pos[1]))
	require.Error(t, lease.Next(pos[1]), "once")
	d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.Equal(t, pos[1].Pos, d.done(t, key))

	// Drain matters only in a turn: a lease without a position hands no
	// keep to a store's script.
	free, err := d.l.TryAcquire(t.Context(), "SO-free", "unordered")
	require.NoError(t, err)
	free.Drain(true)
	require.False(t, free.Handoff().Keep)
	require.NoError(t, free.Release(t.Context()))
}

// parkingReserve is the producer's acceptance, as far as the sequence
// goes: seq_reserve with park.
var parkingReserve = redis.NewScript(keyorder.ReserveLua + `
local pos, full, parked = seq_reserve(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1')
if not pos then return redis.error_reply(full) end
local p = 0
if parked then p = 1 end
return {pos, p}
`)

func reserveParking(t *testing.T, d *drainFixture, key, label, ref string, park bool) (keyorder.Turn, bool) {
	t.Helper()
	s, ttl, max, err := d.q.ReserveArgs(key, label, ref)
	require.NoError(t, err)
	arg := "0"
	if park {
		arg = "1"
	}
	res, err := parkingReserve.Run(t.Context(), d.db.Client, []string{s}, label, ttl, ref, max, arg).Slice()
	require.NoError(t, err)
	ps, _ := res[0].(string)
	p, err := strconv.ParseInt(ps, 10, 64)
	require.NoError(t, err)
	return keyorder.Turn{Pos: p, Label: label}, res[1] == int64(1)
}

// A reservation with park (the producer's acceptance) marks a position
// behind unfinished ones parked at once, so that the turn before it is
// kept for it; the first position of a sequence, one whose predecessors
// are all finished, one with a reference and one that Sequencer.Reserve
// hands out are not parked.
func TestReservationParksBehindTheUnfinished(t *testing.T) {
	t.Parallel()
	d := newDrainFixture(t, keyorder.Config{})
	const key = "SO-accept"
	first, parked := reserveParking(t, d, key, "m ev-0", "", true)
	require.False(t, parked, "the first of a sequence is next")
	second, parked := reserveParking(t, d, key, "m ev-1", "", true)
	require.True(t, parked, "behind the first, unfinished")
	_, parked = reserveParking(t, d, key, "c ev-x SO-from", "c:ev-x", true)
	require.False(t, parked, "a reservation by reference does not park")
	_, err := d.q.Finish(t.Context(), key, 0, "", "c:ev-x", "created")
	require.NoError(t, err)
	plain, err := d.q.Reserve(t.Context(), key, "m ev-3", "")
	require.NoError(t, err)
	third := keyorder.Turn{Pos: plain, Label: "m ev-3"}
	require.Equal(t, second.Pos+2, third.Pos)

	lease := d.take(t, key, first)
	lease.Drain(true)
	next, kept := d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.True(t, kept, "parked at its reservation: the lock is kept for it")
	require.Equal(t, second, next)
	require.NoError(t, lease.Next(second))
	lease.Drain(true)
	next, kept = d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.False(t, kept, "Sequencer.Reserve does not park: the lock is released")
	require.Zero(t, next)
	require.Empty(t, d.f.wokenLabels())
	d.requireFree(t, key)
	require.Equal(t, second.Pos+1, d.done(t, key), "the finished creation was passed")

	last := d.take(t, key, third)
	d.turns.Pass(t.Context(), last, true, time.Time{}, true)
	after, parked := reserveParking(t, d, key, "m ev-4", "", true)
	require.False(t, parked, "every earlier position is finished: next")
	lease = d.take(t, key, after)
	d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
}

// A lease's commit step rides in the round trip of the commit that may keep
// the lock, right after it: it reads what the commit wrote (the lock still
// the lease's when kept, gone when released; the sequence done up to the
// lease's position), and it is sent only while the lease drains.
func TestCommitStepRunsRightAfterTheCommit(t *testing.T) {
	t.Parallel()
	d := newDrainFixture(t, keyorder.Config{TTL: 5 * time.Second})
	type seen struct {
		owner, done *redis.StringCmd
		h           *keyorder.Handoff
	}
	step := func(into *[]seen) keyorder.CommitStep {
		return func(ctx context.Context, pipe redis.Pipeliner, h *keyorder.Handoff) {
			*into = append(*into, seen{owner: pipe.HGet(ctx, h.Key, "owner"), done: pipe.HGet(ctx, h.SeqKey, "d"), h: h})
		}
	}

	const key = "SO-step"
	pos := reserve(t, d.q, key, 3)
	lease := d.take(t, key, pos[0])
	d.park(t, key, pos[1])
	var kept []seen
	lease.SetCommitStep(step(&kept))
	lease.Drain(true)
	_, ok := d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.True(t, ok)
	require.Len(t, kept, 1, "sent once, with the commit")
	s := kept[0]
	require.Equal(t, pos[0].Pos, s.h.Pos)
	require.Equal(t, s.h.Owner, s.owner.Val(), "kept: still the lease's")
	require.Equal(t, strconv.FormatInt(pos[0].Pos, 10), s.done.Val(), "after the commit")

	// Not kept (the next holder is not parked): the step sees the lock gone.
	require.NoError(t, lease.Next(pos[1]))
	var released []seen
	lease.SetCommitStep(step(&released))
	lease.Drain(true)
	_, ok = d.turns.Pass(t.Context(), lease, true, time.Time{}, true)
	require.False(t, ok)
	require.Len(t, released, 1)
	require.ErrorIs(t, released[0].owner.Err(), redis.Nil, "released before the step ran")
	require.Equal(t, strconv.FormatInt(pos[1].Pos, 10), released[0].done.Val())

	// Without Drain no step is sent.
	third := d.take(t, key, pos[2])
	var none []seen
	third.SetCommitStep(step(&none))
	d.turns.Pass(t.Context(), third, true, time.Time{}, true)
	require.Empty(t, none)
}
