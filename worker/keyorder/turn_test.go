package keyorder_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// slow is a wait policy whose random delay is far longer than any test: a
// waiter that gets its turn in time was woken by a notice.
var slow = keyorder.Wait{MinDelay: time.Minute, MaxDelay: time.Minute, Deadline: 2 * time.Minute}

func reserve(t *testing.T, q *keyorder.Sequencer, key string, n int) []keyorder.Turn {
	t.Helper()
	turns := make([]keyorder.Turn, n)
	for i := range turns {
		label := "m ev-" + strconv.Itoa(i)
		pos, err := q.Reserve(t.Context(), key, label, "")
		require.NoError(t, err)
		turns[i] = keyorder.Turn{Pos: pos, Label: label}
		if i > 0 {
			require.Equal(t, turns[i-1].Pos+1, pos, "positions of one key are consecutive")
		}
	}
	return turns
}

// caller plays the worker's part around AcquireTurn: a parked position
// waits until the release that calls it hands its label back (wakes), then
// tries again.
type caller struct {
	mu    sync.Mutex
	woken map[string]chan struct{}
}

func newCaller() *caller { return &caller{woken: map[string]chan struct{}{}} }

func (c *caller) ch(label string) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.woken[label]
	if !ok {
		ch = make(chan struct{}, 1)
		c.woken[label] = ch
	}
	return ch
}

// wake brings back the holders of labels.
func (c *caller) wake(labels []string) {
	for _, l := range labels {
		select {
		case c.ch(l) <- struct{}{}:
		default:
		}
	}
}

// acquire takes turn's lock, parking as long as it has to. parked counts
// the times it was parked.
func (c *caller) acquire(ctx context.Context, l *keyorder.Locker, key, meta string, turn keyorder.Turn, w keyorder.Wait) (lease *keyorder.Lease, parked int, err error) {
	for {
		lease, err := l.AcquireTurn(ctx, key, meta, turn, w)
		var te *keyorder.TurnError
		if !errors.As(err, &te) {
			return lease, parked, err
		}
		if !te.Parked {
			return nil, parked, fmt.Errorf("a turn error that is not parked: %w", err)
		}
		parked++
		select {
		case <-c.ch(turn.Label):
		case <-ctx.Done():
			return nil, parked, ctx.Err()
		}
	}
}

// release releases lease, finished, and brings back the holders it calls.
func (c *caller) release(ctx context.Context, lease *keyorder.Lease) error {
	lease.Finish()
	err := lease.Release(ctx)
	c.wake(lease.Wake())
	return err
}

// The holders of positions enter strictly in position order, however the
// waiters arrive, across several Lockers (processes).
func TestTurnsEnterInPositionOrder(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	lockers := make([]*keyorder.Locker, 4)
	for i := range lockers {
		lockers[i] = newLockerOn(t, db.NewClient(t), db, keyorder.Config{})
	}
	q := lockers[0].Sequencer()
	turns := reserve(t, q, "SO-order", 30)
	c := newCaller()
	var mu sync.Mutex
	var entered []int64
	var wg sync.WaitGroup
	for _, i := range rand.Perm(len(turns)) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			lease, _, err := c.acquire(ctx, lockers[i%len(lockers)], "SO-order", "w"+strconv.Itoa(i), turns[i],
				keyorder.Wait{MinDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Deadline: time.Minute})
			require.NoError(t, err)
			require.Equal(t, keyorder.ModeTurn, lease.Mode())
			mu.Lock()
			entered = append(entered, lease.Turn().Pos)
			mu.Unlock()
			require.NoError(t, c.release(t.Context(), lease))
		})
	}
	wg.Wait()
	require.Len(t, entered, len(turns))
	for i, pos := range entered {
		require.Equal(t, turns[i].Pos, pos, "entry %d", i)
	}
	st, err := q.Status(t.Context(), "SO-order")
	require.NoError(t, err)
	require.Equal(t, turns[len(turns)-1].Pos, st.Done)
	require.Empty(t, st.Pending)
}

