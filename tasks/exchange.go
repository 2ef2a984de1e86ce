package tasks

import (
	"crypto/sha256"
	"encoding/hex"
)

// The exchange kind's task type and queue, part of the wire contract: a
// task of type TypeExchange carries an [ExchangePayload], and anything that
// enqueues one puts it in QueueExchange. The worker serves QueueExchange
// with the higher priority, so that an exchange waiting behind a backlog of
// modifies is taken first.
const (
	// TypeExchange cancels an order and creates its replacement.
	TypeExchange = "order:exchange"
	// QueueExchange is the queue of TypeExchange tasks, the higher priority.
	QueueExchange = "order_exchange"
)

// Exchange is the kind of [TypeExchange] tasks, whose payload is an
// [ExchangePayload]. Its example names no replacement: the replacement's
// number is derived from the order's (see [ReplacementOrderNo]).
var Exchange = NewKind[ExchangePayload](TypeExchange, "exchange", QueueExchange, 6,
	WithExample(`{"items":[{"sku":"shirt-l","qty":2}],"reason":"wrong size"}`))

var (
	_ Payload = ExchangePayload{}
	_ Creator = ExchangePayload{}
)

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

// Kind returns [Exchange].
func (p ExchangePayload) Kind() *Kind { return Exchange }

// Header returns the payload's event ID, order number, position and trace
// context.
func (p ExchangePayload) Header() Header {
	return Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}

// WithHeader returns p with h's event ID, order number, position and trace
// context.
func (p ExchangePayload) WithHeader(h Header) Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}

// Creates returns the replacement order's number (see
// [ExchangePayload.Replacement]).
func (p ExchangePayload) Creates() string { return p.Replacement() }

// Validate checks p against the contract (see the package documentation and
// the field docs). It reports the first problem it finds, in the order of the
// fields, as a [*FieldError]; nil means p is valid.
func (p ExchangePayload) Validate() error {
	if msg := eventIDProblem(p.EventID); msg != "" {
		return &FieldError{Field: "event_id", Msg: msg}
	}
	if msg := orderNoProblem(p.OrderNo); msg != "" {
		return &FieldError{Field: "order_no", Msg: msg}
	}
	if p.Items == nil {
		return fieldErr("items", "required")
	}
	if err := validateItems("items", p.Items); err != nil {
		return err
	}
	if p.NewOrderNo != "" {
		if msg := orderNoProblem(p.NewOrderNo); msg != "" {
			return &FieldError{Field: "new_order_no", Msg: msg}
		}
		if p.NewOrderNo == p.OrderNo {
			return fieldErr("new_order_no", "must differ from order_no")
		}
	}
	if err := CheckReason(p.Reason); err != nil {
		return err
	}
	if err := p.Trace.validate(); err != nil {
		return err
	}
	return validateSeq(p.Seq)
}
