package main

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
	"github.com/orderworker/orderworker/worker/workertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// MemStore keeps the store contract.
func TestMemStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) orders.Store { return NewMemStore() })
}

// A worker around MemStore applies a change that the producer enqueued,
// on a redis-server of the test's own (miniredis, in process, only on a
// machine without redis-server, and never under CI).
func TestWorkerAppliesAChange(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(t)})
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

// redisAddr starts a redis-server on a free port for the test, stopped
// when it ends. Without redis-server it fails under CI and falls back to
// miniredis elsewhere.
func redisAddr(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server is not installed, and CI must test on a real one: %v", err)
		}
		t.Logf("redis-server is not installed: falling back to miniredis")
		return miniredis.RunT(t).Addr()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + port
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, c.Ping(t.Context()).Err())
	}, 10*time.Second, 20*time.Millisecond, "redis-server answers")
	return addr
}

// One task runs through the worker's handlers against MemStore with the
// worker's rules (fence, position, outcome), without asynq or Redis.
func TestMemStoreWithWorkertest(t *testing.T) {
	t.Parallel()
	store := NewMemStore()
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Street", Items: []orders.Item{{SKU: "TEA", Qty: 1}}}))
	w, err := workertest.New(store, workertest.Config{Kinds: worker.KindsFor(store)})
	require.NoError(t, err)

	addr := "2 New Road"
	res := w.Work(t.Context(), tasks.ModifyPayload{EventID: "crm-1", OrderNo: "SO1", Seq: 1, Changes: tasks.Changes{Address: &addr}})
	require.NoError(t, res.Err)
	require.Equal(t, worker.ModeTurn, res.Mode)
	o, err := store.Get(t.Context(), "SO1")
	require.NoError(t, err)
	require.Equal(t, addr, o.Address)

	res = w.Work(t.Context(), tasks.ExchangePayload{EventID: "crm-2", OrderNo: "SO1", Seq: 2, Items: []tasks.Item{{SKU: "COFFEE", Qty: 2}}, NewOrderNo: "SO2"})
	require.NoError(t, res.Err)
	res = w.Work(t.Context(), tasks.ModifyPayload{EventID: "crm-3", OrderNo: "SO1", Seq: 3, Changes: tasks.Changes{Address: &addr}})
	require.Equal(t, worker.OutcomeRejected, res.Outcome, "a change of an exchanged order is archived")
	require.ErrorIs(t, res.Err, orders.ErrClosed)
	require.ErrorContains(t, res.Err, "SO2", "naming the replacement")
}
