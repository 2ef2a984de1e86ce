package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// Kind is one task type of the contract: its type name, its queue, its
// default priority and how its payload is read. [Kinds] lists the
// contract's kinds, and every layer (producer, intake, CLI, worker,
// metrics) reads that one table instead of naming the types itself.
// Adding a task type means adding one file with its payload struct and its
// Kind (made with [NewKind], with its example: [WithExample]), its row in
// the table here, and its entry to the worker's table (worker.Kinds);
// docs/adding-a-task-type.md walks through it.
//
// A Kind is read-only; its methods are safe for concurrent use.
type Kind struct {
	// Type is the asynq task type, e.g. "order:modify".
	Type string
	// Name is the short name used in settings, HTTP routes, CLI commands
	// and logs, e.g. "modify".
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
	// example is the kind's example (see WithExample), or "".
	example string
}

// KindOption is an option of [NewKind]: [WithExample].
type KindOption func(*Kind)

// WithExample gives the kind an example request body, members: a JSON object
// of the kind's own members, without event_id, order_no, trace and seq,
// as the intake takes a request's body and the CLI its -json. With an
// event ID and an order number added it must be a valid payload of the
// kind, and a kind that creates orders must leave the number of the order
// it creates to be derived (an exchange's example names no new_order_no),
// so that the example on two orders creates two orders; [Table.Validate]
// checks both. [Kind.Example] returns it, [Kind.ExamplePayload] fills it
// in. The CLI's help shows it, and the tests that go over every kind (the
// conformance test, the store conformance suite, the intake's route
// tests) take it as the kind's request. Every kind of [Kinds] has one; a
// kind of a program's own works without, except in those tests.
func WithExample(members string) KindOption {
	return func(k *Kind) { k.example = members }
}

// NewKind returns the kind of task type typ whose payloads are of type P,
// named name, queued to queue with default weight weight, with opts
// applied (by default the kind has no example; see [WithExample]). P's
// Kind method must return the kind NewKind returned (the payload names its
// kind), and the kind must pass [Table.Validate] in its table. The
// contract's kinds are made with it, and so can a program (or a test) with
// a kind of its own, which it hands to the producer and the worker in
// their Config.
func NewKind[P Payload](typ, name, queue string, weight int, opts ...KindOption) *Kind {
	var zero P
	k := &Kind{Type: typ, Name: name, Queue: queue, Weight: weight, zero: zero,
		decode: func(b []byte) (Payload, error) {
			var p P
			if err := decode(b, &p); err != nil {
				return nil, err
			}
			return p, nil
		}}
	for _, opt := range opts {
		opt(k)
	}
	return k
}

// ErrNoExample is matched by the error of [Kind.ExamplePayload] for a
// kind made without [WithExample].
var ErrNoExample = errors.New("tasks: the kind has no example")

// Example returns the kind's example (see [WithExample]), a JSON object of
// the kind's own members, or "" when it has none.
func (k *Kind) Example() string { return k.example }

// ExamplePayload returns the kind's example (see [WithExample]) carrying
// eventID and orderNo, decoded and validated: a valid payload of the kind,
// for a test, a demo or a help text. It returns an error matching
// [ErrNoExample] when the kind has no example, and the error of
// [Kind.Parse] (matching [ErrInvalid]) when the example, eventID or
// orderNo is not valid.
func (k *Kind) ExamplePayload(eventID, orderNo string) (Payload, error) {
	if k.example == "" {
		return nil, fmt.Errorf("%s: %w (give it one with tasks.WithExample)", k.Type, ErrNoExample)
	}
	p, err := k.decode([]byte(k.example))
	if err != nil {
		return nil, fmt.Errorf("the example of %s: %w", k.Type, err)
	}
	p = p.WithHeader(Header{EventID: eventID, OrderNo: orderNo})
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("the example of %s: %w", k.Type, err)
	}
	return p, nil
}

// Decode decodes a payload of the kind strictly (see [Parse] for what
// strictly means) without validating it, for a caller that fills in fields
// before it validates (the HTTP intake takes order_no from the path). The
// error, when the JSON does not decode into the kind's payload, matches
// [ErrInvalid]; the payload is then nil.
func (k *Kind) Decode(b []byte) (Payload, error) { return k.decode(b) }

// Parse decodes a payload of the kind strictly and validates it, with the
// rules and errors of [Parse]. The payload is never nil: on an error it is
// what was decoded (the zero payload of the kind when the JSON did not
// decode), for logging only.
func (k *Kind) Parse(b []byte) (Payload, error) {
	p, err := k.decode(b)
	if err != nil {
		return k.zero, err
	}
	return p, p.Validate()
}

