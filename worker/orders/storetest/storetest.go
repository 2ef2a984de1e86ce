// Package storetest is the conformance suite of the order store contract
// (package orders): [Run] checks that a store keeps every rule a Worker
// relies on, the way river's driver tests check a database driver. Every
// store of the module passes it (the Redis store, and the HTTP store over
// its reference upstream), and so should a store of your own (see
// examples/ownstore):
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) orders.Store { return mystore.New() })
//	}
//
// The rules are grouped by area, one file each: reads and puts (every
// store), fencing, dedupe, positions, and the rules of each write
// ([orders.Modifier], [orders.Exchanger], [orders.Annotator]). A rule
// runs only when the store implements the writes it needs, and is skipped
// (with the interface named) otherwise: a store that serves some kinds
// only passes the rules of its writes. The rules of every fenced write
// (no fence, an unknown order) run for each write the store implements.
//
// It checks behaviour only through the contract's interfaces. It does not
// check what a store may do its own way: the history entries' Detail
// text, the timestamps, how long dedupe records are kept, or whether a
// replay's Result.Order is the order as it is now or as the first
// application left it. Nor can it crash a store between the two halves of
// an exchange: a store that is not atomic there must test that a retry
// completes a half-done exchange itself (the Redis store does).
//
// storetest is for tests only; it imports testing.
package storetest

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/worker/orders"
)

// Run checks the store that newStore returns against the contract of
// package orders, in parallel subtests: the rules of orders.Store and of
// each write the store implements. newStore is called once per subtest,
// possibly from several goroutines at once; each call must return a store
// of its own that holds no orders (a fresh one, or one on its own key
// prefix or schema), cleaned up with t.Cleanup as needed.
func Run(t *testing.T, newStore func(t *testing.T) orders.Store) {
	t.Helper()
	for _, tt := range []struct {
		name string
		test func(t *testing.T, s orders.Store)
	}{
		// reads.go: every store.
		{"PutAndGet", testPutAndGet},
		{"PutInvalid", testPutInvalid},
		{"NotFound", testNotFound},
		{"HistoryPages", testHistoryPages},
		// fencing.go
		{"WriteWithoutFence", testWriteWithoutFence},
		{"StaleFenceRefused", testStaleFence},
		{"EqualFenceAllowed", testEqualFence},
		{"ConcurrentWrites", testConcurrent},
		// dedupe.go
		{"DedupeReturnsRecordedOutcome", testDedupe},
		{"DedupeAfterClose", testDedupeAfterClose},
		{"EventReusedIsConflict", testEventReused},
		{"PutKeepsFenceAndEvents", testPutKeeps},
		// positions.go
		{"OlderPositionPassed", testPassed},
		{"OlderPositionPassedExchange", testPassedExchange},
		{"SeqOutOfTurnNotRecorded", testOutOfTurn},
		// modify.go
		{"Modify", testModify},
		{"ModifyInvalid", testModifyInvalid},
		// exchange.go
		{"Exchange", testExchange},
		{"ExchangeDerivedNumber", testExchangeDerived},
		{"ExchangeRetryCompletes", testExchangeRetry},
		{"ExchangeRefusals", testExchangeRefusals},
		{"ExchangeStaleFenceRefused", testExchangeStale},
		{"ClosedOrderRefused", testClosed},
		// notes.go
		{"AnnotatorNotes", testAnnotate},
		{"AnnotatorKeepsWrites", testAnnotateKeepsWrites},
		{"AnnotatorKeepsWriteRules", testAnnotateKeepsRules},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.test(t, newStore(t))
		})
	}
}

// need returns s as the write interface W, or skips t, naming W: a rule
// of a write runs only for a store that implements it.
func need[W any](t *testing.T, s orders.Store) W {
	t.Helper()
	w, ok := s.(W)
	if !ok {
		t.Skipf("the store does not implement %s", reflect.TypeFor[W]())
	}
	return w
}

// write is one fenced write of the contract, as the rules of every fenced
// write make it: has reports whether a store implements it, and do makes
// a valid request of it on order no by event eventID. A write added to
// the contract adds its row to writes.
type write struct {
	name string
	has  func(s orders.Store) bool
	do   func(ctx context.Context, s orders.Store, eventID, no string) (orders.Result, error)
}

// implements reports whether s implements W.
func implements[W any](s orders.Store) bool {
	_, ok := s.(W)
	return ok
}

// writes are the contract's fenced writes.
var writes = []write{
	{"Modify", implements[orders.Modifier], func(ctx context.Context, s orders.Store, eventID, no string) (orders.Result, error) {
		return s.(orders.Modifier).Modify(ctx, eventID, no, orders.Changes{Remark: new("by " + eventID)})
	}},
	{"Exchange", implements[orders.Exchanger], func(ctx context.Context, s orders.Store, eventID, no string) (orders.Result, error) {
		return s.(orders.Exchanger).Exchange(ctx, eventID, no, orders.Exchange{Items: newItems, NewOrderNo: no + "-X"})
	}},
}

// eachWrite runs f in a subtest for each write of the contract that s
// implements; the others' subtests are skipped.
func eachWrite(t *testing.T, s orders.Store, f func(t *testing.T, w write)) {
	t.Helper()
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			if !w.has(s) {
				t.Skipf("the store does not implement the %s write", w.name)
			}
			f(t, w)
		})
	}
}

// baseFence is a realistic fence: the lock hands out microseconds of the
// Redis clock.
var baseFence = time.Now().UnixMicro()

// At returns t's context with the Write a worker's run gives its store:
// fence, position seq (0 for none), the worker "storetest" and the time it
// started. A store's own tests use it, as the suite does.
func At(t *testing.T, fence, seq int64) context.Context {
	return orders.WithWrite(t.Context(), orders.Write{Fence: fence, Seq: seq, Worker: "storetest", StartedAt: time.Now()})
}

// Fenced is At without a position.
func Fenced(t *testing.T, fence int64) context.Context { return At(t, fence, 0) }

var (
	oldItems = []orders.Item{{SKU: "shirt-m", Qty: 1}}
	newItems = []orders.Item{{SKU: "shirt-l", Qty: 2}}
)

// Seed puts an active order no into s (address "1 Old Street", remark
// "ring twice", one shirt-m) and returns it as s holds it; it fails t on
// an error.
func Seed(t *testing.T, s orders.Store, no string) orders.Order {
	t.Helper()
	require.NoError(t, s.Put(t.Context(), orders.Order{No: no, Address: "1 Old Street", Remark: "ring twice", Items: oldItems}))
	return get(t, s, no)
}

func get(t *testing.T, s orders.Store, no string) orders.Order {
	t.Helper()
	o, err := s.Get(t.Context(), no)
	require.NoError(t, err)
	return o
}

func history(t *testing.T, s orders.Store, no string) []orders.Entry {
	t.Helper()
	h, err := orders.AllHistory(t.Context(), s, no)
	require.NoError(t, err)
	return h
}
