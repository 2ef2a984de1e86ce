package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// Every way a change gets archived is counted once, under its kind and its
// reason, on real Redis with a real worker; no label takes an order number
// or an event ID.
func TestArchivedChangesAreCountedByReason(t *testing.T) {
	e := newEnv(t)
	for _, no := range []string{"SO-AR", "SO-AR-SEQ", "SO-AR-X", "SO-AR-TAKEN"} {
		e.seed(no)
	}
	// The store fails the changes with these event IDs so.
	fail := map[string]error{
		"ev-budget":    errors.New("upstream said 500"),
		"ev-exhausted": fmt.Errorf("late: %w", orders.ErrStaleFence),
		"ev-refused":   fmt.Errorf("upstream said 422: %w", orders.ErrInvalid),
		"ev-other":     fmt.Errorf("a kind's own rejection: %w", asynq.SkipRetry),
	}
	failing := storehook.Kinds(nil, func(_ context.Context, _, ev, _ string) error { return fail[ev] })
	reg := prometheus.NewRegistry()
	m, err := worker.NewMetrics(reg)
	require.NoError(t, err)
	r := newRuns()
	e.startWorker(worker.Config{Metrics: m, OnDone: r.add, Kinds: failing}, nil)

	// SO-AR-SEQ gets a live sequence; SO-AR-X is exchanged (closed).
	p := e.producer(producer.Config{})
	res, err := p.EnqueueModify(t.Context(), "SO-AR-SEQ", tasks.Changes{Remark: new("live")}, producer.WithEventID("ev-live"))
	require.NoError(t, err)
	r.final(t, "ev-live")
	e.exchange("SO-AR-X", "ev-x", "SO-AR-X2")
	r.final(t, "ev-x")

	modify := func(ev, no string) []byte {
		return fmt.Appendf(nil, `{"event_id":%q,"order_no":%q,"changes":{"remark":"x"}}`, ev, no)
	}
	seqModify := func(ev, no string, seq int64) []byte {
		return fmt.Appendf(nil, `{"event_id":%q,"order_no":%q,"seq":%s,"changes":{"remark":"x"}}`, ev, no, strconv.FormatInt(seq, 10))
	}
	exchange := []byte(`{"event_id":"ev-conflict","order_no":"SO-AR","new_order_no":"SO-AR-TAKEN","items":[{"sku":"B","qty":1}]}`)
	tests := []struct {
		name, typ, queue, id string
		payload              []byte
		maxRetry             int
		want                 string // task_type/reason
	}{
		{"invalid payload", tasks.TypeModify, tasks.QueueModify, "ev-json", []byte(`{"order_no":`), 5, "order:modify/invalid_payload"},
		{"unknown type", "order:no-such-kind", tasks.QueueModify, "ev-no-such-kind", modify("ev-no-such-kind", "SO-AR"), 5, "unknown/unknown_type"},
		{"misplaced", tasks.TypeModify, tasks.QueueExchange, "ev-misplaced", modify("ev-misplaced", "SO-AR"), 5, "order:modify/misplaced"},
		{"task ID mismatch", tasks.TypeModify, tasks.QueueModify, "not-ev-id", modify("ev-id", "SO-AR"), 5, "order:modify/task_id_mismatch"},
		{"bad position", tasks.TypeModify, tasks.QueueModify, "ev-ahead", seqModify("ev-ahead", "SO-AR-SEQ", res.Seq+1000), 5, "order:modify/bad_position"},
		{"out of budget", tasks.TypeModify, tasks.QueueModify, "ev-budget", modify("ev-budget", "SO-AR"), tasks.MaxRetry(0), "order:modify/out_of_budget"},
		{"retries exhausted", tasks.TypeModify, tasks.QueueModify, "ev-exhausted", modify("ev-exhausted", "SO-AR"), 0, "order:modify/retries_exhausted"},
		{"not found", tasks.TypeModify, tasks.QueueModify, "ev-nobody", modify("ev-nobody", "SO-AR-NONE"), 5, "order:modify/not_found"},
		{"closed", tasks.TypeModify, tasks.QueueModify, "ev-closed", modify("ev-closed", "SO-AR-X"), 5, "order:modify/closed"},
		{"passed", tasks.TypeModify, tasks.QueueModify, "ev-passed", seqModify("ev-passed", "SO-AR-SEQ", res.Seq), 5, "order:modify/passed"},
		{"conflict", tasks.TypeExchange, tasks.QueueExchange, "ev-conflict", exchange, 5, "order:exchange/conflict"},
		{"store refused", tasks.TypeModify, tasks.QueueModify, "ev-refused", modify("ev-refused", "SO-AR"), 5, "order:modify/store_refused"},
		{"other", tasks.TypeModify, tasks.QueueModify, "ev-other", modify("ev-other", "SO-AR"), 5, "order:modify/other"},
	}
	want := map[string]float64{}
	for _, tt := range tests {
		_, err := e.cli.Enqueue(asynq.NewTask(tt.typ, tt.payload), asynq.Queue(tt.queue), asynq.TaskID(tt.id), asynq.MaxRetry(tt.maxRetry))
		require.NoError(t, err, tt.name)
		want[tt.want]++
	}
	for _, tt := range tests {
		e.waitState(tt.queue, tt.id, asynq.TaskStateArchived)
	}
	require.Equal(t, want, archivedCounts(t, reg), "the changes that applied (ev-live, ev-x) count nothing")
}

// archivedCounts returns the non-zero counts of
// orderworker_changes_archived_total by "task_type/reason".
func archivedCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "orderworker_changes_archived_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Len(t, labels, 2, "task_type and reason only")
			if v := m.GetCounter().GetValue(); v > 0 {
				out[labels["task_type"]+"/"+labels["reason"]] += v
			}
		}
	}
	return out
}
