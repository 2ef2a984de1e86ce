package storehook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/workertest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// Every kind of the worker's table runs the hook before its write, against
// the Redis store, with the task's type, event and order; the hook sees
// the order as it was before the write and inside the write's fence, and
// a veto stops the write. Nothing here names a kind: a kind added to the
// table is covered with no change.
func TestKindsRunTheHookBeforeEveryKindsWrite(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	veto := errors.New("veto")
	for _, k := range worker.Kinds() {
		t.Run(k.Kind.Name, func(t *testing.T) {
			t.Parallel()
			no := "SO-" + k.Kind.Name
			require.NoError(t, store.Put(t.Context(), orders.Order{No: no, Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
			type seen struct {
				what    string
				version int64
				fenced  bool
			}
			var got []seen
			hook := func(ctx context.Context, typ, ev, no string) error {
				o, err := store.Get(ctx, no)
				require.NoError(t, err)
				w, ok := orders.WriteFrom(ctx)
				got = append(got, seen{typ + " " + ev + " " + no, o.Version, ok && w.Fence > 0})
				if ev == "ev-veto" {
					return veto
				}
				return nil
			}
			w, err := workertest.New(store, workertest.Config{Kinds: storehook.Kinds(nil, hook)})
			require.NoError(t, err)
			run := func(ev string) error {
				p, err := k.Kind.ExamplePayload(ev, no)
				require.NoError(t, err)
				return w.Work(t.Context(), p).Err
			}
			require.ErrorIs(t, run("ev-veto"), veto, "the hook's error is the run's")
			require.NoError(t, run("ev-1"))
			require.Equal(t, []seen{
				{k.Kind.Type + " ev-veto " + no, 1, true},
				{k.Kind.Type + " ev-1 " + no, 1, true},
			}, got, "the hook ran before each write, inside its fence, and the vetoed one wrote nothing")
			h, err := orders.AllHistory(t.Context(), store, no)
			require.NoError(t, err)
			require.Len(t, h, 2, "the put and ev-1's write")
			require.Equal(t, "ev-1", h[1].EventID)
		})
	}
}

func TestKindsKeepsTheEntries(t *testing.T) {
	t.Parallel()
	defaults := worker.Kinds()
	hooked := storehook.Kinds(nil, storehook.Delay(0))
	require.Len(t, hooked, len(defaults), "nil stands for worker.Kinds()")
	for i, k := range hooked {
		require.Equal(t, defaults[i].Kind, k.Kind)
		require.Equal(t, defaults[i].Wait, k.Wait)
		require.Equal(t, defaults[i].Write(), k.Write())
	}
	require.Empty(t, storehook.Kinds([]worker.Kind{}, storehook.Delay(0)))
	require.NotNil(t, storehook.Kinds([]worker.Kind{}, storehook.Delay(0)), "an empty list stays empty, not the default")
	require.Len(t, storehook.Kinds(defaults[:1], nil), 1)
}

func TestKindsRunsANilHookAsNone(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	w, err := workertest.New(store, workertest.Config{Kinds: storehook.Kinds(nil, nil)})
	require.NoError(t, err)
	r := "x"
	require.NoError(t, w.Work(t.Context(), tasks.ModifyPayload{EventID: "ev-1", OrderNo: "SO1", Changes: tasks.Changes{Remark: &r}}).Err)
}

func TestDelayEndsWithContext(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutdown")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	require.ErrorIs(t, storehook.Delay(time.Hour)(ctx, tasks.TypeModify, "e", "SO1"), cause)
	require.NoError(t, storehook.Delay(time.Millisecond)(t.Context(), tasks.TypeModify, "e", "SO1"))
	require.NoError(t, storehook.Delay(0)(ctx, tasks.TypeModify, "e", "SO1"), "no delay, no wait")
}
