package keyorder_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The steps of a task's run (TakeTask, EndTask, RetryDelay) decide what
// asynq gets, for the Runner and for a program that builds its own
// handler on Turns. These tests drive them directly, on a real Redis.

const backoff = 7 * time.Second // the failures' RetryDelay in these tests

func newTaskTurns(t *testing.T) (*keyorder.Turns, *keyorder.Locker) {
	t.Helper()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	turns, err := keyorder.NewTurns(l, f, keyorder.TurnsConfig{
		BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 20 * time.Millisecond,
		RetryDelay: func(int, error, *asynq.Task) time.Duration { return backoff },
	})
	require.NoError(t, err)
	return turns, l
}

// run takes the turn of tr, ends it with the handler's error err, and
// returns what asynq gets and whether the turn passed on.
func endWith(t *testing.T, turns *keyorder.Turns, tr *keyorder.TaskRun, err error) (error, bool) {
	t.Helper()
	lease, _, terr := turns.TakeTask(t.Context(), tr, quick)
	require.NoError(t, terr)
	rctx := lease.Keep(t.Context())
	return turns.EndTask(t.Context(), rctx, lease, tr, err)
}

func taskRun(key string, turn keyorder.Turn, retried, maxRetry int) *keyorder.TaskRun {
	return &keyorder.TaskRun{Key: key, Turn: turn, Label: turn.Label, Meta: "test", Task: asynq.NewTask("t", nil),
		Retried: retried, MaxRetry: maxRetry}
}

func TestEndTaskDecides(t *testing.T) {
	t.Parallel()
	failed := errors.New("upstream said no")
	for _, tt := range []struct {
		name              string
		err               error
		retried, max      int
		final, skip, gone bool
		delay             time.Duration // RetryDelay's answer; 0: none checked
		note              string        // the sequence log's note; "": none
	}{
		{name: "success", final: true, max: 3},
		{name: "failure within its budget backs off, the turn stays", err: failed, retried: 0, max: 3, delay: backoff},
		{name: "failure at its budget is archived", err: failed, retried: 2, max: 3, final: true, skip: true, note: "archived: failed 3 times, out of its failure budget of 2 retries"},
		{name: "MaxRetry 0: the first failure is archived", err: failed, max: 0, final: true, skip: true, note: "archived: failed 1 times, out of its failure budget of 0 retries"},
		{name: "a rejection is archived at once", err: errors.Join(failed, asynq.SkipRetry), max: 3, final: true, skip: true, note: "archived: upstream said no"},
		{name: "a revoke passes the turn on", err: asynq.RevokeTask, max: 3, final: true, gone: true, note: "revoked: "},
		{name: "a lost lease is no failure", err: keyorder.ErrLost, max: 3},
		{name: "a stale fence is no failure", err: keyorder.ErrStaleFence, retried: 2, max: 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			turns, l := newTaskTurns(t)
			key := "K-" + strings.ReplaceAll(tt.name, " ", "-")
			pos := reserve(t, l.Sequencer(), key, 2)
			tr := taskRun(key, pos[0], tt.retried, tt.max)
			err, final := endWith(t, turns, tr, tt.err)
			require.Equal(t, tt.final, final, "final: %v", err)
			require.Equal(t, tt.skip, errors.Is(err, asynq.SkipRetry), "archived: %v", err)
			require.Equal(t, tt.skip && tt.err != nil && !errors.Is(tt.err, asynq.SkipRetry), errors.Is(err, keyorder.ErrOutOfBudget), "out of budget: %v", err)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err, "the handler's error stays in the chain")
			}
			if tt.delay > 0 {
				require.Equal(t, tt.delay, turns.RetryDelay(tt.retried, err, tr.Task))
			}
			if tt.err != nil && !keyorder.IsFailure(tt.err) {
				d := turns.RetryDelay(tt.retried, err, tr.Task)
				require.True(t, d >= 10*time.Millisecond && d <= 20*time.Millisecond, "a busy delay, got %v", d)
			}
			st, serr := l.Sequencer().Status(t.Context(), key)
			require.NoError(t, serr)
			if final {
				require.Equal(t, pos[0].Pos, st.Done, "the turn passed on")
			} else {
				require.Less(t, st.Done, pos[0].Pos, "the turn stays")
			}
			var notes []string
			for _, e := range st.Log {
				if e.Kind == "note" {
					notes = append(notes, e.Reason)
				}
			}
			if tt.note == "" {
				require.Empty(t, notes)
			} else {
				require.Len(t, notes, 1)
				require.True(t, strings.HasPrefix(notes[0], tt.note), "note %q, want it to start with %q", notes[0], tt.note)
			}
		})
	}
}

