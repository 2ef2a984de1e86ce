package producer_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

func sequencer(t *testing.T, e env) *keyorder.Sequencer {
	t.Helper()
	q, err := keyorder.NewSequencer(e.db.Client, keyorder.SeqConfig{Prefix: e.p.Config().KeyPrefix + "lock:"})
	require.NoError(t, err)
	return q
}

// Each accepted change takes the next position of its order; orders have
// sequences of their own.
func TestPositionsFollowAcceptance(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	var last int64
	for i := range 5 {
		res, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new(strconv.Itoa(i))})
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, last+1, res.Seq)
		}
		last = res.Seq
	}
	other, err := e.p.EnqueueModify(t.Context(), "SO2", tasks.Changes{Remark: new("x")})
	require.NoError(t, err)
	require.Positive(t, other.Seq)

	st, err := sequencer(t, e).Status(t.Context(), "SO1")
	require.NoError(t, err)
	require.Len(t, st.Pending, 5)
	require.Equal(t, last, st.Last)
	for _, p := range st.Pending {
		typ, _, _, ok := tasks.Kinds().ParseLabel(p.Label)
		require.True(t, ok, p.Label)
		require.Equal(t, tasks.TypeModify, typ)
	}
}

// Several producer processes racing on one order: every accepted change
// has its own position, and each producer's changes, sent one after
// another, have increasing positions.
func TestPositionsAcrossProducers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	const producers, each = 6, 20
	var mu sync.Mutex
	seen := map[int64]string{}
	var wg sync.WaitGroup
	for c := range producers {
		p, err := producer.New(e.db.NewClient(t), producer.Config{})
		require.NoError(t, err)
		wg.Go(func() {
			var prev int64
			for i := range each {
				res, err := p.EnqueueModify(t.Context(), "SO-hot", tasks.Changes{Remark: new(strconv.Itoa(i))},
					producer.WithEventID("p"+strconv.Itoa(c)+"-"+strconv.Itoa(i)))
				require.NoError(t, err)
				require.Greater(t, res.Seq, prev, "a later change of one sender is later")
				prev = res.Seq
				mu.Lock()
				require.Empty(t, seen[res.Seq], "position %d given twice", res.Seq)
				seen[res.Seq] = res.EventID
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, producers*each)
}

// An event ID names one change: used again for another type, another order
// or another payload, it is refused when enqueued, and nothing runs.
func TestEventIDUniqueAcrossTypes(t *testing.T) {
	t.Parallel()
	items := []tasks.Item{{SKU: "A", Qty: 1}}
	tests := []struct {
		name  string
		again func(e env) (producer.Result, error)
		other producer.Claim
	}{
		{"exchange of the same order", func(e env) (producer.Result, error) {
			return e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("crm-1"))
		}, producer.Claim{Type: tasks.TypeModify, OrderNo: "SO1"}},
		{"exchange of another order", func(e env) (producer.Result, error) {
			return e.p.EnqueueExchange(t.Context(), "SO2", items, producer.WithEventID("crm-1"))
		}, producer.Claim{Type: tasks.TypeModify, OrderNo: "SO1"}},
		{"modify of another order", func(e env) (producer.Result, error) {
			return e.p.EnqueueModify(t.Context(), "SO2", tasks.Changes{Remark: new("r")}, producer.WithEventID("crm-1"))
		}, producer.Claim{Type: tasks.TypeModify, OrderNo: "SO1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, producer.Config{})
			first, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("crm-1"))
			require.NoError(t, err)
			res, err := tt.again(e)
			require.ErrorIs(t, err, producer.ErrDuplicate)
			require.ErrorIs(t, err, producer.ErrPayloadMismatch)
			var dup *producer.DuplicateError
			require.ErrorAs(t, err, &dup)
			require.Equal(t, &tt.other, dup.Other)
			assert.Equal(t, "order_modify", dup.Queue, "the existing task's queue")
			assert.Equal(t, first.Seq, res.Seq, "the result describes the existing task")
			_, err = e.insp.GetTaskInfo("order_exchange", "crm-1")
			require.Error(t, err, "nothing was enqueued")
			n, err := e.insp.GetQueueInfo("order_modify")
			require.NoError(t, err)
			require.Equal(t, 1, n.Size)
		})
	}
}