// A finished turn calls back the holder of the next position, and only it.
// A holder that is not next parks at once (it spends no worker slot
// waiting): the release that makes it next hands its label back. A waiter
// for the next position itself (its turn, the lock held by someone else)
// still waits in place, and the release's notice wakes it.
func TestFinishWakesOnlyTheNextInLine(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	turns := reserve(t, l.Sequencer(), "SO-wake", 4)
	other, err := l.Acquire(t.Context(), "SO-wake", "unordered", slow)
	require.NoError(t, err)

	type result struct {
		lease *keyorder.Lease
		err   error
	}
	waiting := make(chan string, 4)
	l2 := newLocker(t, db, keyorder.Config{OnWait: func(_, meta, _ string) { waiting <- meta }})
	acquire := func(meta string, turn keyorder.Turn) <-chan result {
		ch := make(chan result, 1)
		go func() {
			lease, err := l2.AcquireTurn(t.Context(), "SO-wake", meta, turn, slow)
			ch <- result{lease, err}
		}()
		require.Equal(t, meta, recvTimeout(t, waiting), "it found the lock held")
		return ch
	}
	notYet := func(ch <-chan result, what string) {
		t.Helper()
		select {
		case r := <-ch:
			t.Fatalf("%s ran out of turn: %v", what, r.err)
		default:
		}
	}
	parked := func(meta string, turn keyorder.Turn, head keyorder.Turn) {
		t.Helper()
		_, err := l.AcquireTurn(t.Context(), "SO-wake", meta, turn, slow)
		var te *keyorder.TurnError
		require.ErrorAs(t, err, &te, meta)
		require.True(t, te.Parked, "%s is not next: parked at once", meta)
		require.Equal(t, head.Pos, te.Head, meta)
		require.Equal(t, head.Label, te.Label, meta)
	}

	// The next position waits in place for the lock.
	first := acquire("first", turns[0])
	notYet(first, "the first")
	parked("second", turns[1], turns[0])
	parked("fourth", turns[3], turns[0])
	require.NoError(t, other.Release(t.Context()))
	require.Empty(t, other.Wake(), "an unordered release calls nobody back")
	r := recvTimeout(t, first)
	require.NoError(t, r.err)
	require.Equal(t, keyorder.ModeTurn, r.lease.Mode())
	require.Equal(t, 1, r.lease.Stats().WokenByNotice, "woken by the release's notice")

	r.lease.Finish()
	require.NoError(t, r.lease.Release(t.Context()))
	require.Equal(t, []string{turns[1].Label}, r.lease.Wake(), "the second is next now: called back, and only it")
	parked("third", turns[2], turns[1])
	second, err := l.AcquireTurn(t.Context(), "SO-wake", "second", turns[1], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, second.Mode())
	second.Finish()
	require.NoError(t, second.Release(t.Context()))
	require.Equal(t, []string{turns[2].Label}, second.Wake(), "the third is next now; the fourth stays parked")

	third, err := l.AcquireTurn(t.Context(), "SO-wake", "third", turns[2], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, third.Mode())
	parked("fourth", turns[3], turns[2])
	third.Finish()
	require.NoError(t, third.Release(t.Context()))
	require.Equal(t, []string{turns[3].Label}, third.Wake(), "the fourth is called back once it is next")
	fourth, err := l.AcquireTurn(t.Context(), "SO-wake", "fourth", turns[3], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, fourth.Mode())
	fourth.Finish()
	require.NoError(t, fourth.Release(t.Context()))
	require.Empty(t, fourth.Wake())
}

func recvTimeout[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting")
		panic("unreachable")
	}
}

