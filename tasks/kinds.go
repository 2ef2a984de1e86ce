package tasks

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/hibiken/asynq"
)

// Kind is one task type of the contract: its type name, its queue, its
// default priority and how its payload is read. [Kinds] lists them all, and
// every layer (producer, intake, worker, dashboard, metrics) reads that one
// table instead of naming the types itself. Adding a task type means adding
// its payload struct, its Kind, and its handler in the worker.
//
// A Kind is read-only; its methods are safe for concurrent use.
type Kind struct {
	// Type is the asynq task type, e.g. "order:modify".
	Type string
	// Name is the short name used in settings, HTTP routes and logs, e.g.
	// "modify".
	Name string
	// Queue is the kind's queue. It is part of the contract: every task of
	// the kind goes to it, or, when the kind is spread over several queues
	// (see [Shards]), to its order's shard of it ([Kind.QueueFor]); a task
	// of the kind found on another queue is refused.
	Queue string
	// Weight is the queue's default priority weight in the worker: the
	// higher, the more often its queue is served.
	Weight int
	// decode decodes a payload strictly without validating it; see Decode.
	decode func(b []byte) (Payload, error)
	// zero is the kind's zero payload.
	zero Payload
}

// Decode decodes a payload of the kind strictly (see [ParseModify] for what
// strictly means) without validating it, for a caller that fills in fields
// before it validates (the HTTP intake takes order_no from the path). The
// error, when the JSON does not decode into the kind's payload, matches
// [ErrInvalid]; the payload is then nil.
func (k *Kind) Decode(b []byte) (Payload, error) { return k.decode(b) }

// Parse decodes a payload of the kind strictly and validates it, with the
// rules and errors of [ParseModify]. The payload is never nil: on an error
// it is what was decoded (the zero payload of the kind when the JSON did
// not decode), for logging only.
func (k *Kind) Parse(b []byte) (Payload, error) {
	p, err := k.decode(b)
	if err != nil {
		return k.zero, err
	}
	return p, p.Validate()
}

// String returns the kind's type.
func (k *Kind) String() string { return k.Type }

// The kinds of the contract.
var (
	// Modify is the kind of [TypeModify] tasks, whose payload is a
	// [ModifyPayload].
	Modify = &Kind{Type: TypeModify, Name: "modify", Queue: QueueModify, Weight: 3, zero: ModifyPayload{},
		decode: func(b []byte) (Payload, error) {
			var p ModifyPayload
			if err := decode(b, &p); err != nil {
				return nil, err
			}
			return p, nil
		}}
	// Exchange is the kind of [TypeExchange] tasks, whose payload is an
	// [ExchangePayload].
	Exchange = &Kind{Type: TypeExchange, Name: "exchange", Queue: QueueExchange, Weight: 6, zero: ExchangePayload{},
		decode: func(b []byte) (Payload, error) {
			var p ExchangePayload
			if err := decode(b, &p); err != nil {
				return nil, err
			}
			return p, nil
		}}
)

// kinds is the table, in priority order.
var kinds = []*Kind{Exchange, Modify}

// Kinds returns every kind of the contract, highest default priority first.
// The slice is the caller's to keep; the kinds are shared.
func Kinds() []*Kind { return append([]*Kind(nil), kinds...) }

// KindOf returns the kind of task type typ, or nil when the contract has
// no such type.
func KindOf(typ string) *Kind {
	for _, k := range kinds {
		if k.Type == typ {
			return k
		}
	}
	return nil
}

// KindOfQueue returns the kind whose tasks go to queue, the kind's own
// queue or one of its shard queues ([Kind.ShardQueue], shard numbers below
// MaxShards), or nil.
func KindOfQueue(queue string) *Kind {
	k, _ := parseShardQueue(queue)
	return k
}

// Header is what every payload carries besides its kind's own fields.
type Header struct {
	// EventID is the upstream's idempotency key (see [ValidEventID]).
	EventID string
	// OrderNo is the order the task changes (see [ValidOrderNo]).
	OrderNo string
	// Seq is the task's position in its order's sequence, 0 for none.
	Seq int64
}

