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
// ([orders.Modifier], [orders.Exchanger], [orders.Annotator]). Each file
// registers its own rules (see rules), and the forwarding of its write
// (see forwards), so that a write added to the contract adds its file
// and edits none. A rule runs only when the store serves the writes it
// needs, by its own method or, for a store that forwards changes
// (orders.Forwarder, as the HTTP store forwards a kind it has no write
// for), by forwarding them: a forwarding store is held to each kind's own
// rules through the system it forwards to. Otherwise the rule is skipped
// (with the interface named): a store that serves some kinds only passes
// the rules of its writes.
//
// The rules of every fenced write (no fence, an unknown order, an event
// ID reused) run for each kind of the worker's table (worker.Kinds, or
// the kinds given to [RunKinds]) whose write the store implements: they
// apply the kind's example (tasks.WithExample) through the kind's
// handler (worker.Kind.Apply), as a Worker would, so a kind added to the
// table is covered with no edit here.
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
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// Run checks the store that newStore returns against the contract of
// package orders, in parallel subtests: the rules of orders.Store and of
// each write the store implements, the rules of every fenced write for
// each kind of worker.Kinds() whose write it implements. newStore is
// called once per subtest, possibly from several goroutines at once; each
// call must return a store of its own that holds no orders (a fresh one,
// or one on its own key prefix or schema), cleaned up with t.Cleanup as
// needed.
func Run(t *testing.T, newStore func(t *testing.T) orders.Store) {
	t.Helper()
	RunKinds(t, newStore, worker.Kinds())
}

// RunKinds is [Run] with the rules of every fenced write run for each of
// kinds whose write the store implements, rather than for worker.Kinds():
// a program with kinds of its own passes the list it gives its Worker
// (Config.Kinds), so that its writes are held to the rules too. Each
// kind's write is made with the kind's example (tasks.WithExample); a
// kind whose write the store implements and that has no example fails
// its subtests.
func RunKinds(t *testing.T, newStore func(t *testing.T) orders.Store, kinds []worker.Kind) {
	t.Helper()
	ws := make([]write, len(kinds))
	for i, k := range kinds {
		ws[i] = write{k}
	}
	seen := map[string]bool{}
	for _, r := range suite {
		if seen[r.name] || (r.test == nil) == (r.ofWrites == nil) {
			t.Fatalf("storetest: rule %q is registered twice, or with both or neither of test and ofWrites", r.name)
		}
		seen[r.name] = true
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			if r.ofWrites != nil {
				r.ofWrites(t, newStore(t), ws)
				return
			}
			r.test(t, newStore(t))
		})
	}
}

// rule is one rule of the suite, a subtest of Run named name: test
// checks it on a fresh store, or, for a rule of every fenced write,
// ofWrites does, given the fenced writes the suite runs with (see
// eachWrite). Exactly one of test and ofWrites is set.
type rule struct {
	name     string
	test     func(t *testing.T, s orders.Store)
	ofWrites func(t *testing.T, s orders.Store, ws []write)
}

// suite is every rule registered with rules, in the order of
// registration.
var suite []rule

// rules registers rs, the rules of one area, with the suite: each file of
// the suite registers its own, in a package-level
//
//	var _ = rules(rule{name: "Modify", test: testModify}, ...)
//
// Run runs them in the order of registration: the go command hands a
// package's files to the compiler sorted by name, and package variables
// are initialised file by file in that order, so the rules run in the
// order of their files' names, then of their declaration in the file,
// the same on every run. It returns the number of rules registered so
// far. Names are unique; Run fails on a name registered twice.
func rules(rs ...rule) int {
	suite = append(suite, rs...)
	return len(suite)
}

// need returns s as the write interface W: s itself when it implements
// W; for a store that forwards changes (orders.Forwarder) and lacks W,
// W made of its Forward (see forwards), as a Worker serves such a store
// the kind; otherwise it skips t, naming W. So a rule of a write runs for
// every store that serves the write, by its own method or by forwarding.
// It fails t for a forwarding store and the write of a kind of
// worker.Kinds() that storetest has no forwarding of: a kind's rules
// come with it.
func need[W any](t *testing.T, s orders.Store) W {
	t.Helper()
	if w, ok := s.(W); ok {
		return w
	}
	wt := reflect.TypeFor[W]()
	if f, ok := s.(orders.Forwarder); ok {
		if mk, ok := forwarders[wt]; ok {
			return mk(s, f).(W)
		}
		for _, k := range worker.Kinds() {
			if k.Write() == wt {
				t.Fatalf("storetest: the store forwards %s, and storetest has no forwarding of %s: register one with forwards beside the kind's rules", k.Kind, wt)
			}
		}
	}
	t.Skipf("the store does not implement %s", wt)
	var zero W
	return zero
}

