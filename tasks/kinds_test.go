package tasks_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// TestEveryKindConforms goes over the kinds table: every kind is found by
// its type and by each of its queues, its payload names it, and its
// position label reads back, so that a kind added to the table is read
// everywhere this package reads kinds (Table.ParseLabel switched on the
// types once: a kind missed there had its positions skipped by the gap
// check).
func TestEveryKindConforms(t *testing.T) {
	t.Parallel()
	creators := 0
	names := map[string]bool{}
	kinds := tasks.Kinds()
	for _, k := range kinds {
		t.Run(k.Name, func(t *testing.T) {
			require.Same(t, k, kinds.Of(k.Type))
			require.Same(t, k, kinds.Named(k.Name))
			require.False(t, names[k.Name], "name %q twice", k.Name)
			names[k.Name] = true
			require.Same(t, k, kinds.OfQueue(k.Queue))
			for _, q := range k.ShardQueues(4) {
				require.Same(t, k, kinds.OfQueue(q), q)
			}
			p, err := k.Decode([]byte(`{"event_id":"ev-1","order_no":"SO1"}`))
			require.NoError(t, err)
			require.Same(t, k, p.Kind())
			require.Equal(t, tasks.Header{EventID: "ev-1", OrderNo: "SO1"}, p.Header())
			h := tasks.Header{EventID: "ev-2", OrderNo: "SO2", Seq: 7,
				Trace: &tasks.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "v=x"}}
			require.Equal(t, h, p.WithHeader(h).Header())

			typ, ev, from, ok := kinds.ParseLabel(tasks.PositionLabel(k.Type, "ev-1"))
			require.True(t, ok, "the label of a %s position reads back", k.Type)
			assert.Equal(t, []string{k.Type, "ev-1", ""}, []string{typ, ev, from})
			if _, ok := p.(tasks.Creator); ok {
				creators++
				typ, ev, from, ok := kinds.ParseLabel(tasks.CreationLabel("ev-1", "SO1"))
				require.True(t, ok)
				assert.Equal(t, []string{k.Type, "ev-1", "SO1"}, []string{typ, ev, from})
			}
		})
	}
	require.Equal(t, 1, creators, "a creation label does not carry its type: one kind may create orders")
	for _, bad := range []string{"", "order:no-such-kind ev-1", "order:modify", "order:modify bad/id", "order:create ev-1", "order:create ev-1 SO 1"} {
		_, _, _, ok := kinds.ParseLabel(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func TestKindsTableValidates(t *testing.T) {
	t.Parallel()
	require.NoError(t, tasks.Kinds().Validate())
	bad := map[string]tasks.Table{
		"type twice":                 {tasks.Modify, tasks.Modify},
		"a nil kind":                 {tasks.Modify, nil},
		"not by NewKind":             {&tasks.Kind{Type: "order:x", Name: "x", Queue: "order_x", Weight: 1}},
		"a shard queue":              {tasks.NewKind[tasks.ModifyPayload]("order:x", "x", "order:x", 1)},
		"a bad name":                 {tasks.NewKind[tasks.ModifyPayload]("order:x", "X/y", "order_x", 1)},
		"payload names another kind": {tasks.NewKind[tasks.ModifyPayload]("order:x", "x", "order_x", 1)},
		"payload drops its trace":    {tasks.Modify, dropsTraceKind},
	}
	for name, table := range bad {
		assert.ErrorIs(t, table.Validate(), tasks.ErrKinds, name)
	}
	assert.ErrorContains(t, bad["payload drops its trace"].Validate(), "through WithHeader and Header")
}

// dropsTracePayload is a payload whose WithHeader forgets the trace
// context: its changes would lose their traces.
type dropsTracePayload struct {
	EventID string `json:"event_id"`
	OrderNo string `json:"order_no"`
	Seq     int64  `json:"seq,omitempty"`
}

var dropsTraceKind = tasks.NewKind[dropsTracePayload]("order:droptrace", "droptrace", "order_droptrace", 1)

func (p dropsTracePayload) Kind() *tasks.Kind { return dropsTraceKind }
func (p dropsTracePayload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq}
}
func (p dropsTracePayload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq = h.EventID, h.OrderNo, h.Seq
	return p
}
func (p dropsTracePayload) Validate() error { return nil }
