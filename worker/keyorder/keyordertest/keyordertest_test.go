package keyordertest_test

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
)

func TestRunGivesTheHandlerItsRunWithDefaults(t *testing.T) {
	t.Parallel()
	var seen keyorder.Run
	h := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		run, ok := keyorder.RunFrom(ctx)
		require.True(t, ok)
		seen = run
		run.Commit.FenceKey()
		run.Commit.Handoff()
		return nil
	})
	run, err := keyordertest.Run(t.Context(), h, asynq.NewTask("t", nil), keyorder.Run{})
	require.NoError(t, err)
	require.Equal(t, run, seen)
	require.Equal(t, "key", run.Key)
	require.Equal(t, int64(1), run.Pos)
	require.Equal(t, int64(1), run.Fence)
	require.Equal(t, keyorder.ModeTurn, run.Mode)
	require.True(t, run.Record, "a turn records its position")
	fk, ho := run.Commit.(*keyordertest.Commit).Calls()
	require.Equal(t, [2]int64{1, 1}, [2]int64{fk, ho})
	require.Empty(t, run.Commit.FenceKey())
	require.Nil(t, run.Commit.Handoff())
}

func TestRunKeepsWhatItIsGiven(t *testing.T) {
	t.Parallel()
	given := keyorder.Run{Key: "K", Pos: 9, Fence: 4, Mode: keyorder.ModePassed, Held: 2, Commit: &keyordertest.Commit{}}
	run, err := keyordertest.Run(t.Context(), asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }),
		asynq.NewTask("t", nil), given)
	require.NoError(t, err)
	require.Equal(t, given, run, "a passed position only checks (Record false)")
}

func TestContextIsReadByRunFrom(t *testing.T) {
	t.Parallel()
	_, ok := keyorder.RunFrom(t.Context())
	require.False(t, ok)
	run, ok := keyorder.RunFrom(keyordertest.Context(t.Context(), keyorder.Run{Key: "K"}))
	require.True(t, ok)
	require.Equal(t, keyorder.Run{Key: "K"}, run)
}
