package tasks

import "strings"

// The limits a payload must respect. Lengths of identifiers count ASCII
// characters, the length of a SKU counts characters (runes), and the lengths
// of free text count bytes of UTF-8. The limits of one kind's own fields
// are declared with its payload: [MaxAddressLen] and [MaxRemarkLen].
const (
	// MaxEventIDLen is the longest event_id, in characters.
	MaxEventIDLen = 128
	// MaxOrderNoLen is the longest order_no and new_order_no, in characters.
	MaxOrderNoLen = 64
	// MaxSKULen is the longest sku, in characters.
	MaxSKULen = 64
	// MinQty is the smallest qty of an item.
	MinQty = 1
	// MaxQty is the largest qty of an item.
	MaxQty = 10000
	// MaxItems is the most entries an items list may have.
	MaxItems = 100
	// MaxReasonLen is the longest reason a change gives (an exchange's,
	// say), in bytes.
	MaxReasonLen = 256
	// MaxPayloadBytes is the largest payload the parsers accept, in bytes.
	// A valid payload is far smaller even with every character escaped; the
	// limit only bounds the work done on hostile input.
	MaxPayloadBytes = 256 << 10
)

// Item is one line of an order: a quantity of one SKU.
type Item struct {
	// SKU identifies the product: 1 to [MaxSKULen] characters of valid UTF-8,
	// not all white space, without control characters. Within one items list
	// each SKU appears at most once.
	SKU string `json:"sku"`
	// Qty is how many, from [MinQty] to [MaxQty].
	Qty int `json:"qty"`
}

// TraceContext is the W3C Trace Context (https://www.w3.org/TR/trace-context/)
// of a change's acceptance, carried in its payload's optional "trace"
// field because asynq tasks have no headers:
//
//	"trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=x"}
//
// The producer and the intake set it when tracing is on, from the context
// of the request that enqueued the change; a worker with tracing on runs
// the change as part of that trace, and one with tracing off ignores it. A
// task without it (enqueued by hand) starts a new trace. A value that is
// not a valid W3C header starts a new trace too: the change is never
// refused for its trace context, only for breaking the field's bounds
// ([MaxTraceparentLen], [MaxTracestateLen], printable ASCII).
type TraceContext struct {
	// Traceparent is the W3C traceparent header's value.
	Traceparent string `json:"traceparent"`
	// Tracestate is the W3C tracestate header's value; it may be empty.
	Tracestate string `json:"tracestate,omitempty"`
}

// The bounds of a [TraceContext]'s fields, in bytes. A traceparent of
// version 00 is 55 bytes; the W3C asks that at least 512 bytes of
// tracestate be propagated, and the producer drops a longer one.
const (
	MaxTraceparentLen = 256
	MaxTracestateLen  = 512
)

// The labels of positions. A position of an order's sequence is reserved
// under a label that says whose it is; the worker checks it before it
// applies a task in turn, and reads it to find the task of a position that
// seems stuck.
const (
	// labelCreate starts the label of a replacement order's first
	// position, which the exchange that creates it reserves.
	labelCreate = "order:create"
)

// PositionLabel returns the label of the position of a task of type typ
// (a kind of the configured [Table]) with event eventID in its order's sequence:
// "<type> <event_id>", for example "order:modify crm-7f3a9c".
func PositionLabel(typ, eventID string) string { return typ + " " + eventID }

// CreationLabel returns the label of the position that an exchange of
// orderNo by eventID reserves in its replacement's sequence: the
// replacement's creation, "order:create <event_id> <order_no>". Changes of
// the replacement accepted after it wait for it.
func CreationLabel(eventID, orderNo string) string {
	return labelCreate + " " + eventID + " " + orderNo
}

// ParseLabel reads a label of [PositionLabel] or [CreationLabel]. typ is
// the type of a kind of t for a task's own position, and the type of the
// kind of t whose payloads create orders ([Creator]: the exchange) for a
// creation (then from is the order it was created from); ok is false for
// anything else, a kind missing from t included. A worker reads the labels
// of its order sequences against the kinds it was configured with, so that
// the position of a kind of its own is found as any other.
func (t Table) ParseLabel(label string) (typ, eventID, from string, ok bool) {
	kind, rest, _ := strings.Cut(label, " ")
	if kind == labelCreate {
		ev, from, _ := strings.Cut(rest, " ")
		c := t.Creator()
		if c == nil || !ValidEventID(ev) || !ValidOrderNo(from) {
			return "", "", "", false
		}
		return c.Type, ev, from, true
	}
	if t.Of(kind) == nil || !ValidEventID(rest) {
		return "", "", "", false
	}
	return kind, rest, "", true
}
