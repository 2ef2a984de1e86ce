package worker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// logStore is a store whose only write, log, records what ran; its
// reads are not used.
type logStore struct {
	orders.Store
	ran []string
}

func (s *logStore) log(what string) { s.ran = append(s.ran, what) }

// logKind is a modify entry whose handler logs "write <event>".
func logKind() worker.Kind {
	return worker.NewKind(worker.Wait{}, func(_ context.Context, s *logStore, m tasks.ModifyPayload) error {
		s.log("write " + m.EventID)
		return nil
	})
}

type ctxKey struct{}

func TestKindBeforeRunsTheHookFirst(t *testing.T) {
	t.Parallel()
	k := logKind()
	s := &logStore{}
	hooked := k.Before(func(ctx context.Context, p tasks.Payload) error {
		require.Equal(t, "in ctx", ctx.Value(ctxKey{}), "the hook gets the handler's ctx")
		s.log("hook " + p.Kind().Type + " " + p.Header().EventID)
		return nil
	})
	ctx := context.WithValue(t.Context(), ctxKey{}, "in ctx")
	require.NoError(t, hooked.Apply(ctx, s, tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1"}))
	require.Equal(t, []string{"hook order:modify e1", "write e1"}, s.ran)

	require.Equal(t, k.Kind, hooked.Kind)
	require.Equal(t, k.Wait, hooked.Wait)
	require.Equal(t, k.Write(), hooked.Write())
	s.ran = nil
	require.NoError(t, k.Apply(ctx, s, tasks.ModifyPayload{EventID: "e2", OrderNo: "SO1"}))
	require.Equal(t, []string{"write e2"}, s.ran, "the entry Before was called on runs no hook")
}

func TestKindBeforeVetoStopsTheWrite(t *testing.T) {
	t.Parallel()
	veto := errors.New("veto")
	s := &logStore{}
	hooked := logKind().Before(func(context.Context, tasks.Payload) error { return veto })
	require.ErrorIs(t, hooked.Apply(t.Context(), s, tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1"}), veto)
	require.Empty(t, s.ran)
}

func TestKindBeforeStacks(t *testing.T) {
	t.Parallel()
	s := &logStore{}
	hook := func(name string) func(context.Context, tasks.Payload) error {
		return func(context.Context, tasks.Payload) error { s.log(name); return nil }
	}
	k := logKind().Before(hook("a")).Before(nil).Before(hook("b"))
	require.NoError(t, k.Apply(t.Context(), s, tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1"}))
	require.Equal(t, []string{"b", "a", "write e1"}, s.ran)
}

// The hook runs only where the handler would: not for a store without the
// kind's write, nor for a payload of another type.
func TestKindBeforeRunsOnlyBeforeTheHandler(t *testing.T) {
	t.Parallel()
	ran := false
	k := logKind().Before(func(context.Context, tasks.Payload) error { ran = true; return nil })
	require.ErrorIs(t, k.Apply(t.Context(), struct{ orders.Store }{}, tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1"}), worker.ErrNoWrite)
	require.ErrorIs(t, k.Apply(t.Context(), &logStore{}, tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1"}), asynq.SkipRetry)
	require.False(t, ran)

	var zero worker.Kind
	require.Equal(t, zero, zero.Before(func(context.Context, tasks.Payload) error { return nil }), "an entry not made by NewKind is left as it is")
}
