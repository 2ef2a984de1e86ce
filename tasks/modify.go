package tasks

import "strings"

// The modify kind's task type and queue, part of the wire contract: a task
// of type TypeModify carries a [ModifyPayload], and anything that enqueues
// one puts it in QueueModify.
const (
	// TypeModify changes the address, remark or items of an existing order.
	TypeModify = "order:modify"
	// QueueModify is the queue of TypeModify tasks.
	QueueModify = "order_modify"
)

// The limits of a modify's free text, in bytes of UTF-8.
const (
	// MaxAddressLen is the longest address, in bytes.
	MaxAddressLen = 512
	// MaxRemarkLen is the longest remark, in bytes.
	MaxRemarkLen = 1024
)

// Modify is the kind of [TypeModify] tasks, whose payload is a
// [ModifyPayload]. Its example sets the remark.
var Modify = NewKind[ModifyPayload](TypeModify, "modify", QueueModify, 3,
	WithExample(`{"changes":{"remark":"leave at the door"}}`))

var _ Payload = ModifyPayload{}

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

// Kind returns [Modify].
func (p ModifyPayload) Kind() *Kind { return Modify }

// Header returns the payload's event ID, order number, position and trace
// context.
func (p ModifyPayload) Header() Header {
	return Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}

// WithHeader returns p with h's event ID, order number, position and trace
// context.
func (p ModifyPayload) WithHeader(h Header) Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}

// Validate checks p against the contract (see the package documentation and
// the field docs). It reports the first problem it finds, in the order of the
// fields, as a [*FieldError]; nil means p is valid.
func (p ModifyPayload) Validate() error {
	if msg := eventIDProblem(p.EventID); msg != "" {
		return &FieldError{Field: "event_id", Msg: msg}
	}
	if msg := orderNoProblem(p.OrderNo); msg != "" {
		return &FieldError{Field: "order_no", Msg: msg}
	}
	if err := p.Changes.validate("changes"); err != nil {
		return err
	}
	if err := p.Trace.validate(); err != nil {
		return err
	}
	return validateSeq(p.Seq)
}

func (c Changes) validate(path string) error {
	if c.Address == nil && c.Remark == nil && c.Items == nil {
		return fieldErr(path, "must set at least one of address, remark and items")
	}
	if c.Address != nil {
		if strings.TrimSpace(*c.Address) == "" {
			return fieldErr(path+".address", "must not be blank")
		}
		if err := text(path+".address", *c.Address, MaxAddressLen, false); err != nil {
			return err
		}
	}
	if c.Remark != nil {
		if err := text(path+".remark", *c.Remark, MaxRemarkLen, true); err != nil {
			return err
		}
	}
	if c.Items != nil {
		return validateItems(path+".items", c.Items)
	}
	return nil
}
