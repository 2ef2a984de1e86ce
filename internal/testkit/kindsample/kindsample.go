// Package kindsample reads the example of a kind (tasks.WithExample) the
// way the tests that go over the kinds table used to read a sample kept
// here. The examples now live with their kinds (tasks/<kind>.go), so a
// kind added to the table edits nothing here; new tests call the kind's
// Example and ExamplePayload directly. tasks.TestEveryKindHasAnExample
// checks that every kind of the contract has one.
package kindsample

import (
	"github.com/orderworker/orderworker/tasks"
)

// JSON returns the example of kind k (tasks.Kind.Example), a JSON object
// of the kind's own members, and whether k has one (a kind made without
// tasks.WithExample has none).
func JSON(k *tasks.Kind) (string, bool) {
	s := k.Example()
	return s, s != ""
}

// Payload returns the example of kind k carrying eventID and orderNo,
// decoded by k and validated (tasks.Kind.ExamplePayload). It returns an
// error when k has no example (matching tasks.ErrNoExample) or the
// example does not decode or validate.
func Payload(k *tasks.Kind, eventID, orderNo string) (tasks.Payload, error) {
	return k.ExamplePayload(eventID, orderNo)
}
