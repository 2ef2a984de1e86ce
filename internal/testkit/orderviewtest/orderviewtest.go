// Package orderviewtest builds, with a real worker on a real Redis, an order
// in the states that the order status view (internal/orderview) describes,
// for the tests of the view and of the three places that serve it (the
// intake, the command line and the dashboard). It is imported by _test.go
// files only.
package orderviewtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

// Scenario is an order left, with no worker running, in this state: its
// first change applied (its task completed), its second archived in its
// turn (out of its failure budget), its third, now next in line, failed once
// and waiting in asynq's retry set for its next attempt, and its fourth
// parked in the retry set until its turn comes. The fields are the tasks'
// IDs (their event IDs) and positions.
type Scenario struct {
	OrderNo                            string
	Applied, Archived, Retried, Parked string
	Seq                                map[string]int64
}

// The error the scenario's failing changes meet.
const (
	// FailRetried is the error of the change that is retried.
	FailRetried = "upstream said 503"
	// FailArchived is the error of the change that is archived.
	FailArchived = "upstream said 500"
)

// Build seeds order no (address "1 Old Rd") in the Redis order store under
// prefix (KEY_PREFIX), enqueues its four changes with a producer, runs a
// worker on rdb until the order is in the state of [Scenario], and shuts the
// worker down. The tasks keep their states afterwards: nothing moves them
// without a worker. The test must delete the asynq queues it leaves.
func Build(t testing.TB, rdb redis.UniversalClient, prefix, no string) Scenario {
	t.Helper()
	ctx := context.Background()
	s := Scenario{OrderNo: no, Applied: no + "-applied", Archived: no + "-archived", Retried: no + "-retried",
		Parked: no + "-parked", Seq: map[string]int64{}}
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "1 Old Rd", Items: []orders.Item{{SKU: "TEA", Qty: 2}}}))

	failing := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error {
		switch ev {
		case s.Retried:
			return errors.New(FailRetried)
		case s.Archived:
			return errors.New(FailArchived)
		}
		return nil
	})
	done := make(chan worker.Done, 1000)
	w, err := worker.New(rdb, store, worker.Config{
		Kinds: failing,
		// The archived change uses up its position: the kinds go on past
		// a failure rather than halt the order.
		Failures:                 map[string]worker.FailurePolicy{"modify": worker.Continue, "exchange": worker.Continue},
		KeyPrefix:                prefix,
		LockTTL:                  5 * time.Second,
		Logger:                   zaptest.NewLogger(t),
		TaskCheckInterval:        50 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		OnDone: func(d worker.Done) {
			select {
			case done <- d:
			default:
			}
		},
	})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			w.Shutdown()
		}
	}
	defer stop()

	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	defer p.Close()
	for _, c := range []struct {
		id     string
		budget int
	}{{s.Applied, 5}, {s.Archived, 0}, {s.Retried, 5}, {s.Parked, 5}} {
		r, err := p.EnqueueModify(ctx, no, tasks.Changes{Address: new("2 New Rd, " + c.id)},
			producer.WithEventID(c.id), producer.WithMaxRetry(c.budget))
		require.NoError(t, err)
		s.Seq[c.id] = r.Seq
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)

	// Wait for the applied and the archived changes, the retried one's
	// failure, and a park of the fourth that waits for the third's next
	// attempt (which comes 15 s or more later). The producer parks the
	// fourth at acceptance, behind the unfinished third (only an order's
	// head waits in the queue): it is in its state then, and does not run
	// before the park ends (producer.Config.ParkFor, 30s), by when the
	// third may have failed again. (On a Cluster the producer parks none:
	// the worker parks it when it runs.)
	want := map[string]bool{s.Applied: false, s.Archived: false, s.Retried: false, s.Parked: false}
	n := 0
	if info, err := insp.GetTaskInfo(tasks.QueueModify, s.Parked); err == nil && info.State == asynq.TaskStateRetry && info.Retried == 0 {
		want[s.Parked] = true
		n++
	}
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for n < len(want) {
		select {
		case d := <-done:
			var te *keyorder.TurnError
			ok := false
			switch d.EventID {
			case s.Applied:
				ok = d.Outcome == worker.OutcomeOK
			case s.Archived:
				ok = d.Outcome == worker.OutcomeRejected
			case s.Retried:
				ok = d.Outcome == worker.OutcomeError
			case s.Parked:
				ok = d.Outcome == worker.OutcomeWaiting && errors.As(d.Err, &te) && te.Retry > 0
			}
			if ok && !want[d.EventID] {
				want[d.EventID] = true
				n++
			}
		case <-timeout.C:
			t.Fatalf("order %s did not reach the scenario's state within 60s: %v", no, want)
		}
	}
	stop()

	for id, state := range map[string]asynq.TaskState{s.Applied: asynq.TaskStateCompleted, s.Archived: asynq.TaskStateArchived,
		s.Retried: asynq.TaskStateRetry, s.Parked: asynq.TaskStateRetry} {
		info, err := insp.GetTaskInfo(tasks.QueueModify, id)
		require.NoError(t, err)
		require.Equal(t, state, info.State, "task %s", id)
	}
	return s
}
