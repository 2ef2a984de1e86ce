// Package testkind is a kind of change that only tests know,
// test:custom-kind: it cancels an order, with a reason, the way
// docs/adding-a-task-type.md's order:cancel does. Its type, name and queue
// are the tests' own (no real kind takes a "test" name), so that a real
// kind added to the table never clashes with it, and its queue,
// test_custom_kind, spreads over three cluster masters
// (tasks.TestShardsSpreadOverThreeMasters). A test hands [Kind] to the
// producer and the worker in their configuration, with a worker entry of
// its own (worker.NewKind with the handler it needs).
//
// It is test support: only _test.go files import it (the lint's depguard
// rules enforce that).
package testkind

import (
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/tasks"
)

// Payload is the payload of [Kind]. Seq is its last field, as in the
// contract's payloads (the producer appends the position to the JSON).
type Payload struct {
	EventID string              `json:"event_id"`
	OrderNo string              `json:"order_no"`
	Reason  string              `json:"reason"`
	Trace   *tasks.TraceContext `json:"trace,omitempty"`
	Seq     int64               `json:"seq,omitempty"`
}

// Kind is test:custom-kind, named test-custom-kind (its intake route and
// CLI command), queued to test_custom_kind with weight 4.
var Kind = tasks.NewKind[Payload]("test:custom-kind", "test-custom-kind", "test_custom_kind", 4,
	tasks.WithExample(`{"reason":"customer asked"}`))

// Kind returns [Kind].
func (p Payload) Kind() *tasks.Kind { return Kind }

// Header returns the fields every payload has.
func (p Payload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}

// WithHeader returns p with h's fields.
func (p Payload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}

// Validate returns an error matching tasks.ErrInvalid and asynq.SkipRetry
// unless p has a valid event ID and order number and a reason.
func (p Payload) Validate() error {
	if !tasks.ValidEventID(p.EventID) || !tasks.ValidOrderNo(p.OrderNo) || p.Reason == "" {
		return fmt.Errorf("%w: %s needs an event ID, an order number and a reason: %w", tasks.ErrInvalid, Kind, asynq.SkipRetry)
	}
	return nil
}
