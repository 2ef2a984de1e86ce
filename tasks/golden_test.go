package tasks_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// TestNewTaskGolden pins the bytes tasks.NewTask writes for the kinds
// whose wire systems already enqueue by hand, with every member of the
// header set: the members' order is part of the wire (the header's
// event_id and order_no first, the kind's own members, then trace and
// seq), and a change to a payload struct (a field moved, a header
// embedded) must keep them byte for byte. It reads each kind's example,
// so a changed example changes its line.
func TestNewTaskGolden(t *testing.T) {
	t.Parallel()
	golden := map[string]string{
		tasks.TypeModify: `{"event_id":"ev-1","order_no":"SO1","changes":{"remark":"leave at the door"},` +
			`"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"k=v"},"seq":7}`,
		tasks.TypeExchange: `{"event_id":"ev-1","order_no":"SO1","items":[{"sku":"shirt-l","qty":2}],"reason":"wrong size",` +
			`"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"k=v"},"seq":7}`,
	}
	h := tasks.Header{EventID: "ev-1", OrderNo: "SO1", Seq: 7,
		Trace: &tasks.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "k=v"}}
	for typ, want := range golden {
		k := tasks.Kinds().Of(typ)
		require.NotNil(t, k, typ)
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			p, err := k.ExamplePayload(h.EventID, h.OrderNo)
			require.NoError(t, err)
			task, err := tasks.NewTask(p.WithHeader(h))
			require.NoError(t, err)
			assert.Equal(t, want, string(task.Payload()))
			bare, err := tasks.NewTask(p)
			require.NoError(t, err)
			assert.NotContains(t, string(bare.Payload()), `"trace"`, "trace is left out when nil")
			assert.NotContains(t, string(bare.Payload()), `"seq"`, "seq is left out when zero")
		})
	}
}
