package tasks

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// The task types. A task's type selects its payload: [ModifyPayload] for
// TypeModify and [ExchangePayload] for TypeExchange.
const (
	// TypeModify changes the address, remark or items of an existing order.
	TypeModify = "order:modify"
	// TypeExchange cancels an order and creates its replacement.
	TypeExchange = "order:exchange"
)

// The queues, part of the wire contract: anything that enqueues a task of
// type TypeExchange puts it in QueueExchange, and one of type TypeModify in
// QueueModify. The worker serves QueueExchange with the higher priority, so
// that an exchange waiting behind a backlog of modifies is taken first.
const (
	// QueueExchange is the queue of TypeExchange tasks, the higher priority.
	QueueExchange = "order_exchange"
	// QueueModify is the queue of TypeModify tasks.
	QueueModify = "order_modify"
)

// The limits a payload must respect. Lengths of identifiers count ASCII
// characters, the length of a SKU counts characters (runes), and the lengths
// of free text count bytes of UTF-8.
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
	// MaxAddressLen is the longest address, in bytes.
	MaxAddressLen = 512
	// MaxRemarkLen is the longest remark, in bytes.
	MaxRemarkLen = 1024
	// MaxReasonLen is the longest reason, in bytes.
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

// Changes is what a modify changes. A nil field is left as it is; at least one
// field must be set.
type Changes struct {
	// Address, when set, replaces the delivery address. It must not be blank
	// and is at most [MaxAddressLen] bytes of valid UTF-8, without control
	// characters other than line breaks ("\n" or "\r\n"): no tab.
	Address *string `json:"address,omitempty"`
	// Remark, when set, replaces the order's remark. It is at most
	// [MaxRemarkLen] bytes of valid UTF-8, without control characters other
	// than line breaks ("\n" or "\r\n") and tabs; an empty remark clears it.
	Remark *string `json:"remark,omitempty"`
	// Items, when non-nil, replaces the order's whole item list. It has 1 to
	// [MaxItems] entries; an empty non-nil list is an error, since an order
	// without items is not an order (and JSON could not tell it from absent).
	Items []Item `json:"items,omitempty"`
}

// ModifyPayload is the payload of a [TypeModify] task.
type ModifyPayload struct {
	// EventID is the upstream's idempotency key for this change, and the
	// task's ID: 1 to [MaxEventIDLen] characters of A-Z, a-z, 0-9, '_', '-',
	// '.' and ':', the first a letter or digit (see [ValidEventID]). The
	// producer generates one (a UUID) when the caller gives none.
	EventID string `json:"event_id"`
	// OrderNo is the order to change (see [ValidOrderNo]).
	OrderNo string `json:"order_no"`
	// Changes is what to change; at least one of its fields is set.
	Changes Changes `json:"changes"`
	// Trace, when set, is the W3C trace context of the change's
	// acceptance (see [TraceContext]). It is optional and never part of
	// what makes two changes the same.
	Trace *TraceContext `json:"trace,omitempty"`
	// Seq is the change's position in its order's sequence (the order of
	// acceptance), handed out by Redis when the change was accepted; see
	// the package documentation. 0 (left out) means none: the task is
	// applied without order. The producer and the intake always set it.
	// It is at most [MaxSeq]. Only a position that the order's sequence
	// handed out to this task, applied in its turn, is recorded as the
	// order's newest: any other seq is checked (refused when it is not
	// after the newest applied) but never moves the order on.
	Seq int64 `json:"seq,omitempty"`
}

// ExchangePayload is the payload of a [TypeExchange] task: cancel OrderNo and
// create a replacement order holding Items.
type ExchangePayload struct {
	// EventID is the upstream's idempotency key for this exchange, as in
	// [ModifyPayload.EventID].
	EventID string `json:"event_id"`
	// OrderNo is the order to cancel (see [ValidOrderNo]).
	OrderNo string `json:"order_no"`
	// Items are the replacement order's items: 1 to [MaxItems] entries.
	Items []Item `json:"items"`
	// NewOrderNo, when not empty, is the replacement order's number. It
	// follows the rules of [ValidOrderNo] and differs from OrderNo. When it is
	// empty the worker derives one from EventID, so a retry creates the same
	// order.
	NewOrderNo string `json:"new_order_no,omitempty"`
	// Reason says why, for people: at most [MaxReasonLen] bytes of valid
	// UTF-8, under the rules of [Changes.Remark]. It may be empty.
	Reason string `json:"reason,omitempty"`
	// Trace is the trace context of the exchange's acceptance, as in
	// [ModifyPayload.Trace].
	Trace *TraceContext `json:"trace,omitempty"`
	// Seq is the exchange's position in OrderNo's sequence, as in
	// [ModifyPayload.Seq].
	Seq int64 `json:"seq,omitempty"`
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

// Replacement returns the replacement order's number: NewOrderNo, or the
// one [ReplacementOrderNo] derives when it is empty.
func (p ExchangePayload) Replacement() string {
	if p.NewOrderNo != "" {
		return p.NewOrderNo
	}
	return ReplacementOrderNo(p.OrderNo, p.EventID)
}

// ReplacementOrderNo returns the number that an exchange of orderNo by
// eventID gives the replacement order when the exchange names none:
//
//	orderNo[:54] + "-X" + hex(sha256(orderNo + "\n" + eventID))[:8]
//
// orderNo is cut to 54 characters only when it is longer, so the result is
// at most 64 characters of [A-Za-z0-9_-] and the same on every retry. The
// hash covers the whole order number, so two long numbers that share their
// first 54 characters still get different replacements (up to a 32-bit
// hash collision, which the store reports as a conflict rather than
// overwriting an order).
func ReplacementOrderNo(orderNo, eventID string) string {
	sum := sha256.Sum256([]byte(orderNo + "\n" + eventID))
	base := orderNo
	if len(base) > MaxOrderNoLen-10 {
		base = base[:MaxOrderNoLen-10]
	}
	return base + "-X" + hex.EncodeToString(sum[:4])
}

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
