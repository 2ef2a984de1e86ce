package tasks_test

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

const (
	traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tracestate  = "vendor=x,other=y"
)

// withTrace returns a valid payload of each kind carrying tc.
func withTrace(tc *tasks.TraceContext) []tasks.Payload {
	return []tasks.Payload{
		modifyWith(func(p *tasks.ModifyPayload) { p.Trace = tc }),
		exchangeWith(func(p *tasks.ExchangePayload) { p.Trace = tc }),
	}
}

func TestTraceContextValidate_Valid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tc   *tasks.TraceContext
	}{
		{"none", nil},
		{"traceparent only", &tasks.TraceContext{Traceparent: traceparent}},
		{"with tracestate", &tasks.TraceContext{Traceparent: traceparent, Tracestate: tracestate}},
		// Only the bounds are checked, not the syntax: a worker starts a
		// new trace for what it cannot read.
		{"not W3C syntax", &tasks.TraceContext{Traceparent: "garbage", Tracestate: "more garbage"}},
		{"every printable ASCII character", &tasks.TraceContext{Traceparent: printableASCII(), Tracestate: printableASCII()}},
		{"at the bounds", &tasks.TraceContext{
			Traceparent: strings.Repeat("p", tasks.MaxTraceparentLen),
			Tracestate:  strings.Repeat("s", tasks.MaxTracestateLen),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range withTrace(tt.tc) {
				assert.NoError(t, p.Validate(), p.Kind().Type)
			}
		})
	}
}

// printableASCII returns the characters from ' ' to '~'.
func printableASCII() string {
	var b strings.Builder
	for c := byte(' '); c <= '~'; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

func TestTraceContextValidate_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		tc    *tasks.TraceContext
		field string
		msg   string
	}{
		{"empty", &tasks.TraceContext{},
			"trace.traceparent", "required"},
		{"tracestate without traceparent", &tasks.TraceContext{Tracestate: tracestate},
			"trace.traceparent", "required"},
		{"traceparent too long", &tasks.TraceContext{Traceparent: strings.Repeat("p", tasks.MaxTraceparentLen+1)},
			"trace.traceparent", "must be at most 256 bytes, got 257"},
		{"tab in the traceparent", &tasks.TraceContext{Traceparent: "00-\tx"},
			"trace.traceparent", "must be printable ASCII, got byte 0x09 at 3"},
		{"line break in the traceparent", &tasks.TraceContext{Traceparent: traceparent + "\r\nX-Injected: 1"},
			"trace.traceparent", "must be printable ASCII, got byte 0x0d at 55"},
		{"NUL in the traceparent", &tasks.TraceContext{Traceparent: "\x00"},
			"trace.traceparent", "must be printable ASCII, got byte 0x00 at 0"},
		{"DEL in the traceparent", &tasks.TraceContext{Traceparent: "00\x7f"},
			"trace.traceparent", "must be printable ASCII, got byte 0x7f at 2"},
		{"non-ASCII in the traceparent", &tasks.TraceContext{Traceparent: "é"},
			"trace.traceparent", "must be printable ASCII, got byte 0xc3 at 0"},
		{"tracestate too long", &tasks.TraceContext{Traceparent: traceparent, Tracestate: strings.Repeat("s", tasks.MaxTracestateLen+1)},
			"trace.tracestate", "must be at most 512 bytes, got 513"},
		{"line break in the tracestate", &tasks.TraceContext{Traceparent: traceparent, Tracestate: "a=b\n"},
			"trace.tracestate", "must be printable ASCII, got byte 0x0a at 3"},
		{"non-ASCII in the tracestate", &tasks.TraceContext{Traceparent: traceparent, Tracestate: "a=ü"},
			"trace.tracestate", "must be printable ASCII, got byte 0xc3 at 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range withTrace(tt.tc) {
				err := p.Validate()
				require.Error(t, err, p.Kind().Type)
				assert.Equal(t, tt.field+": "+tt.msg, err.Error())
				assert.ErrorIs(t, err, tasks.ErrInvalid)
				assert.ErrorIs(t, err, asynq.SkipRetry)
				var fe *tasks.FieldError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, tt.field, fe.Field)
			}
		})
	}
}

