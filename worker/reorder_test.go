package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// The review's N5, as the intake's Redis user: it holds an order by hand,
// four changes park behind the hold, it re-scores them newest first and
// deletes the order's sequence. The changes then run without order, newest
// first; the store records the position of each one it applies, so an
// older change never applies over a newer one: it is refused as passed and
// archived with that reason. Before, every one applied, and the order
// ended as its oldest change said.
func TestIntakeUserCannotReorderByDeletingTheSequence(t *testing.T) {
	e := newEnv(t)
	const no = "SO31"
	e.seed(no)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	intake := e.db.AsUser(t, rules...)
	ctx := t.Context()
	seqKey := e.db.Prefix + "lock:{" + no + "}:seq"
	require.NoError(t, intake.Client.HSet(ctx, seqKey, "h", `{"by":"x","reason":"hand-written","at":"1"}`).Err())

	var seen []worker.Done
	done := make(chan worker.Done, 64)
	e.startWorker(worker.Config{OnDone: func(d worker.Done) { done <- d }}, nil)
	p, err := producer.New(intake.Client, producer.Config{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ids := []string{"rv-1", "rv-2", "rv-3", "rv-4"}
	for i, id := range ids {
		_, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: new(fmt.Sprintf("change %d", i+1))}, producer.WithEventID(id))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		for _, id := range ids {
			info, err := e.insp.GetTaskInfo(tasks.QueueModify, id)
			if err != nil || info.State != asynq.TaskStateRetry {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the changes did not park behind the hold")

	retry := "asynq:{" + tasks.QueueModify + "}:retry"
	now := time.Now().Unix()
	for i, id := range ids {
		require.NoError(t, intake.Client.ZAddXX(ctx, retry, redis.Z{Score: float64(now + int64(8-2*i)), Member: id}).Err())
	}
	require.NoError(t, intake.Client.Del(ctx, seqKey).Err())

	ended := map[string]string{}
	deadline := time.After(60 * time.Second)
	for len(ended) < len(ids) {
		select {
		case d := <-done:
			seen = append(seen, d)
			if d.Outcome == worker.OutcomeOK || d.Outcome == worker.OutcomeRejected {
				ended[d.EventID] = d.Outcome
			}
		case <-deadline:
			t.Fatalf("the changes did not all end: %v (runs %+v)", ended, seen)
		}
	}
	require.Equal(t, worker.OutcomeOK, ended["rv-4"], "the newest change, first to run, applies")
	h, err := orders.AllHistory(ctx, e.store, no)
	require.NoError(t, err)
	var last int64
	var applied []string
	for _, x := range h {
		if x.Type != orders.TypeModify {
			continue
		}
		applied = append(applied, x.EventID)
		require.Greater(t, x.Seq, last, "an older change applied over a newer one: %v", applied)
		last = x.Seq
	}
	require.Equal(t, []string{"rv-4"}, applied, "the older ones are refused as passed")
	o, err := e.store.Get(ctx, no)
	require.NoError(t, err)
	require.Equal(t, "change 4", o.Remark, "the order ends as its newest change said")
	for _, id := range ids[:3] {
		info, err := e.insp.GetTaskInfo(tasks.QueueModify, id)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateArchived, info.State, id)
		require.Contains(t, info.LastErr, "not after", id)
	}
}