// A turn that is released without Finish stays next: the position behind it
// keeps waiting, and learns when the holder runs again.
func TestUnfinishedTurnStaysAndSaysWhen(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	turns := reserve(t, l.Sequencer(), "SO-stay", 2)
	first, err := l.AcquireTurn(t.Context(), "SO-stay", "first", turns[0], slow)
	require.NoError(t, err)
	first.RetryAt(time.Now().Add(time.Hour))
	require.NoError(t, first.Release(t.Context()))

	_, err = l.AcquireTurn(t.Context(), "SO-stay", "second", turns[1], keyorder.Wait{Deadline: 10 * time.Second})
	var te *keyorder.TurnError
	require.ErrorAs(t, err, &te)
	require.ErrorIs(t, err, keyorder.ErrNotYourTurn)
	require.True(t, te.Parked, "it gave up waiting: parked, to be called back")
	require.Equal(t, turns[0].Pos, te.Head)
	require.Equal(t, turns[0].Label, te.Label)
	require.Greater(t, te.Retry, 50*time.Minute, "the head runs again in an hour")
	require.Less(t, te.Waited, 5*time.Second, "no point waiting past the deadline for it")

	again, err := l.AcquireTurn(t.Context(), "SO-stay", "first again", turns[0], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, again.Mode())
	again.Finish()
	require.NoError(t, again.Release(t.Context()))
	require.Equal(t, []string{turns[1].Label}, again.Wake(), "the parked second is called back")
	second, err := l.AcquireTurn(t.Context(), "SO-stay", "second", turns[1], slow)
	require.NoError(t, err)
	require.NoError(t, second.Release(t.Context()))
}

// A voided position is passed without waiting; a void ahead of the turn is
// remembered until the cursor gets there.
func TestVoidedPositionsArePassed(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	turns := reserve(t, q, "SO-void", 4)
	st0, err := q.Void(t.Context(), "SO-void", turns[1].Pos, turns[1].Label, "enqueue refused: duplicate")
	require.NoError(t, err)
	require.True(t, st0.Done)
	st0, err = q.Void(t.Context(), "SO-void", turns[2].Pos, "m someone-else", "wrong label")
	require.NoError(t, err)
	require.False(t, st0.Done, "a void names the label it reserved under")
	st0, err = q.Void(t.Context(), "SO-void", turns[0].Pos, turns[0].Label, "enqueue refused")
	require.NoError(t, err)
	require.True(t, st0.Done)

	lease, err := l.AcquireTurn(t.Context(), "SO-void", "third", turns[2], keyorder.Wait{Deadline: time.Second})
	require.NoError(t, err, "positions 1 and 2 were voided")
	require.Equal(t, keyorder.ModeTurn, lease.Mode())
	lease.Finish()
	require.NoError(t, lease.Release(t.Context()))

	st, err := q.Status(t.Context(), "SO-void")
	require.NoError(t, err)
	require.Equal(t, turns[2].Pos, st.Done)
	require.Len(t, st.Log, 2)
	require.Equal(t, turns[1].Pos, st.Log[0].Pos)
	require.Equal(t, "enqueue refused: duplicate", st.Log[0].Reason)
	_, err = l.AcquireTurn(t.Context(), "SO-void", "voided one", turns[1], keyorder.Wait{Deadline: time.Second})
	require.NoError(t, err, "a passed position is granted at once, unordered")
}

// A turn that finishes right before positions voided ahead passes them
// all, and calls back the parked holder of the position after them.
func TestFinishPassesAVoidAhead(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	turns := reserve(t, q, "SO-ahead", 4)
	first, err := l.AcquireTurn(t.Context(), "SO-ahead", "first", turns[0], slow)
	require.NoError(t, err)
	for _, v := range turns[1:3] {
		_, err = q.Void(t.Context(), "SO-ahead", v.Pos, v.Label, "enqueue refused")
		require.NoError(t, err)
	}
	_, err = l.AcquireTurn(t.Context(), "SO-ahead", "fourth", turns[3], slow)
	var te *keyorder.TurnError
	require.ErrorAs(t, err, &te)
	require.True(t, te.Parked)

	first.Finish()
	require.NoError(t, first.Release(t.Context()))
	require.Equal(t, []string{turns[3].Label}, first.Wake(), "the fourth is next once the voids are passed")
	st, err := q.Status(t.Context(), "SO-ahead")
	require.NoError(t, err)
	require.Equal(t, turns[2].Pos, st.Done, "the cursor passed the voided positions")
	third, err := l.AcquireTurn(t.Context(), "SO-ahead", "fourth", turns[3], keyorder.Wait{Deadline: time.Second})
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, third.Mode())
	third.Finish()
	require.NoError(t, third.Release(t.Context()))
}