// String returns the kind's type.
func (k *Kind) String() string { return k.Type }

// kinds is the table, in priority order: the one list of the contract's
// kinds, each declared with its payload in a file of its own
// (tasks/<kind>.go).
var kinds = Table{Exchange, Modify}

// Kinds returns every kind of the contract, highest default priority first.
// The slice is the caller's to keep; the kinds are shared.
func Kinds() Table { return append(Table(nil), kinds...) }

// Table is a list of kinds: [Kinds], the contract's, or the kinds a
// producer or worker was configured with (the contract's and a program's
// own). Whatever reads a task type, a queue or a position label reads it
// against the Table it was configured with (the producer, the worker, the
// intake, the order views, the operator actions, the CLI and the
// dashboard each take one, defaulting to [Kinds]), so that a kind in it is
// read everywhere; the package has no lookup of its own that a configured
// kind would miss. A Table is
// not changed after it is made; its methods are safe for concurrent use.
type Table []*Kind

// Of returns the kind of task type typ, or nil.
func (t Table) Of(typ string) *Kind {
	for _, k := range t {
		if k.Type == typ {
			return k
		}
	}
	return nil
}

// Named returns the kind named name, or nil.
func (t Table) Named(name string) *Kind {
	for _, k := range t {
		if k.Name == name {
			return k
		}
	}
	return nil
}

// OfQueue returns the kind whose tasks go to queue, the kind's own queue
// or one of its shard queues, or nil.
func (t Table) OfQueue(queue string) *Kind {
	for _, k := range t {
		if _, ok := k.shardOf(queue); ok {
			return k
		}
	}
	return nil
}

// Types returns the kinds' types, in the table's order.
func (t Table) Types() []string {
	out := make([]string, len(t))
	for i, k := range t {
		out[i] = k.Type
	}
	return out
}

// Creator returns the kind of t whose payloads create orders (implement
// [Creator]: in [Kinds], [Exchange]), whose task a creation label names,
// or nil when t has none. A creation label does not carry its type, so a
// table may hold one such kind (Validate checks it).
func (t Table) Creator() *Kind {
	for _, k := range t {
		if _, ok := k.zero.(Creator); ok {
			return k
		}
	}
	return nil
}

// ErrKinds is matched by the errors of [Table.Validate].
var ErrKinds = errors.New("tasks: bad kinds table")

// Validate checks that every kind of t was made by [NewKind], has a type
// (without a space: a position label is "<type> <event_id>"), a name of
// a-z, 0-9, '_' and '-' (it is a URL path segment and a command), a queue
// without [ShardSep] or braces, and a positive weight; that no two kinds
// share a type, a name or a queue; and that at most one kind creates
// orders. A kind's example, when it has one (see [WithExample]), must
// give a valid payload with an event ID and an order number added, and,
// for a kind that creates orders, must not name the order it creates. A
// kind without an example passes. Its errors match [ErrKinds].
func (t Table) Validate() error {
	seen := map[string]bool{}
	for i, k := range t {
		switch {
		case k == nil || k.decode == nil:
			return fmt.Errorf("%w: kind %d was not made by NewKind", ErrKinds, i)
		case k.Type == "" || strings.ContainsAny(k.Type, " \t\r\n") || k.Type == labelCreate:
			return fmt.Errorf("%w: kind %d has type %q", ErrKinds, i, k.Type)
		case !plainName(k.Name):
			return fmt.Errorf("%w: %s has name %q, want 1 to 32 of a-z, 0-9, '_' and '-'", ErrKinds, k.Type, k.Name)
		case k.Queue == "" || strings.ContainsAny(k.Queue, ShardSep+"{} "):
			return fmt.Errorf("%w: %s has queue %q", ErrKinds, k.Type, k.Queue)
		case k.Weight <= 0:
			return fmt.Errorf("%w: %s has weight %d, want > 0", ErrKinds, k.Type, k.Weight)
		case k.zero.Kind() != k:
			return fmt.Errorf("%w: the payload of %s names kind %s", ErrKinds, k.Type, k.zero.Kind())
		case k.zero.WithHeader(probeHeader).Header() != probeHeader:
			return fmt.Errorf("%w: the payload of %s does not carry every field of its Header (event_id, order_no, seq, trace) through WithHeader and Header", ErrKinds, k.Type)
		}
		for _, key := range []string{"type " + k.Type, "name " + k.Name, "queue " + k.Queue} {
			if seen[key] {
				return fmt.Errorf("%w: two kinds have %s", ErrKinds, key)
			}
			seen[key] = true
		}
		if _, ok := k.zero.(Creator); ok && t.Creator() != k {
			return fmt.Errorf("%w: %s and %s both create orders; a creation label names one", ErrKinds, t.Creator(), k)
		}
		if err := k.checkExample(); err != nil {
			return fmt.Errorf("%w: %w", ErrKinds, err)
		}
	}
	return nil
}