// forwarders holds, by write interface, the write that forwards makes of
// a forwarding store.
var forwarders = map[reflect.Type]func(s orders.Store, f orders.Forwarder) any{}

// forwards registers mk, which makes the write W of a store that
// forwards changes (s, which is f) from its Forward: each file of a
// kind's rules registers the forwarding of the kind's write beside its
// rules, in a package-level
//
//	var _ = forwards(func(s orders.Store, f orders.Forwarder) orders.Modifier { return forwardedModify{s, f} })
//
// so that a forwarding store is held to the kind's own rules (see need).
// It returns the number of writes registered so far.
func forwards[W any](mk func(s orders.Store, f orders.Forwarder) W) int {
	forwarders[reflect.TypeFor[W]()] = func(s orders.Store, f orders.Forwarder) any { return mk(s, f) }
	return len(forwarders)
}

// forward passes payload p's change on to f, as a Worker forwards a task
// of a kind whose write its store lacks: the kind's type and name, the
// header's event ID and order number, and the payload's own members
// (tasks.Body).
func forward(ctx context.Context, f orders.Forwarder, p tasks.Payload) (orders.Result, error) {
	k, h := p.Kind(), p.Header()
	body, err := tasks.Body(p)
	if err != nil {
		return orders.Result{}, err
	}
	return f.Forward(ctx, orders.Change{Type: k.Type, Name: k.Name, EventID: h.EventID, OrderNo: h.OrderNo, Body: body})
}

// write is the fenced write of one kind, as the rules of every fenced
// write make it: the kind's handler (worker.Kind.Apply) applying the
// kind's example.
type write struct {
	kind worker.Kind
}

// name is the write's kind's name, its subtest's name.
func (w write) name() string { return w.kind.Kind.Name }

// has reports whether s implements the kind's write. It fails t when the
// kind's entry is not one a Worker would take (see worker.Kind.Check).
func (w write) has(t *testing.T, s orders.Store) bool {
	t.Helper()
	err := w.kind.Check(s)
	if errors.Is(err, worker.ErrNoWrite) {
		return false
	}
	require.NoError(t, err)
	return true
}

// payload returns the kind's example as a request by event eventID on
// order no, failing t when the kind has no valid example.
func (w write) payload(t *testing.T, eventID, no string) tasks.Payload {
	t.Helper()
	p, err := w.kind.Kind.ExamplePayload(eventID, no)
	require.NoError(t, err, "the rules of every fenced write make a request of %s from its example", w.kind.Kind)
	return p
}

// do makes the write of the kind's example, by event eventID on order no,
// under ctx, and returns the store's error.
func (w write) do(t *testing.T, ctx context.Context, s orders.Store, eventID, no string) error {
	t.Helper()
	return w.kind.Apply(ctx, s, w.payload(t, eventID, no))
}

// creates returns the order that do(eventID, no) creates, or "" when the
// kind creates none (see tasks.Creator).
func (w write) creates(t *testing.T, eventID, no string) string {
	t.Helper()
	if c, ok := w.payload(t, eventID, no).(tasks.Creator); ok {
		return c.Creates()
	}
	return ""
}

// createdNothing fails t when the order that w's request by event eventID
// on order no would create (an exchange's replacement) exists.
func createdNothing(t *testing.T, s orders.Store, w write, eventID, no string) {
	t.Helper()
	if c := w.creates(t, eventID, no); c != "" {
		_, err := s.Get(t.Context(), c)
		assert.ErrorIs(t, err, orders.ErrNotFound, "the refused %s left order %s behind", w.kind.Kind, c)
	}
}

// eachWrite runs f in a subtest, named by the kind, for each write of ws
// that s implements; the others' subtests are skipped.
func eachWrite(t *testing.T, s orders.Store, ws []write, f func(t *testing.T, w write)) {
	t.Helper()
	for _, w := range ws {
		t.Run(w.name(), func(t *testing.T) {
			if !w.has(t, s) {
				t.Skipf("the store does not implement the write of %s (%s)", w.kind.Kind, w.kind.Write())
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
