// Package kindsample holds one valid payload of every kind of the
// contract (tasks.Kinds), for the tests that go over the kinds table and
// need a task of each kind: the conformance test in cmd/producer, the
// trace tests in tasks, the sharded worker's test. A kind added to the
// table gets its sample here, once; TestEveryKindHasASample fails until
// it has one.
package kindsample

import (
	"fmt"

	"github.com/orderworker/orderworker/tasks"
)

// samples are the payloads, by task type, as JSON objects of the kind's
// own members only: no event_id, order_no, trace or seq (the CLI's -json
// and the intake's body). Each must be valid once an event ID and an order
// number are added, and must create no order the test did not name
// (an exchange's replacement number is derived from its order's).
var samples = map[string]string{
	tasks.TypeModify:   `{"changes":{"remark":"conformance"}}`,
	tasks.TypeExchange: `{"items":[{"sku":"B","qty":2}],"reason":"conformance"}`,
}

// JSON returns the sample of kind k, a JSON object of the kind's own
// members, and whether k has one (a kind outside the contract has none).
func JSON(k *tasks.Kind) (string, bool) {
	s, ok := samples[k.Type]
	return s, ok
}

// Payload returns the sample of kind k carrying eventID and orderNo,
// decoded by k and validated. It returns an error when k has no sample or
// the sample does not decode or validate.
func Payload(k *tasks.Kind, eventID, orderNo string) (tasks.Payload, error) {
	s, ok := JSON(k)
	if !ok {
		return nil, fmt.Errorf("kindsample: no sample of %s: add one to internal/testkit/kindsample", k.Type)
	}
	p, err := k.Decode([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("kindsample: the sample of %s: %w", k.Type, err)
	}
	p = p.WithHeader(tasks.Header{EventID: eventID, OrderNo: orderNo})
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("kindsample: the sample of %s: %w", k.Type, err)
	}
	return p, nil
}