// A refused enqueue gives its position up at once: the worker will not wait
// for it.
func TestRefusedEnqueueVoidsItsPositions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	items := []tasks.Item{{SKU: "A", Qty: 1}}
	first, err := e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("x-1"), producer.WithNewOrderNo("SO2"))
	require.NoError(t, err)
	_, err = e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("x-1"), producer.WithNewOrderNo("SO2"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("x-1"))
	require.ErrorIs(t, err, producer.ErrPayloadMismatch)

	q := sequencer(t, e)
	st, err := q.Status(t.Context(), "SO1")
	require.NoError(t, err)
	require.Len(t, st.Pending, 3)
	assert.Equal(t, first.Seq, st.Pending[0].Pos)
	assert.Equal(t, tasks.PositionLabel(tasks.TypeExchange, "x-1"), st.Pending[0].Label)
	for _, p := range st.Pending[1:] {
		assert.Regexp(t, `^v `, p.Record, "voided")
	}
	require.Len(t, st.Log, 2)

	b, err := q.Status(t.Context(), "SO2")
	require.NoError(t, err)
	require.Len(t, b.Pending, 2, "the replacement's creation, and the refused duplicate's, voided")
	assert.Equal(t, tasks.CreationLabel("x-1", "SO1"), b.Pending[0].Label)
	assert.Regexp(t, `^v `, b.Pending[1].Record)
}

// Redis forgetting its scripts (a restart, SCRIPT FLUSH) costs a reload,
// not a failed enqueue.
func TestEnqueueAfterScriptFlush(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("a")})
	require.NoError(t, err)
	require.NoError(t, e.db.Client.ScriptFlush(t.Context()).Err())
	res, err := e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}})
	require.NoError(t, err)
	require.Positive(t, res.Seq)
}

// An exchange repeated at once (answered as a duplicate, or refused for a
// key reused with other items) reserves a creation position on the
// replacement too, and voids it: the creation the worker settles when the
// exchange is applied (by keyorder.CreationRef) is still the first
// exchange's, so that the replacement's next changes go at once rather
// than after the gap wait.
func TestRepeatedExchangeKeepsItsCreation(t *testing.T) {
	t.Parallel()
	items := []tasks.Item{{SKU: "A", Qty: 1}}
	tests := []struct {
		name  string
		again []tasks.Item
	}{
		{"duplicate", items},
		{"key reused", []tasks.Item{{SKU: "B", Qty: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, producer.Config{})
			_, err := e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("x-1"), producer.WithNewOrderNo("SO2"))
			require.NoError(t, err)
			for range 2 {
				_, err = e.p.EnqueueExchange(t.Context(), "SO1", tt.again, producer.WithEventID("x-1"), producer.WithNewOrderNo("SO2"))
				require.ErrorIs(t, err, producer.ErrDuplicate)
			}
			q := sequencer(t, e)
			before, err := q.Status(t.Context(), "SO2")
			require.NoError(t, err)
			require.Len(t, before.Pending, 3, "the creation, and the repeats', voided")

			// What the worker does once the exchange is applied.
			r, err := keyorder.NewRunner(q, keyorder.RunnerConfig{Key: func(*asynq.Task) (string, error) { return "", nil }})
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			r.Created(t.Context(), "SO2", "x-1", "exchange x-1 of SO1", nil)
			after, err := q.Status(t.Context(), "SO2")
			require.NoError(t, err)
			assert.Equal(t, after.Last, after.Done, "the cursor passed the creation and the voided repeats: nothing waits for the gap check")
		})
	}
}