// The trace context is checked in its field's place: after the fields
// before it, before seq.
func TestTraceContextValidate_Order(t *testing.T) {
	t.Parallel()
	bad := &tasks.TraceContext{}
	m := modifyWith(func(p *tasks.ModifyPayload) { p.Trace, p.Seq = bad, -1 })
	assert.EqualError(t, m.Validate(), "trace.traceparent: required", "before seq")
	m.Changes = tasks.Changes{}
	assert.EqualError(t, m.Validate(), "changes: must set at least one of address, remark and items", "after changes")

	x := exchangeWith(func(p *tasks.ExchangePayload) { p.Trace, p.Seq = bad, -1 })
	assert.EqualError(t, x.Validate(), "trace.traceparent: required", "before seq")
	x.Reason = "\x00"
	assert.ErrorContains(t, x.Validate(), "reason: ", "after reason")
}

// The wire: "trace" is written after every field but seq, which stays
// last (the producer's one-script acceptance appends it), and its
// tracestate is left out when empty.
func TestNewTask_TraceWire(t *testing.T) {
	t.Parallel()
	full := &tasks.TraceContext{Traceparent: traceparent, Tracestate: tracestate}
	tests := []struct {
		name string
		p    tasks.Payload
		want string
	}{
		{"modify",
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}, Trace: full, Seq: 5},
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":{"traceparent":"` + traceparent + `","tracestate":"` + tracestate + `"},"seq":5}`},
		{"modify without tracestate or seq",
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}, Trace: &tasks.TraceContext{Traceparent: traceparent}},
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":{"traceparent":"` + traceparent + `"}}`},
		{"exchange",
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}, NewOrderNo: "SO2", Reason: "size", Trace: full, Seq: 5},
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":"SO2","reason":"size","trace":{"traceparent":"` + traceparent + `","tracestate":"` + tracestate + `"},"seq":5}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task, err := tasks.NewTask(tt.p)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(task.Payload()))
			got, err := tt.p.Kind().Parse(task.Payload())
			require.NoError(t, err)
			assert.Equal(t, tt.p, got)
		})
	}
}

// NewTask refuses a payload whose trace context breaks the bounds.
func TestNewTask_InvalidTrace(t *testing.T) {
	t.Parallel()
	task, err := tasks.NewTask(modifyWith(func(p *tasks.ModifyPayload) {
		p.Trace = &tasks.TraceContext{Traceparent: strings.Repeat("p", tasks.MaxTraceparentLen+1)}
	}))
	assert.Nil(t, task)
	require.ErrorIs(t, err, tasks.ErrInvalid)
	var fe *tasks.FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "trace.traceparent", fe.Field)
}

// carrier is a valid payload of one kind, open for one more member.
type carrier struct {
	kind *tasks.Kind
	open string
}

// carriers returns a carrier of each kind of the table, in its order, made
// from the kind's example (tasks.WithExample), so that a kind
// added to the table is covered with no change here.
func carriers(t *testing.T) []carrier {
	t.Helper()
	var out []carrier
	for _, k := range tasks.Kinds() {
		sample := k.Example()
		require.NotEmpty(t, sample, "give %s an example (tasks.WithExample)", k.Type)
		own := strings.TrimSpace(sample)
		require.True(t, strings.HasPrefix(own, "{") && strings.HasSuffix(own, "}"), "the example of %s is a JSON object: %s", k.Type, sample)
		open := `{"event_id":"e1","order_no":"SO1",`
		if own = strings.TrimSpace(own[1 : len(own)-1]); own != "" {
			open += own + ","
		}
		p, err := k.Parse([]byte(strings.TrimSuffix(open, ",") + "}"))
		require.NoError(t, err, "the carrier of %s is valid without a trace", k.Type)
		require.Nil(t, p.Header().Trace)
		out = append(out, carrier{k, open})
	}
	return out
}

func TestCarriersCoverEveryKind(t *testing.T) {
	t.Parallel()
	cs := carriers(t)
	require.Len(t, cs, len(tasks.Kinds()))
	for i, k := range tasks.Kinds() {
		require.Same(t, k, cs[i].kind)
	}
}