// Skip settles only the head, and only while its record is the one the
// caller saw; the skip calls back the parked holder of the position that
// is next after it, and only that one.
func TestSkipOnlyTheHeadAsSeen(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	turns := reserve(t, q, "SO-skip", 3)
	var te *keyorder.TurnError
	for _, i := range []int{2, 1} {
		_, err := l.AcquireTurn(t.Context(), "SO-skip", "waiter", turns[i], keyorder.Wait{Deadline: time.Millisecond})
		require.ErrorAs(t, err, &te)
		require.Equal(t, turns[0].Pos, te.Head)
		require.True(t, te.Parked, "not next: parked at once")
	}

	st0, err := q.Skip(t.Context(), "SO-skip", turns[1].Pos, te.Record, "not the head")
	require.NoError(t, err)
	require.False(t, st0.Done)
	st0, err = q.Skip(t.Context(), "SO-skip", te.Head, "1 m other", "record changed")
	require.NoError(t, err)
	require.False(t, st0.Done)
	st0, err = q.Skip(t.Context(), "SO-skip", te.Head, te.Record, "its task does not exist")
	require.NoError(t, err)
	require.True(t, st0.Done)
	require.Equal(t, []string{turns[1].Label}, st0.Wake, "the parked second is next now; the third is not called yet")
	st0, err = q.Skip(t.Context(), "SO-skip", te.Head, te.Record, "twice")
	require.NoError(t, err)
	require.False(t, st0.Done, "already skipped")

	second, err := l.AcquireTurn(t.Context(), "SO-skip", "second", turns[1], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, second.Mode())
	second.Finish()
	require.NoError(t, second.Release(t.Context()))
	require.Equal(t, []string{turns[2].Label}, second.Wake(), "the parked third is called back once it is next")
}

// A holder behind the head parks at once, whatever its wait policy (it
// does not wait to the deadline, nor for StuckAfter), and its TurnError
// says how long ago the head was reserved, so that the caller can look at
// a head reserved long ago.
func TestStuckHeadReturnsEarly(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	turns := reserve(t, l.Sequencer(), "SO-stuck", 2)
	time.Sleep(150 * time.Millisecond) // the head is stuck
	start := time.Now()
	_, err := l.AcquireTurn(t.Context(), "SO-stuck", "second", turns[1],
		keyorder.Wait{MinDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Deadline: time.Minute, StuckAfter: 100 * time.Millisecond})
	var te *keyorder.TurnError
	require.ErrorAs(t, err, &te)
	require.True(t, te.Parked)
	require.Equal(t, turns[0].Pos, te.Head)
	require.GreaterOrEqual(t, te.Age, 100*time.Millisecond)
	require.Less(t, te.Waited, 5*time.Second, "parked at once")
	require.Less(t, time.Since(start), 30*time.Second, "it did not wait to the deadline")
}

func TestPositionsThatAreNotTheCallers(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	turns := reserve(t, l.Sequencer(), "SO-bad", 1)
	tests := []struct {
		name string
		turn keyorder.Turn
	}{
		{"never handed out", keyorder.Turn{Pos: turns[0].Pos + 5, Label: "m x"}},
		{"another label", keyorder.Turn{Pos: turns[0].Pos, Label: "m someone-else"}},
		{"no label", keyorder.Turn{Pos: turns[0].Pos}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := l.AcquireTurn(t.Context(), "SO-bad", "x", tt.turn, slow)
			require.ErrorIs(t, err, keyorder.ErrBadPosition)
		})
	}
}

// A position of a sequence that expired is granted at once; a new sequence
// starts above every position of the old one.
func TestExpiredSequenceStartsAbove(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	old := reserve(t, q, "SO-expired", 3)
	require.NoError(t, db.Client.Del(t.Context(), q.SeqKey("SO-expired")).Err())
	lease, err := l.AcquireTurn(t.Context(), "SO-expired", "late", old[2], slow)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModePassed, lease.Mode())
	require.NoError(t, lease.Release(t.Context()))
	pos, err := q.Reserve(t.Context(), "SO-expired", "m new", "")
	require.NoError(t, err)
	require.Greater(t, pos, old[2].Pos)
}

