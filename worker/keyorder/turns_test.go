package keyorder_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// fakeTasks is the queue's side of a Turns in these tests: it answers
// HeadFate from fate and records what Wake was handed.
type fakeTasks struct {
	mu    sync.Mutex
	fate  func(te *keyorder.TurnError) (string, time.Duration, error)
	asked []int64
	woken []string
}

func (f *fakeTasks) HeadFate(_ context.Context, _ string, te *keyorder.TurnError) (string, time.Duration, error) {
	f.mu.Lock()
	f.asked = append(f.asked, te.Head)
	f.mu.Unlock()
	return f.fate(te)
}

func (f *fakeTasks) Wake(_ context.Context, _ string, labels []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.woken = append(f.woken, labels...)
	return nil
}

func (f *fakeTasks) wokenLabels() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.woken...)
}

// quick waits a few milliseconds between tries and gives up after a while.
var quick = keyorder.Wait{MinDelay: 2 * time.Millisecond, MaxDelay: 5 * time.Millisecond, Deadline: 10 * time.Second}

func newTurns(t *testing.T, l *keyorder.Locker, f *fakeTasks, gapWait time.Duration) *keyorder.Turns {
	t.Helper()
	turns, err := keyorder.NewTurns(l, f, keyorder.TurnsConfig{GapWait: gapWait})
	require.NoError(t, err)
	return turns
}

// A head whose holder will never come is skipped once it has waited the
// gap wait, with HeadFate's reason in the sequence's log, and the position
// behind it takes its turn.
func TestTurnsSkipAHeadThatWillNotCome(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "its task is gone", 0, nil }}
	turns := newTurns(t, l, f, 50*time.Millisecond)
	pos := reserve(t, l.Sequencer(), "SO-gap", 2)

	lease, taken, err := turns.Take(t.Context(), "SO-gap", "second", pos[1], quick)
	var park *keyorder.ParkError
	for errors.As(err, &park) { // parked until the head has waited GapWait
		lease, taken, err = turns.Take(t.Context(), "SO-gap", "second", pos[1], quick)
	}
	require.NoError(t, err)
	require.Equal(t, 1, taken.Skipped)
	require.Equal(t, keyorder.ModeTurn, lease.Mode())
	turns.Pass(t.Context(), lease, true, time.Time{}, true)

	st, err := l.Sequencer().Status(t.Context(), "SO-gap")
	require.NoError(t, err)
	require.Equal(t, pos[1].Pos, st.Done)
	require.NotEmpty(t, st.Log)
	require.Equal(t, "its task is gone", st.Log[0].Reason)
	require.True(t, st.Log[0].Skipped())
}

// A head whose holder exists and runs later parks the positions behind it
// for that long, at most the gap wait; a head backing off after a failure
// parks them until it runs again.
func TestTurnsParkBehindAHeadThatRunsLater(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", time.Hour, nil }}
	const gapWait = 50 * time.Millisecond
	turns := newTurns(t, l, f, gapWait)
	pos := reserve(t, l.Sequencer(), "SO-later", 2)

	var park *keyorder.ParkError
	for {
		_, _, err := turns.Take(t.Context(), "SO-later", "second", pos[1], quick)
		require.ErrorAs(t, err, &park)
		require.ErrorIs(t, err, keyorder.ErrNotYourTurn)
		require.LessOrEqual(t, park.Delay, gapWait)
		f.mu.Lock()
		asked := len(f.asked)
		f.mu.Unlock()
		if asked > 0 {
			break
		}
	}
	require.Equal(t, gapWait, park.Delay, "an hour away is capped at the gap wait")

	// The head takes its turn, fails, and backs off for a second: the
	// position behind parks until then (capped at the gap wait), without
	// asking HeadFate.
	head, _, err := turns.Take(t.Context(), "SO-later", "first", pos[0], quick)
	require.NoError(t, err)
	turns.Pass(t.Context(), head, false, time.Now().Add(time.Second), false)
	turns2 := newTurns(t, l, f, time.Minute)
	short := quick
	short.Deadline = 100 * time.Millisecond // the head runs again only after it
	_, _, err = turns2.Take(t.Context(), "SO-later", "second", pos[1], short)
	require.ErrorAs(t, err, &park)
	require.Greater(t, park.Delay, 500*time.Millisecond)
	require.LessOrEqual(t, park.Delay, time.Second)
}

// Passing a finished turn on hands the label of the parked holder of the
// next position, and only it, to Wake; a turn that is not finished stays.
func TestTurnsPassWakesTheParked(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	turns := newTurns(t, l, f, time.Minute)
	pos := reserve(t, l.Sequencer(), "SO-pass", 4)

	head, _, err := turns.Take(t.Context(), "SO-pass", "first", pos[0], quick)
	require.NoError(t, err)
	// The second and the fourth are parked at once (not next).
	for _, i := range []int{1, 3} {
		_, _, err = turns.Take(t.Context(), "SO-pass", "waiter", pos[i], quick)
		var park *keyorder.ParkError
		require.ErrorAs(t, err, &park)
		require.True(t, park.Err.Parked)
		require.Equal(t, pos[0].Pos, park.Err.Head)
	}

	next, kept := turns.Pass(t.Context(), head, false, time.Time{}, false)
	require.False(t, kept)
	require.Zero(t, next)
	require.Empty(t, f.wokenLabels(), "an unfinished turn stays")
	head, _, err = turns.Take(t.Context(), "SO-pass", "first", pos[0], quick)
	require.NoError(t, err)
	_, kept = turns.Pass(t.Context(), head, true, time.Time{}, true)
	require.False(t, kept, "no drain: released")
	require.Equal(t, []string{pos[1].Label}, f.wokenLabels(), "the second is called back once it is next, and only it")
	second, _, err := turns.Take(t.Context(), "SO-pass", "second", pos[1], quick)
	require.NoError(t, err)
	turns.Pass(t.Context(), second, true, time.Time{}, true)
	require.Equal(t, []string{pos[1].Label}, f.wokenLabels(), "the third is not parked: nobody to call")
	third, _, err := turns.Take(t.Context(), "SO-pass", "third", pos[2], quick)
	require.NoError(t, err)
	turns.Pass(t.Context(), third, true, time.Time{}, true)
	require.Equal(t, []string{pos[1].Label, pos[3].Label}, f.wokenLabels(), "the fourth is called back once it is next")
	fourth, _, err := turns.Take(t.Context(), "SO-pass", "fourth", pos[3], quick)
	require.NoError(t, err)
	require.Equal(t, keyorder.ModeTurn, fourth.Mode())
	turns.Pass(t.Context(), fourth, true, time.Time{}, true)
}

