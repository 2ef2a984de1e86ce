package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// TestMetricsBoundTaskTypes puts tasks of hostile types in an order queue:
// the worker archives them, and its series count them under
// task_type="unknown", so that no type string becomes a label of its own.
// The archived counter has every kind's types (at 0) and "unknown", no
// more.
func TestMetricsBoundTaskTypes(t *testing.T) {
	e := newEnv(t)
	e.seed("SO-MET")
	reg := prometheus.NewRegistry()
	m, err := worker.NewMetrics(reg)
	require.NoError(t, err)
	e.startWorker(worker.Config{Metrics: m}, nil)

	payload := []byte(`{"event_id":"e","order_no":"SO-MET","changes":{"remark":"x"}}`)
	for i, typ := range []string{strings.Repeat("x", 4096), "order:no-such-kind", "order:modify ", "ORDER:MODIFY"} {
		e.enqueue(asynq.NewTask(typ, payload), tasks.QueueModify, "hostile-"+string(rune('a'+i)))
	}
	e.modify("SO-MET", "evt-ok", tasks.Changes{Remark: new("fine")})
	e.drain(30 * time.Second)

	families, err := reg.Gather()
	require.NoError(t, err)
	types := map[string]bool{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "task_type" {
					types[fmt.Sprintf("%.40q", l.GetValue())] = true // short, if it fails
				}
			}
		}
	}
	// Every kind of the table is there, not only order:modify: every
	// kind's archived counts start at 0.
	want := map[string]bool{`"unknown"`: true}
	for _, k := range tasks.Kinds() {
		want[fmt.Sprintf("%.40q", k.Type)] = true
	}
	assert.Equal(t, want, types)
}