// Finish by reference settles a position ahead of its turn; the cursor
// passes it when it gets there.
func TestFinishAheadByReference(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	first := reserve(t, q, "SO-ref", 1)[0]
	created, err := q.Reserve(t.Context(), "SO-ref", "c ev-x SO-from", "c:ev-x")
	require.NoError(t, err)
	third := keyorder.Turn{Label: "m ev-3"}
	third.Pos, err = q.Reserve(t.Context(), "SO-ref", third.Label, "")
	require.NoError(t, err)
	st0, err := q.Finish(t.Context(), "SO-ref", 0, "", "c:ev-x", "created")
	require.NoError(t, err)
	require.True(t, st0.Done)
	st0, err = q.Finish(t.Context(), "SO-ref", 0, "", "c:ev-x", "created")
	require.NoError(t, err)
	require.False(t, st0.Done, "the reference is used up")
	st, err := q.Status(t.Context(), "SO-ref")
	require.NoError(t, err)
	require.Len(t, st.Pending, 3)
	require.Equal(t, created, st.Pending[1].Pos)
	require.Equal(t, "f created", st.Pending[1].Record)

	lease, err := l.AcquireTurn(t.Context(), "SO-ref", "first", first, slow)
	require.NoError(t, err)
	lease.Finish()
	require.NoError(t, lease.Release(t.Context()))
	lease, err = l.AcquireTurn(t.Context(), "SO-ref", "third", third, slow)
	require.NoError(t, err, "the finished creation is passed")
	require.Equal(t, keyorder.ModeTurn, lease.Mode())
	require.NoError(t, lease.Release(t.Context()))
}