func TestParse_Trace(t *testing.T) {
	t.Parallel()
	cs := carriers(t)
	tests := []struct {
		name  string
		trace string
		want  *tasks.TraceContext
	}{
		{"both", `"trace":{"traceparent":"` + traceparent + `","tracestate":"` + tracestate + `"}`,
			&tasks.TraceContext{Traceparent: traceparent, Tracestate: tracestate}},
		{"members in any order", `"trace":{"tracestate":"` + tracestate + `","traceparent":"` + traceparent + `"}`,
			&tasks.TraceContext{Traceparent: traceparent, Tracestate: tracestate}},
		{"traceparent only", `"trace":{"traceparent":"` + traceparent + `"}`,
			&tasks.TraceContext{Traceparent: traceparent}},
		{"null tracestate", `"trace":{"traceparent":"` + traceparent + `","tracestate":null}`,
			&tasks.TraceContext{Traceparent: traceparent}},
		{"null trace is none", `"trace":null`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range cs {
				p, err := c.kind.Parse([]byte(c.open + tt.trace + `}`))
				require.NoError(t, err, c.kind.Type)
				assert.Equal(t, tt.want, p.Header().Trace, c.kind.Type)
			}
		})
	}
}

// The trace object is decoded as strictly as the rest: no unknown,
// repeated or mistyped member.
func TestParse_TraceFieldErrors(t *testing.T) {
	t.Parallel()
	cs := carriers(t)
	tests := []struct {
		name  string
		trace string
		field string
		msg   string
	}{
		{"unknown member", `"trace":{"traceparent":"` + traceparent + `","baggage":"k=v"}`,
			"trace.baggage", "unknown field"},
		{"member names are case-sensitive", `"trace":{"Traceparent":"` + traceparent + `"}`,
			"trace.Traceparent", "unknown field"},
		{"repeated member", `"trace":{"traceparent":"` + traceparent + `","traceparent":"` + traceparent + `"}`,
			"trace.traceparent", "repeated field"},
		{"a string", `"trace":"` + traceparent + `"`,
			"trace", "must be an object, got string"},
		{"an array", `"trace":[]`,
			"trace", "must be an object, got array"},
		{"a numeric traceparent", `"trace":{"traceparent":1}`,
			"trace.traceparent", "must be a string, got number"},
		{"an object tracestate", `"trace":{"traceparent":"` + traceparent + `","tracestate":{}}`,
			"trace.tracestate", "must be a string, got object"},
		{"empty object", `"trace":{}`,
			"trace.traceparent", "required"},
		{"escaped control character", `"trace":{"traceparent":"00\u000a"}`,
			"trace.traceparent", "must be printable ASCII, got byte 0x0a at 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range cs {
				_, err := c.kind.Parse([]byte(c.open + tt.trace + `}`))
				require.Error(t, err, c.kind.Type)
				assert.Equal(t, tt.field+": "+tt.msg, err.Error(), c.kind.Type)
				assert.ErrorIs(t, err, tasks.ErrInvalid)
				assert.ErrorIs(t, err, asynq.SkipRetry)
				var fe *tasks.FieldError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, tt.field, fe.Field)
			}
		})
	}
}

// Body is a payload's own members: for every kind, the example (which has
// no header members) comes back from a payload that carries all four,
// and the kind reads it back into that payload once the header is added.
func TestBodyIsTheKindsOwnMembers(t *testing.T) {
	t.Parallel()
	h := tasks.Header{EventID: "ev-1", OrderNo: "SO1", Seq: 42, Trace: &tasks.TraceContext{Traceparent: traceparent}}
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			sample := k.Example()
			p, err := k.ExamplePayload(h.EventID, h.OrderNo)
			require.NoError(t, err)
			p = p.WithHeader(h)
			body, err := tasks.Body(p)
			require.NoError(t, err)
			assert.JSONEq(t, sample, string(body))
			back, err := k.Decode(body)
			require.NoError(t, err)
			assert.Equal(t, p, back.WithHeader(h))
		})
	}
	p := tasks.ModifyPayload{EventID: "ev-1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("a <b> & c")}}
	body, err := tasks.Body(p)
	require.NoError(t, err)
	assert.Equal(t, `{"changes":{"remark":"a <b> & c"}}`, string(body), "no HTML escaping")
}