// checkExample returns an error when k has an example that is not valid
// with an event ID and an order number added, or that names the order it
// creates: two requests of the example on two orders would create the
// same one.
func (k *Kind) checkExample() error {
	if k.example == "" {
		return nil
	}
	var created []string
	for _, no := range []string{"SO-EXAMPLE-1", "SO-EXAMPLE-2"} {
		p, err := k.ExamplePayload("example-1", no)
		if err != nil {
			return err
		}
		if c, ok := p.(Creator); ok {
			created = append(created, c.Creates())
		}
	}
	if len(created) == 2 && created[0] == created[1] {
		return fmt.Errorf("the example of %s creates order %s whatever its order: leave the order it creates to be derived", k.Type, created[0])
	}
	return nil
}

// probeHeader is the header Validate hands each kind's payload through
// WithHeader and reads back with Header: a payload that drops a field (a
// new kind without its trace context, say) would lose it silently.
var probeHeader = Header{EventID: "e", OrderNo: "o", Seq: 1, Trace: &TraceContext{Traceparent: "p"}}

// plainName reports whether s is 1 to 32 characters of a-z, 0-9, '_' and
// '-'.
func plainName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Header is what every payload carries besides its kind's own fields.
type Header struct {
	// EventID is the upstream's idempotency key (see [ValidEventID]).
	EventID string
	// OrderNo is the order the task changes (see [ValidOrderNo]).
	OrderNo string
	// Seq is the task's position in its order's sequence, 0 for none.
	Seq int64
	// Trace is the trace context of the change's acceptance, or nil.
	Trace *TraceContext
}

// Payload is the payload of a task of any kind: [ModifyPayload] or
// [ExchangePayload].
type Payload interface {
	// Kind returns the payload's kind.
	Kind() *Kind
	// Header returns the fields every payload has.
	Header() Header
	// WithHeader returns a copy of the payload carrying h's event ID, order
	// number, position and trace context.
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

// Body returns p's JSON object without its header's members (event_id,
// order_no, seq and trace, whatever names the kind gives them): the kind's
// own members, as the intake's route and the CLI's -json take them and as
// a store that forwards a change sends it. Its members are in sorted
// order, with no HTML escaping. It does not validate p. Safe for
// concurrent use.
func Body(p Payload) (json.RawMessage, error) {
	// The header's members are those whose values follow the header: two
	// payloads that differ only in their header differ exactly there.
	a, err := members(p.WithHeader(Header{EventID: "a", OrderNo: "a", Seq: 1, Trace: &TraceContext{Traceparent: "a"}}))
	if err != nil {
		return nil, err
	}
	b, err := members(p.WithHeader(Header{EventID: "b", OrderNo: "b", Seq: 2, Trace: &TraceContext{Traceparent: "b"}}))
	if err != nil {
		return nil, err
	}
	own := make(map[string]json.RawMessage, len(a))
	for k, v := range a {
		if w, ok := b[k]; ok && bytes.Equal(v, w) {
			own[k] = v
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(own); err != nil {
		return nil, fmt.Errorf("tasks: body of %s: %w", p.Kind().Type, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// members returns p's JSON object member by member.
func members(p Payload) (map[string]json.RawMessage, error) {
	b, err := Marshal(p)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("tasks: body of %s: %w", p.Kind().Type, err)
	}
	return m, nil
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

// DefaultMaxScheduleAhead is how far ahead of its acceptance a change with
// a position may be scheduled (asynq's ProcessIn or ProcessAt) by default:
// every later change of its order waits behind it until it has run. It is
// the default of the producers' bound (producer.Config.MaxScheduleAhead),
// which refuses a change scheduled further ahead, and of the workers'
// (worker.Config.MaxScheduleAhead), which bring forward the task of an
// order's next change found scheduled further ahead: it cannot have come
// from a producer with the same bound (a Redis user moved it, or a system
// that enqueues by hand broke this rule), and would hold its order until
// then. A system that enqueues by hand must keep to it.
const DefaultMaxScheduleAhead = 24 * time.Hour
