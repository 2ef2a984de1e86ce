package storehook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestBeforeWrite(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	base, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, base.Put(t.Context(), orders.Order{No: "SO1", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	veto := errors.New("veto")
	var seen []string
	s := storehook.BeforeWrite(base, func(ctx context.Context, typ, ev, no string) error {
		seen = append(seen, typ+" "+ev+" "+no)
		if ev == "ev-veto" {
			return veto
		}
		return nil
	})
	ctx := orders.WithWrite(t.Context(), orders.Write{Fence: 1})
	r := "x"
	_, err = s.Modify(ctx, "ev-1", "SO1", orders.Changes{Remark: &r})
	require.NoError(t, err)
	_, err = s.Modify(ctx, "ev-veto", "SO1", orders.Changes{Remark: &r})
	require.ErrorIs(t, err, veto)
	_, err = s.Exchange(ctx, "ev-2", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "B", Qty: 1}}, NewOrderNo: "SO2"})
	require.NoError(t, err)
	require.Equal(t, []string{"order:modify ev-1 SO1", "order:modify ev-veto SO1", "order:exchange ev-2 SO1"}, seen)
	o, err := s.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Equal(t, int64(3), o.Version, "put, ev-1, the exchange; not the vetoed write")
}

func TestDelayEndsWithContext(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutdown")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	require.ErrorIs(t, storehook.Delay(time.Hour)(ctx, orders.TypeModify, "e", "SO1"), cause)
	require.NoError(t, storehook.Delay(time.Millisecond)(t.Context(), orders.TypeModify, "e", "SO1"))
	require.NoError(t, storehook.Delay(0)(ctx, orders.TypeModify, "e", "SO1"), "no delay, no wait")
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// Every kind of the worker's table writes through a hooked store with its
// hook: a write added to the contract without its method here fails.
func TestBeforeWriteCoversEveryKind(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	base, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	veto := errors.New("veto")
	for _, k := range worker.Kinds() {
		t.Run(k.Kind.Name, func(t *testing.T) {
			var seen []string
			s := storehook.BeforeWrite(base, func(_ context.Context, typ, ev, no string) error {
				seen = append(seen, typ+" "+ev+" "+no)
				return veto
			})
			require.NoError(t, k.Check(s), "the hooked store implements the kind's write, %s", k.Write())
			p, err := k.Kind.Decode([]byte(`{"event_id":"ev-1","order_no":"SO1"}`))
			require.NoError(t, err)
			ctx := orders.WithWrite(t.Context(), orders.Write{Fence: 1})
			require.ErrorIs(t, k.Apply(ctx, s, p), veto, "the hook ran before the write, and stopped it")
			require.Equal(t, []string{k.Kind.Type + " ev-1 SO1"}, seen)
		})
	}
}
