package redisstore

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/orderworker/orderworker/worker/orders"
)

// writeKind is the store's plumbing of one kind of write, in one
// declaration made with declare beside the write: the letter its records
// and history entries carry, how its entries' detail reads, the request
// its fingerprint hashes, and whether its applyScript is the last step of
// its work. Every reader of a record or an entry (decodeEntry,
// parseRecord, record.String, apply) reads the declaration, never a
// switch of its own. The write of a task kind (tasks.Kinds) is declared
// under the kind's type, and TestEveryKindHasADeclaration fails for a
// kind without one; TestEveryKindCommitsInItsLastStep fails for a wrong
// step.
type writeKind struct {
	// typ is the history entry's type (orders.TypeModify, ...): for the
	// write of a task kind, the kind's task type. It keys writeKinds.
	typ string
	// letter is the kind's first letter in a record ("<letter> <fp>")
	// and its field in a history entry (see decodeEntry). Letters are
	// part of the stored data: never reuse or change one.
	letter byte
	// detail returns an entry's Detail from the detail the entry stores;
	// e is the entry as decoded so far (its event ID is set).
	detail func(e orders.Entry, stored string) string
	// request is the type whose JSON the kind's fingerprint hashes (see
	// fingerprint); nil for a write that records no event (a put, a
	// note).
	request reflect.Type
	// step says whether the write's applyScript is the last step of its
	// work (see step); noStep for a write that runs no applyScript.
	step step
	// carries says the record also holds the replacement's number and the
	// fence it was closed under (the close of an exchange).
	carries bool
}

// step says whether a write's applyScript is the last step of its work,
// which then commits the lock's hand-off in the same script (see
// applyScript: the release and the pass of the turn ride in the write's
// round trip), or whether more steps follow (an exchange still creates
// the replacement after it closes the order), and the worker passes the
// turn on after them. Every write that runs applyScript declares it; a
// write declared with noStep is refused by apply.
type step int8

const (
	noStep    step = iota // the write runs no applyScript
	lastStep              // the write's work ends with its applyScript: commit the hand-off in it
	moreSteps             // more steps follow: the worker passes the turn on after them
)

// writeKinds holds every declaration, by type.
var writeKinds = map[string]*writeKind{}

// declare registers wk under its type and returns it, for the write to
// use. It is called once per kind, in a package-level var beside the
// write; TestWriteKindsAreDistinct checks types and letters are unique.
func declare(wk writeKind) *writeKind {
	p := &wk
	writeKinds[wk.typ] = p
	return p
}

// kindOfLetter returns the declaration whose letter is c, or nil.
func kindOfLetter(c byte) *writeKind {
	for _, wk := range writeKinds {
		if wk.letter == c {
			return wk
		}
	}
	return nil
}

// fingerprint returns the fingerprint of req, a value of the kind's
// request type (see the package-level fingerprint). It returns an error
// for a value of another type: the kind's write and its declaration
// disagree.
func (wk *writeKind) fingerprint(req any) (string, error) {
	if wk.request == nil || reflect.TypeOf(req) != wk.request {
		return "", fmt.Errorf("redisstore: the fingerprint of %s hashes a %v, not a %T", wk.typ, wk.request, req)
	}
	return fingerprint(req), nil
}

// record returns the record of an event of the kind with fingerprint fp;
// newNo and fence are kept only by a kind that carries them.
func (wk *writeKind) record(fp, newNo, fence string) record {
	r := record{kind: wk, fp: fp}
	if wk.carries {
		r.newNo, r.fence = newNo, fence
	}
	return r
}

// record is what the store remembers of an applied event, to answer a
// repeat: "<letter> <fingerprint>", and for a kind that carries them
// also the replacement's number and the fence it was closed under.
type record struct {
	kind  *writeKind
	fp    string
	newNo string
	fence string
}

// String encodes the record as the buckets hold it.
func (r record) String() string {
	s := string(r.kind.letter) + " " + r.fp
	if r.kind.carries {
		s += " " + r.newNo + " " + r.fence
	}
	return s
}

// parseRecord reads a record and checks that it is the outcome of the same
// request: the same kind (want) and fingerprint.
func parseRecord(s string, want *writeKind, fp, eventID string) (record, error) {
	f := strings.Fields(s)
	if len(f) < 2 || len(f[0]) != 1 {
		return record{}, fmt.Errorf("event %s: bad record %q", eventID, s)
	}
	wk := kindOfLetter(f[0][0])
	if wk != want {
		name := f[0]
		if wk != nil {
			name = wk.typ
		}
		return record{}, fmt.Errorf("event %s was already applied as %s: %w", eventID, name, orders.ErrConflict)
	}
	r := record{kind: wk, fp: f[1]}
	if wk.carries && len(f) == 4 {
		r.newNo, r.fence = f[2], f[3]
	}
	if r.fp != fp {
		return record{}, fmt.Errorf("event %s was already applied with a different request: %w", eventID, orders.ErrConflict)
	}
	return r, nil
}
