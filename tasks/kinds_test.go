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

// Every kind of the table has an example (tasks.WithExample), a valid
// payload of its kind once an event ID and an order number are added,
// with nothing but the kind's own members: the tests that go over every
// kind take it as the kind's request.
func TestEveryKindHasAnExample(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			require.NotEmpty(t, k.Example(), "give %s an example: tasks.WithExample in its NewKind (docs/adding-a-task-type.md)", k.Type)
			p, err := k.ExamplePayload("ev-1", "SO1")
			require.NoError(t, err)
			require.Same(t, k, p.Kind())
			require.Equal(t, tasks.Header{EventID: "ev-1", OrderNo: "SO1"}, p.Header(), "the example has no header member of its own")
			own, err := k.Decode([]byte(k.Example()))
			require.NoError(t, err)
			require.Equal(t, tasks.Header{}, own.Header(), "the example has no event_id, order_no, trace or seq")
		})
	}
}

// A kind needs no example, but one it has must be valid, and must not
// name the order it creates.
func TestKindExample(t *testing.T) {
	t.Parallel()
	none := tasks.NewKind[tasks.ModifyPayload]("test:none", "test-none", "test_none", 1)
	assert.Empty(t, none.Example())
	_, err := none.ExamplePayload("ev-1", "SO1")
	assert.ErrorIs(t, err, tasks.ErrNoExample)
	assert.ErrorContains(t, err, "test:none")

	_, err = tasks.Modify.ExamplePayload("", "SO1")
	assert.ErrorIs(t, err, tasks.ErrInvalid, "the event ID is checked")
	_, err = tasks.Modify.ExamplePayload("ev-1", "SO 1")
	assert.ErrorIs(t, err, tasks.ErrInvalid, "the order number is checked")

	bad := map[string]string{
		"not JSON":              `{"changes":`,
		"an unknown member":     `{"changes":{"remark":"r"},"colour":"red"}`,
		"invalid once complete": `{"changes":{}}`,
	}
	for name, example := range bad {
		k := tasks.NewKind[tasks.ModifyPayload]("order:x", "x", "order_x", 1, tasks.WithExample(example))
		_, err := k.ExamplePayload("ev-1", "SO1")
		assert.ErrorIs(t, err, tasks.ErrInvalid, name)
		assert.ErrorContains(t, err, "the example of order:x", name)
	}
	require.NoError(t, tasks.Table{tasks.Modify, noExampleKind}.Validate(), "a kind needs no example")
	err = tasks.Table{tasks.Modify, badExampleKind}.Validate()
	assert.ErrorIs(t, err, tasks.ErrKinds)
	assert.ErrorIs(t, err, tasks.ErrInvalid)
	err = tasks.Table{tasks.Modify, fixedCreationKind}.Validate()
	assert.ErrorIs(t, err, tasks.ErrKinds)
	assert.ErrorContains(t, err, "creates order SO-FIXED whatever its order")
}

// examplePayload is a payload whose text is required: the payload of
// badExampleKind, whose example has none.
type examplePayload struct {
	EventID string              `json:"event_id"`
	OrderNo string              `json:"order_no"`
	Text    string              `json:"text"`
	Trace   *tasks.TraceContext `json:"trace,omitempty"`
	Seq     int64               `json:"seq,omitempty"`
}

// badExampleKind has an example that is not valid: it has no text.
var badExampleKind = tasks.NewKind[examplePayload]("test:bad-example", "bad-example", "test_bad_example", 1,
	tasks.WithExample(`{}`))

func (p examplePayload) Kind() *tasks.Kind { return badExampleKind }
func (p examplePayload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}
func (p examplePayload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}
func (p examplePayload) Validate() error {
	if p.Text == "" {
		return &tasks.FieldError{Field: "text", Msg: "required"}
	}
	return nil
}

// creationPayload is a payload that creates the order its NewOrderNo
// names.
type creationPayload struct {
	EventID    string              `json:"event_id"`
	OrderNo    string              `json:"order_no"`
	NewOrderNo string              `json:"new_order_no"`
	Trace      *tasks.TraceContext `json:"trace,omitempty"`
	Seq        int64               `json:"seq,omitempty"`
}

// fixedCreationKind has an example that names the order it creates.
var fixedCreationKind = tasks.NewKind[creationPayload]("test:fixed-creation", "fixed-creation", "test_fixed_creation", 1,
	tasks.WithExample(`{"new_order_no":"SO-FIXED"}`))

func (p creationPayload) Kind() *tasks.Kind { return fixedCreationKind }
func (p creationPayload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}
func (p creationPayload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}
func (p creationPayload) Validate() error { return nil }
func (p creationPayload) Creates() string { return p.NewOrderNo }

// noExamplePayload is the payload of noExampleKind, made without an
// example.
type noExamplePayload struct{ examplePayload }

var noExampleKind = tasks.NewKind[noExamplePayload]("test:no-example", "no-example", "test_no_example", 1)

func (p noExamplePayload) Kind() *tasks.Kind { return noExampleKind }
func (p noExamplePayload) WithHeader(h tasks.Header) tasks.Payload {
	p.examplePayload = p.examplePayload.WithHeader(h).(examplePayload)
	return p
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
