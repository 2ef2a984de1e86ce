package main

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// MemStore keeps the store contract.
func TestMemStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) orders.Store { return NewMemStore() })
}

// A worker around MemStore applies a change that the producer enqueued.
// Redis is miniredis, in process: the test only proves that a program of
// another module builds and runs a worker around its own store.
func TestWorkerAppliesAChange(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	store := NewMemStore()
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))

	done := make(chan worker.Done, 10)
	w, err := startWorker(rdb, store, worker.Config{
		TaskCheckInterval: 50 * time.Millisecond,
		OnDone:            func(d worker.Done) { done <- d },
	})
	require.NoError(t, err)
	t.Cleanup(w.Shutdown)

	p, err := producer.New(rdb, producer.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	addr := "2 New Road"
	_, err = p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Address: &addr}, producer.WithEventID("crm-1"))
	require.NoError(t, err)

	select {
	case d := <-done:
		require.NoError(t, d.Err)
		require.Equal(t, worker.OutcomeOK, d.Outcome)
		require.Equal(t, worker.ModeTurn, d.Mode, "applied in its order's turn")
	case <-time.After(30 * time.Second):
		t.Fatal("the change was not applied")
	}
	o, err := store.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Equal(t, addr, o.Address)
	h, err := orders.AllHistory(t.Context(), store, "SO1")
	require.NoError(t, err)
	require.Equal(t, "crm-1", h[len(h)-1].EventID)
	require.Positive(t, h[len(h)-1].Fence, "written under the order's lock")
}