// Payload is the payload of a task of any kind: [ModifyPayload] or
// [ExchangePayload].
type Payload interface {
	// Kind returns the payload's kind.
	Kind() *Kind
	// Header returns the fields every payload has.
	Header() Header
	// WithHeader returns a copy of the payload carrying h's event ID, order
	// number and position.
	WithHeader(h Header) Payload
	// Validate checks the payload against the contract; see
	// [ModifyPayload.Validate].
	Validate() error
}

// Creator is implemented by the payloads whose task creates an order: an
// exchange creates its replacement. Changes of that order accepted after
// the task wait for the creation.
type Creator interface {
	// Creates returns the number of the order the task creates.
	Creates() string
}

var (
	_ Payload = ModifyPayload{}
	_ Payload = ExchangePayload{}
	_ Creator = ExchangePayload{}
)

// Kind returns [Modify].
func (p ModifyPayload) Kind() *Kind { return Modify }

// Header returns the payload's event ID, order number and position.
func (p ModifyPayload) Header() Header {
	return Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq}
}

// WithHeader returns p with h's event ID, order number and position.
func (p ModifyPayload) WithHeader(h Header) Payload {
	p.EventID, p.OrderNo, p.Seq = h.EventID, h.OrderNo, h.Seq
	return p
}

// Kind returns [Exchange].
func (p ExchangePayload) Kind() *Kind { return Exchange }

// Header returns the payload's event ID, order number and position.
func (p ExchangePayload) Header() Header {
	return Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq}
}

// WithHeader returns p with h's event ID, order number and position.
func (p ExchangePayload) WithHeader(h Header) Payload {
	p.EventID, p.OrderNo, p.Seq = h.EventID, h.OrderNo, h.Seq
	return p
}

// Creates returns the replacement order's number (see
// [ExchangePayload.Replacement]).
func (p ExchangePayload) Creates() string { return p.Replacement() }

// NewTask validates p and returns a task of p's kind carrying it as JSON.
// The encoding is deterministic: equal payloads give equal bytes. opts are
// passed to asynq.NewTask; NewTask sets no options of its own (the queue,
// task ID and retry policy are the producer's).
//
// It returns p's Validate error when p is invalid.
func NewTask(p Payload, opts ...asynq.Option) (*asynq.Task, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	b, err := Marshal(p)
	if err != nil {
		return nil, err
	}
	return asynq.NewTask(p.Kind().Type, b, opts...), nil
}

// Marshal returns p's JSON as a task carries it: the payload struct's
// fields in their order, "seq" left out when zero, and no HTML escaping
// (a "<" stays one byte, where encoding/json's default writes the six of
// "\u003c"; a task is no web page). Equal payloads give equal bytes. It does
// not validate p. Safe for concurrent use.
func Marshal(p Payload) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		// Unreachable: the payloads have only strings, ints and slices of them.
		return nil, fmt.Errorf("tasks: marshal %s: %w", p.Kind().Type, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// MaxRetry is the asynq MaxRetry of a task whose failure budget is budget:
// budget+1, where a negative budget counts as 0 (no retries). The
// worker retries a task whose handler failed at most budget times and then
// archives it itself; the spare retry is what keeps asynq from archiving a
// task that only waited (for a busy order, or for its turn) on its last
// allowed attempt, since asynq v0.25.1 archives any task that returns an
// error once its retries reach MaxRetry, before it asks whether the error
// was a failure. Hand-enqueued tasks should follow the same rule.
func MaxRetry(budget int) int { return max(budget, 0) + 1 }

// FailureBudget is the failure budget of a task enqueued with asynq MaxRetry
// maxRetry: maxRetry-1, and 0 for a maxRetry of 0 (such a task, enqueued by
// hand against the rule of [MaxRetry], is archived by asynq the first time
// it returns any error, even a wait).
func FailureBudget(maxRetry int) int { return max(maxRetry-1, 0) }