// A run whose context asynq ended (its deadline, a shutdown) keeps its
// turn whatever it returned: asynq decides without reading the error.
func TestEndTaskOfAnEndedRunKeepsTheTurn(t *testing.T) {
	t.Parallel()
	turns, l := newTaskTurns(t)
	pos := reserve(t, l.Sequencer(), "K-ended", 1)
	tr := taskRun("K-ended", pos[0], 5, 3) // past its budget too
	ctx, cancel := context.WithCancel(t.Context())
	lease, _, err := turns.TakeTask(ctx, tr, quick)
	require.NoError(t, err)
	cancel()
	err, final := turns.EndTask(ctx, lease.Keep(ctx), lease, tr, context.Canceled)
	require.False(t, final)
	require.NotErrorIs(t, err, asynq.SkipRetry)
	st, err := l.Sequencer().Status(t.Context(), "K-ended")
	require.NoError(t, err)
	require.Less(t, st.Done, pos[0].Pos, "the turn stays")
}

// A position behind an unfinished head parks: TakeTask's error spends no
// retry, and RetryDelay gives the park's delay plus a busy delay. A wait
// that runs out is no failure either.
func TestTakeTaskWaits(t *testing.T) {
	t.Parallel()
	turns, l := newTaskTurns(t)
	pos := reserve(t, l.Sequencer(), "K-wait", 4)
	head, _, err := turns.TakeTask(t.Context(), taskRun("K-wait", pos[0], 0, 3), quick)
	require.NoError(t, err)

	tr := taskRun("K-wait", pos[3], 0, 3) // more than two behind: parks at once
	_, _, err = turns.TakeTask(t.Context(), tr, quick)
	var park *keyorder.ParkError
	require.ErrorAs(t, err, &park)
	require.ErrorIs(t, err, keyorder.ErrNotYourTurn)
	require.Equal(t, park.Err.Error(), err.Error(), "the text asynq records is the wait's")
	require.False(t, keyorder.IsFailure(err))
	d := turns.RetryDelay(0, err, tr.Task)
	require.True(t, d >= park.Delay+10*time.Millisecond && d <= park.Delay+20*time.Millisecond, "park %v, delay %v", park.Delay, d)

	short := keyorder.Wait{MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, Deadline: 20 * time.Millisecond}
	free := &keyorder.TaskRun{Key: "K-wait", Meta: "free", Task: tr.Task, MaxRetry: 3} // no position: waits for the lock
	_, _, err = turns.TakeTask(t.Context(), free, short)
	require.ErrorIs(t, err, keyorder.ErrBusy)
	require.False(t, keyorder.IsFailure(err))
	d = turns.RetryDelay(0, err, tr.Task)
	require.True(t, d >= 10*time.Millisecond && d <= 20*time.Millisecond, "a busy delay, got %v", d)

	_, final := turns.EndTask(t.Context(), head.Keep(t.Context()), head, taskRun("K-wait", pos[0], 0, 3), nil)
	require.True(t, final)
}

// A position that the key's sequence never handed out to the task is
// archived, with a note in the sequence's log.
func TestTakeTaskArchivesABadPosition(t *testing.T) {
	t.Parallel()
	turns, l := newTaskTurns(t)
	pos := reserve(t, l.Sequencer(), "K-bad", 1)
	bad := keyorder.Turn{Pos: pos[0].Pos, Label: "not its label"}
	_, _, err := turns.TakeTask(t.Context(), taskRun("K-bad", bad, 0, 3), quick)
	require.ErrorIs(t, err, keyorder.ErrBadPosition)
	require.ErrorIs(t, err, asynq.SkipRetry)
	st, err := l.Sequencer().Status(t.Context(), "K-bad")
	require.NoError(t, err)
	require.NotEmpty(t, st.Log)
	require.Equal(t, "note", st.Log[len(st.Log)-1].Kind)
}

// A task past its budget already (runs that outlived their deadline,
// counted by asynq) is archived in its turn without running; one without
// a position, or within its budget, runs.
func TestTaskRunOutOfBudget(t *testing.T) {
	t.Parallel()
	turn := keyorder.Turn{Pos: 1, Label: "l"}
	require.NoError(t, taskRun("k", turn, 2, 3).OutOfBudget())
	require.NoError(t, taskRun("k", keyorder.Turn{}, 9, 3).OutOfBudget())
	err := taskRun("k", turn, 3, 3).OutOfBudget()
	require.ErrorIs(t, err, keyorder.ErrOutOfBudget)
	require.ErrorIs(t, err, asynq.SkipRetry)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
}
