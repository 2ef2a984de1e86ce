package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// A handler that stalls past its lease (as in a long GC pause) has its
// context cancelled with keyorder.ErrLost, and the write it makes when it wakes
// up — late, under its old fence, after the next holder took the lock but
// before that holder wrote — is refused by the store. The task then runs
// again under a fresh lock and is applied exactly once.
func TestStalledHolderCannotWriteLate(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-P")
	entered := make(chan context.Context, 1)
	resume := make(chan struct{})
	var (
		mu      sync.Mutex
		lateErr error
		first   = true
	)
	stall := func(inner orders.Store) orders.Store {
		s := inner.(*backend)
		return &hookStore{backend: s, modify: func(ctx context.Context, ev, no string, c orders.Changes) (orders.Result, error) {
			mu.Lock()
			stalled := first && ev == "ev-A"
			first = first && !stalled
			mu.Unlock()
			if !stalled {
				return s.Modify(ctx, ev, no, c)
			}
			entered <- ctx
			<-resume // the stall: nothing here looks at ctx
			// Its write goes out regardless of the cancelled context, as a
			// request already on the wire would.
			r, err := s.Modify(context.WithoutCancel(ctx), ev, no, c)
			mu.Lock()
			lateErr = err
			mu.Unlock()
			return r, err
		}}
	}
	e.startWorker(worker.Config{BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 20 * time.Millisecond}, stall)
	remarkA, remarkB := "from A", "from B"
	e.modify("SO-P", "ev-A", tasks.Changes{Remark: &remarkA})
	var ctxA context.Context
	select {
	case ctxA = <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("handler never started")
	}

	// A's lease runs out while it stalls, and B takes the order. A wakes up
	// and writes before B has written anything: the store still refuses A,
	// because B's lock handed out a newer fence.
	require.NoError(t, e.db.Client.Del(t.Context(), e.db.Prefix+"lock:{SO-P}").Err())
	space, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.db.Prefix + "lock:"})
	require.NoError(t, err)
	other, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	defer other.Close()
	leaseB, err := other.Acquire(t.Context(), "SO-P", "B")
	require.NoError(t, err)

	select {
	case <-ctxA.Done():
		require.ErrorIs(t, context.Cause(ctxA), keyorder.ErrLost)
	case <-time.After(30 * time.Second):
		t.Fatal("the stalled handler's context was not cancelled")
	}
	close(resume)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lateErr != nil
	}, 30*time.Second, time.Millisecond, "A's late write never came")

	wB := orders.Write{Fence: leaseB.Fence(), Worker: "B", Commit: leaseB}
	_, err = e.store.Modify(orders.WithWrite(t.Context(), wB), "ev-B", "SO-P", orders.Changes{Remark: &remarkB})
	require.NoError(t, err)
	require.NoError(t, leaseB.Release(t.Context()))
	e.drain(30 * time.Second)

	mu.Lock()
	require.ErrorIs(t, lateErr, orders.ErrStaleFence, "the late write must be refused")
	mu.Unlock()
	info := e.taskInfo(tasks.QueueModify, "ev-A")
	require.Equal(t, asynq.TaskStateCompleted, info.State)
	hist, err := orders.AllHistory(t.Context(), e.store, "SO-P")
	require.NoError(t, err)
	var events []string
	for _, h := range hist[1:] {
		events = append(events, h.EventID)
	}
	require.Equal(t, []string{"ev-B", "ev-A"}, events, "B once, then A once under a newer fence")
	require.Greater(t, hist[2].Fence, hist[1].Fence)
	o, err := e.store.Get(t.Context(), "SO-P")
	require.NoError(t, err)
	require.Equal(t, remarkA, o.Remark)
}

// Redis stops answering for a while (SIGSTOP) with tasks in flight and
// queued. The worker keeps running, recovers once Redis answers again, and
// every task is applied exactly once.
func TestRedisStallRecovers(t *testing.T) {
	srv := redistest.Dedicated(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	store, err := redisstore.New(c, redisstore.Config{})
	require.NoError(t, err)
	orderNos := []string{"SO-R1", "SO-R2", "SO-R3"}
	for _, no := range orderNos {
		require.NoError(t, store.Put(t.Context(), orders.Order{No: no, Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	slow := &hookStore{backend: store, modify: func(ctx context.Context, ev, no string, ch orders.Changes) (orders.Result, error) {
		select { // a little work inside the lock, so tasks are in flight
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return orders.Result{}, context.Cause(ctx)
		}
		return store.Modify(ctx, ev, no, ch)
	}}
	w, err := worker.New(c, slow, worker.Config{LockTTL: 10 * time.Second, Concurrency: 6, Logger: zaptest.NewLogger(t),
		DelayedTaskCheckInterval: 100 * time.Millisecond, BusyRetryMin: 10 * time.Millisecond, BusyRetryMax: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)

	cli := asynq.NewClientFromRedisClient(c)
	const n = 60
	for i := range n {
		r := "r"
		task, err := tasks.NewTask(tasks.ModifyPayload{EventID: eventID(i), OrderNo: orderNos[i%3], Changes: tasks.Changes{Remark: &r}})
		require.NoError(t, err)
		_, err = cli.Enqueue(task, asynq.Queue(tasks.QueueModify), asynq.TaskID(eventID(i)), asynq.Retention(time.Hour))
		require.NoError(t, err)
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	require.Eventually(t, func() bool {
		info, err := insp.GetQueueInfo(tasks.QueueModify)
		return err == nil && info.Completed >= 5
	}, 30*time.Second, 5*time.Millisecond)

	require.NoError(t, srv.Pause())
	time.Sleep(2 * time.Second) // the outage itself, not a synchronization
	require.NoError(t, srv.Resume())
	require.NoError(t, w.Ping(), "the worker is still running")

	require.Eventually(t, func() bool {
		info, err := insp.GetQueueInfo(tasks.QueueModify)
		return err == nil && info.Completed == n
	}, 90*time.Second, 20*time.Millisecond, "not every task completed")
	applied := map[string]int{}
	for _, no := range orderNos {
		hist, err := orders.AllHistory(t.Context(), store, no)
		require.NoError(t, err)
		for _, h := range hist[1:] {
			applied[h.EventID]++
		}
	}
	require.Len(t, applied, n)
	for ev, k := range applied {
		require.Equal(t, 1, k, "event %s applied %d times", ev, k)
	}
}

func eventID(i int) string { return "ev-" + string(rune('a'+i/26)) + string(rune('a'+i%26)) }
