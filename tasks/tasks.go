package tasks

import (
	"encoding/json"
	"fmt"

	"github.com/hibiken/asynq"
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
}

// NewModifyTask validates p and returns a [TypeModify] task carrying it as
// JSON. The encoding is deterministic: equal payloads give equal bytes. opts
// are passed to asynq.NewTask; NewModifyTask sets no options of its own (the
// queue, task ID and retry policy are the producer's).
//
// It returns the error of [ModifyPayload.Validate] when p is invalid.
func NewModifyTask(p ModifyPayload, opts ...asynq.Option) (*asynq.Task, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		// Unreachable: the payload has only strings, ints and slices of them.
		return nil, fmt.Errorf("tasks: marshal %s: %w", TypeModify, err)
	}
	return asynq.NewTask(TypeModify, b, opts...), nil
}

// NewExchangeTask validates p and returns a [TypeExchange] task carrying it as
// JSON, as [NewModifyTask] does for a modify.
//
// It returns the error of [ExchangePayload.Validate] when p is invalid.
func NewExchangeTask(p ExchangePayload, opts ...asynq.Option) (*asynq.Task, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		// Unreachable: the payload has only strings, ints and slices of them.
		return nil, fmt.Errorf("tasks: marshal %s: %w", TypeExchange, err)
	}
	return asynq.NewTask(TypeExchange, b, opts...), nil
}
