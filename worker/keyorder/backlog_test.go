package keyorder_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// TestBacklogCountsWhatWaitsBehindTheHeads floods one key with 200 tasks
// through a Client, on one Redis: one key with 199 positions behind its
// head. A second key's one task adds no backlog, its second one adds one.
// Finishing the flood's head in its turn (the release's pass-on), voiding
// a position behind it (counted until the cursor passes it) and skipping
// the head each keep the index exact.
func TestBacklogCountsWhatWaitsBehindTheHeads(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	seq := space(t, db.Client, db.Prefix, keyorder.SeqConfig{})
	c, err := keyorder.NewClient(seq, keyorder.ClientConfig{})
	require.NoError(t, err)
	queue := "q" + db.Prefix[:len(db.Prefix)-1]
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(queue, true) })
	enqueue := func(key string) keyorder.Enqueued {
		t.Helper()
		e, err := c.Enqueue(ctx, key, asynq.NewTask("t", []byte(`{}`)), asynq.Queue(queue))
		require.NoError(t, err)
		return e
	}
	backlog := func(want keyorder.Backlog, msg string) {
		t.Helper()
		got, err := seq.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got, msg)
	}
	backlog(keyorder.Backlog{}, "nothing accepted")
	var flood []keyorder.Enqueued
	for range 200 {
		flood = append(flood, enqueue("HOT"))
	}
	backlog(keyorder.Backlog{Keys: 1, Positions: 199, Deepest: 199}, "a flood of one key")
	enqueue("QUIET")
	backlog(keyorder.Backlog{Keys: 1, Positions: 199, Deepest: 199}, "a key's head alone is no backlog")
	enqueue("QUIET")
	backlog(keyorder.Backlog{Keys: 2, Positions: 200, Deepest: 199}, "a second key with one behind its head")

	locker, err := keyorder.New(seq, keyorder.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close() })
	head := flood[0]
	require.NoError(t, locker.DoTurn(ctx, "HOT", "t", keyorder.Turn{Pos: head.Pos, Label: keyorder.Label(head.Queue, head.TaskID)},
		keyorder.Wait{Deadline: time.Second}, func(_ context.Context, l *keyorder.Lease) error { l.Finish(); return nil }))
	backlog(keyorder.Backlog{Keys: 2, Positions: 199, Deepest: 198}, "the head's turn passed on")

	third := flood[2]
	st, err := seq.Void(ctx, "HOT", third.Pos, keyorder.Label(third.Queue, third.TaskID), "test")
	require.NoError(t, err)
	require.True(t, st.Done)
	backlog(keyorder.Backlog{Keys: 2, Positions: 199, Deepest: 198}, "a void behind the head waits for the cursor")

	status, err := seq.Status(ctx, "HOT")
	require.NoError(t, err)
	require.Equal(t, flood[1].Pos, status.Pending[0].Pos)
	st, err = seq.Skip(ctx, "HOT", flood[1].Pos, status.Pending[0].Record, "test")
	require.NoError(t, err)
	require.True(t, st.Done)
	backlog(keyorder.Backlog{Keys: 2, Positions: 197, Deepest: 196}, "a skip of the head passes it and the void after it")
}

// TestBacklogEmptiesAsARunnerDrains floods a key and lets a Runner run it
// all, the holder draining the parked tasks in its holds: each pass-on
// that keeps the lock counts too, and the index ends empty.
func TestBacklogEmptiesAsARunnerDrains(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "a database of the test's own (asynq's default queue)")
	ctx := t.Context()
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	const n = 50
	for i := range n {
		_, err := c.Enqueue(ctx, "HOT", asynq.NewTask("t", fmt.Appendf(nil, `{"key":"HOT","n":%d}`, i)))
		require.NoError(t, err)
	}
	seq := space(t, db.Client, db.Prefix, keyorder.SeqConfig{})
	got, err := seq.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, keyorder.Backlog{Keys: 1, Positions: n - 1, Deepest: n - 1}, got)

	done := make(chan struct{}, n)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	startServer(t, db.Client, r, 4, func(context.Context, *asynq.Task) error {
		done <- struct{}{}
		return nil
	})
	for i := range n {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d tasks ran", i, n)
		}
	}
	// The last run's pass-on happens after its handler returned: wait for
	// the cursor to pass it.
	require.Eventually(t, func() bool {
		st, err := seq.Status(ctx, "HOT")
		return err == nil && st.Waiting == 0
	}, 10*time.Second, 5*time.Millisecond)
	got, err = seq.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, keyorder.Backlog{}, got, "every position passed on")
}