// A holder that ends without its turn uses its position up; a creation
// that did not happen is found by NotCreated with its reason, one that did
// happen is not.
func TestTurnsAbandonAndCreation(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	turns := newTurns(t, l, f, time.Minute)
	q := l.Sequencer()
	pos := reserve(t, q, "SO-ab", 2)

	turns.Abandon(t.Context(), "SO-ab", pos[0], "archived: misplaced")
	lease, _, err := turns.Take(t.Context(), "SO-ab", "second", pos[1], quick)
	require.NoError(t, err, "the abandoned position was passed")
	turns.Pass(t.Context(), lease, true, time.Time{}, true)

	for _, tt := range []struct {
		name, created, creator string
		err                    error
		want                   string
	}{
		{"created", "SO-new1", "ex-1", nil, ""},
		{"rejected", "SO-new2", "ex-2", errors.New("order SO-x is closed"), "exchange ex-2 of SO-x was rejected: order SO-x is closed"},
	} {
		_, err := q.Reserve(t.Context(), tt.created, "x ex", keyorder.CreationRef(tt.creator))
		require.NoError(t, err, tt.name)
		turns.Created(t.Context(), tt.created, tt.creator, "exchange "+tt.creator+" of SO-x", tt.err)
		why, err := turns.NotCreated(t.Context(), tt.created, nil)
		require.NoError(t, err, tt.name)
		require.Equal(t, tt.want, why, tt.name)
		st, err := q.Status(t.Context(), tt.created)
		require.NoError(t, err, tt.name)
		require.Equal(t, st.Last, st.Done, "%s: the creation's position is finished", tt.name)
	}
}

// A creation's position that was skipped is found by NotCreated, with the
// skip's reason, when the caller says its label is a creation's; a
// skipped position is found by Skipped, with its reason, and no other.
func TestNotCreatedAndSkippedNameTheSkip(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	turns := newTurns(t, l, &fakeTasks{}, time.Minute)
	q := l.Sequencer()
	ctx := t.Context()
	pos, err := q.Reserve(ctx, "SO-sk", "create ex-1", keyorder.CreationRef("ex-1"))
	require.NoError(t, err)
	later := reserve(t, q, "SO-sk", 1)[0]
	st, err := q.Status(ctx, "SO-sk")
	require.NoError(t, err)
	set, err := q.Skip(ctx, "SO-sk", pos, st.Pending[0].Record, "skipped by dave: not wanted")
	require.NoError(t, err)
	require.True(t, set.Done)

	isCreation := func(label string) bool { return strings.HasPrefix(label, "create ") }
	why, err := turns.NotCreated(ctx, "SO-sk", isCreation)
	require.NoError(t, err)
	require.Contains(t, why, fmt.Sprintf("position %d (create ex-1) was skipped at ", pos))
	require.True(t, strings.HasSuffix(why, ": skipped by dave: not wanted"), why)
	why, err = turns.NotCreated(ctx, "SO-sk", nil)
	require.NoError(t, err)
	require.Empty(t, why, "a skip whose label is no creation's says nothing of a creation")

	why, err = turns.Skipped(ctx, "SO-sk", pos, "create ex-1")
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(why, ": skipped by dave: not wanted"), why)
	for _, tt := range []struct {
		name  string
		pos   int64
		label string
	}{
		{"another position", later.Pos, later.Label},
		{"another label", pos, "m other"},
	} {
		why, err := turns.Skipped(ctx, "SO-sk", tt.pos, tt.label)
		require.NoError(t, err, tt.name)
		require.Empty(t, why, tt.name)
	}
}

func TestNewTurnsRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	_, err := keyorder.NewTurns(nil, &fakeTasks{}, keyorder.TurnsConfig{})
	require.Error(t, err)
	_, err = keyorder.NewTurns(l, nil, keyorder.TurnsConfig{})
	require.Error(t, err)
	_, err = keyorder.NewTurns(l, &fakeTasks{}, keyorder.TurnsConfig{GapWait: -1})
	require.Error(t, err)
	_, err = keyorder.NewTurns(l, &fakeTasks{}, keyorder.TurnsConfig{BusyRetryMin: time.Second, BusyRetryMax: time.Millisecond})
	require.ErrorContains(t, err, "BusyRetryMin")
	_, err = keyorder.NewTurns(l, &fakeTasks{}, keyorder.TurnsConfig{BusyRetryMin: 3 * time.Second})
	require.NoError(t, err, "a min above the default max raises the max")
}