// Reservations racing from many clients get distinct, consecutive positions.
func TestReservationsRaceToDistinctPositions(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for c := range 8 {
		q := space(t, db.NewClient(t), db.Prefix, keyorder.SeqConfig{})
		wg.Go(func() {
			for i := range 25 {
				pos, err := q.Reserve(t.Context(), "SO-race", fmt.Sprintf("m %d-%d", c, i), "")
				require.NoError(t, err)
				mu.Lock()
				require.False(t, seen[pos], "position %d handed out twice", pos)
				seen[pos] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var lo, hi int64 = 1 << 62, 0
	for pos := range seen {
		lo, hi = min(lo, pos), max(hi, pos)
	}
	require.Equal(t, int64(len(seen)-1), hi-lo, "no holes")
}

// A panicking holder releases its lock on the way out.
func TestPanicInDoReleases(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_ = l.Do(t.Context(), "SO-panic", "panicker", keyorder.Wait{}, func(context.Context, *keyorder.Lease) error {
			panic("boom")
		})
	}()
	lease, err := l.TryAcquire(t.Context(), "SO-panic", "next")
	require.NoError(t, err, "the panicking holder released the lock")
	require.NoError(t, lease.Release(t.Context()))
}

// A Redis user without the notice channel in its ACL still releases and
// passes turns (the refused PUBLISH never fails the script), a waiter
// in place (the holder of the next position, the lock held by another)
// polls its way in, and CheckNotices names the rule it needs.
func TestNoticesRefusedByACL(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "ACL users")
	srv := redistest.Dedicated(t)
	admin := redisClient(t, srv.URL())
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "worker", "on", ">secret-pass",
		"~*", "+@all", "resetchannels").Err())
	rdb := redisClient(t, "redis://worker:secret-pass@"+srv.Addr()+"/0")
	waiting := make(chan string, 4)
	l, err := keyorder.New(seqOn(t, rdb, keyorder.SeqConfig{}), keyorder.Config{
		Wait:   keyorder.Wait{MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		OnWait: func(_, meta, _ string) { waiting <- meta },
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	err = l.CheckNotices(t.Context())
	require.ErrorIs(t, err, keyorder.ErrNoNotices)
	require.ErrorContains(t, err, "&"+keyorder.DefaultPrefix+"released")

	turns := reserve(t, l.Sequencer(), "SO-acl", 2)
	other, err := l.Acquire(t.Context(), "SO-acl", "unordered", keyorder.Wait{})
	require.NoError(t, err)
	type result struct {
		lease *keyorder.Lease
		err   error
	}
	acquire := func(meta string, turn keyorder.Turn) <-chan result {
		ch := make(chan result, 1)
		go func() {
			lease, err := l.AcquireTurn(t.Context(), "SO-acl", meta, turn, keyorder.Wait{Deadline: 20 * time.Second})
			ch <- result{lease, err}
		}()
		require.Equal(t, meta, recvTimeout(t, waiting), "%s waits, marked for a notice", meta)
		return ch
	}
	first := acquire("first", turns[0])
	require.NoError(t, other.Release(t.Context()), "the refused notice does not fail the release")
	r := recvTimeout(t, first)
	require.NoError(t, r.err, "the waiter for the next position polls its way in")
	require.Equal(t, keyorder.ModeTurn, r.lease.Mode())

	// The first's turn passes on while a waiter marked the lock: the
	// release publishes, and is refused.
	unordered := acquire("unordered again", keyorder.Turn{})
	r.lease.Finish()
	require.NoError(t, r.lease.Release(t.Context()), "the refused notice does not fail the turn's release")
	u := recvTimeout(t, unordered)
	require.NoError(t, u.err, "the lock's waiter polls its way in")
	second := acquire("second", turns[1])
	require.NoError(t, u.lease.Release(t.Context()))
	r2 := recvTimeout(t, second)
	require.NoError(t, r2.err, "the turn was passed on: the second is next, and polls its way in")
	require.Equal(t, keyorder.ModeTurn, r2.lease.Mode())
	r2.lease.Finish()
	require.NoError(t, r2.lease.Release(t.Context()))
}

func redisClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Note logs an outcome after a turn without moving the sequence, and only
// while the sequence exists; Holder reads the lock's holder without its
// owner token.
func TestNoteAndHolder(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	q := l.Sequencer()
	turns := reserve(t, q, "SO-note", 2)

	h, err := q.Holder(t.Context(), "SO-note")
	require.NoError(t, err)
	require.Equal(t, keyorder.Holder{}, h, "free")

	lease, err := l.AcquireTurn(t.Context(), "SO-note", "order:modify ev-0", turns[0], keyorder.Wait{Deadline: time.Second})
	require.NoError(t, err)
	h, err = q.Holder(t.Context(), "SO-note")
	require.NoError(t, err)
	require.True(t, h.Held)
	require.Equal(t, "order:modify ev-0", h.Meta)
	require.Equal(t, lease.Fence(), h.Fence)
	require.Greater(t, h.TTL, time.Duration(0))
	require.LessOrEqual(t, h.TTL, l.TTL())
	lease.Finish()
	require.NoError(t, lease.Release(t.Context()))

	require.NoError(t, q.Note(t.Context(), "SO-note", turns[0].Pos, turns[0].Label, "archived: order closed"))
	st, err := q.Status(t.Context(), "SO-note")
	require.NoError(t, err)
	require.Equal(t, turns[0].Pos, st.Done, "a note moves nothing")
	require.Len(t, st.Pending, 1)
	require.Len(t, st.Log, 1)
	e := st.Log[0]
	require.Equal(t, keyorder.Settled{Pos: turns[0].Pos, At: e.At, Kind: "note", Label: turns[0].Label, Reason: "archived: order closed"}, e)
	require.False(t, e.Skipped())
	require.WithinDuration(t, time.Now(), e.At, time.Minute)

	require.ErrorIs(t, q.Note(t.Context(), "SO-note", -1, "m x", "bad position"), keyorder.ErrBadPosition)
	require.NoError(t, db.Client.PExpire(t.Context(), q.SeqKey("SO-note"), time.Minute).Err())
	require.NoError(t, q.Note(t.Context(), "SO-note", 0, "m x", "archived: no position"))
	st, err = q.Status(t.Context(), "SO-note")
	require.NoError(t, err)
	require.Len(t, st.Log, 2)
	require.Equal(t, int64(0), st.Log[1].Pos)
	require.Equal(t, "archived: no position", st.Log[1].Reason)
	require.Greater(t, st.TTL, time.Hour, "a note keeps the sequence for the retention")
	require.NoError(t, q.Note(t.Context(), "SO-none", 7, "m x", "no sequence"))
	st, err = q.Status(t.Context(), "SO-none")
	require.NoError(t, err)
	require.False(t, st.Exists, "a note creates no sequence")
}
