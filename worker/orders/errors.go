package orders

import (
	"errors"
	"fmt"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// staleFence is [ErrStaleFence]: the order domain's name for the engine's
// keyorder.ErrStaleFence.
type staleFence struct{}

func (staleFence) Error() string { return "orders: stale fence" }

// Is reports whether target is keyorder.ErrStaleFence.
func (staleFence) Is(target error) bool { return target == keyorder.ErrStaleFence }

var (
	// ErrNotFound is returned when the order does not exist.
	ErrNotFound = errors.New("orders: order not found")

	// ErrStaleFence is returned by a write whose fence is older than the
	// newest fence the store has seen for the order: the writer's lock has
	// passed to someone else. Nothing was written. The work must run again
	// under a fresh lock, so it is not [Permanent]. It also matches the
	// engine's keyorder.ErrStaleFence, which counts it as no failure.
	ErrStaleFence error = staleFence{}

	// ErrClosed is returned by a write to an order that is exchanged or
	// cancelled. The error is a [*ClosedError], which names the replacement.
	ErrClosed = errors.New("orders: order is closed")

	// ErrPassed is returned by a write with a position in its order's
	// sequence ([Write.Seq]) that is not after the newest position applied
	// to the order: applying it now would undo a later word, or apply a
	// change twice. Nothing was written. It is [Permanent]. A repeat of an
	// applied event is answered as a replay instead, as long as its dedupe
	// record is kept.
	ErrPassed = errors.New("orders: the order is past this position")

	// ErrNoFence is returned by Modify and Exchange when the context carries
	// no [Write] or its Fence is not positive. The store never writes
	// unfenced.
	ErrNoFence = errors.New("orders: write without a fence")

	// ErrConflict is returned when a write contradicts what the store holds:
	// the replacement order number of an exchange is taken by an unrelated
	// order (or claimed by another exchange), or the event ID was already
	// applied with a different type or different changes.
	ErrConflict = errors.New("orders: conflict")

	// ErrInvalid is returned for a request that can never succeed as given:
	// a malformed order number, an empty event ID, an exchange without
	// items, an item without SKU or with a quantity below 1.
	ErrInvalid = errors.New("orders: invalid request")
)

// WithNewest returns err, a store's refusal of a write (one that matches
// [ErrStaleFence] or [ErrPassed]), telling the order's newest fence and its
// newest applied position (0 for not known). The text and the matches of
// err stay. Every store returns its refusals so: after a failover of the
// worker's Redis that lost the newest positions and fences, the worker
// learns from them where the store stands and writes again above it at
// once, rather than archiving a change it never applied as passed, or
// waiting until the promoted Redis's clock passes the old fences (see
// keyorder.StoreAhead). The conformance suite checks it.
func WithNewest(err error, fence, seq int64) error {
	return keyorder.WithAhead(err, keyorder.StoreAhead{Fence: fence, Pos: seq})
}

// Newest returns what a store's refusal err tells of the order's newest
// fence and applied position ([WithNewest]); zeros when it tells nothing.
func Newest(err error) (fence, seq int64) {
	if a := keyorder.AheadOf(err); a != nil {
		return a.Fence, a.Pos
	}
	return 0, 0
}

// ClosedError is the error of a write to a closed order. It matches
// [ErrClosed] with errors.Is.
type ClosedError struct {
	// OrderNo is the closed order.
	OrderNo string
	// Status is its status: exchanged or cancelled.
	Status Status
	// ExchangedTo is the replacement order, if any.
	ExchangedTo string
}

// Error names the order, its status and its replacement.
func (e *ClosedError) Error() string {
	if e.ExchangedTo != "" {
		return fmt.Sprintf("orders: order %s is %s; its replacement is order %s", e.OrderNo, e.Status, e.ExchangedTo)
	}
	return fmt.Sprintf("orders: order %s is %s", e.OrderNo, e.Status)
}

// Is reports whether target is [ErrClosed].
func (e *ClosedError) Is(target error) bool { return target == ErrClosed }

// Permanent reports whether retrying the operation that returned err can
// never help: true for ErrNotFound, ErrClosed, ErrConflict, ErrPassed,
// ErrNoFence and ErrInvalid. It is false for nil, ErrStaleFence (the work must run again
// under a fresh lock), context errors and Redis or network errors.
func Permanent(err error) bool {
	for _, target := range []error{ErrNotFound, ErrClosed, ErrConflict, ErrPassed, ErrNoFence, ErrInvalid} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
