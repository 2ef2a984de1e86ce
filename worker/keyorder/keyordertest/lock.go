package keyordertest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/internal/lockhook"
)

// Locker takes keys' locks by hand, on a real Redis, outside a Runner: a
// test holds a key so that a Runner finds it busy, or hands a store a
// [Lease] as the [keyorder.Commit] of a write, as a Runner's [keyorder.Run]
// does. Its locks are the engine's (fenced, self-renewing, woken by
// release notices), with every default. It is safe for concurrent use.
type Locker struct {
	l lockhook.Locker
}

// NewLocker returns a Locker of seq's keys. It returns an error when seq
// is nil. Close it when done.
func NewLocker(seq *keyorder.Sequencer) (*Locker, error) {
	if seq == nil {
		return nil, errors.New("keyordertest: NewLocker needs a Sequencer")
	}
	l, err := lockhook.NewLocker(seq)
	if err != nil {
		return nil, err
	}
	return &Locker{l: l}, nil
}

// Acquire takes key's lock for holder (the meta a Runner's head reports),
// waiting for it as a Runner's default does, and returns its lease, renewed
// until released. It returns the engine's error (matching
// [keyorder.ErrBusy] when the key stayed held past the wait's deadline).
func (l *Locker) Acquire(ctx context.Context, key, holder string) (*Lease, error) {
	return leaseOf(l.l.Acquire(ctx, key, holder))
}

// AcquireTurn takes key's lock in the turn of position pos, reserved under
// label (what the position's task carries), waiting up to deadline for the
// turn, as a Runner does for a task. The turn passes on only with a store's
// commit given the lease ([Lease.Handoff]) or a [Lease.Finish]; a lease
// released without either leaves pos the head, as a Runner's task that
// did not finish.
func (l *Locker) AcquireTurn(ctx context.Context, key, holder string, pos int64, label string, deadline time.Duration) (*Lease, error) {
	return leaseOf(l.l.AcquireTurn(ctx, key, holder, pos, label, deadline))
}

// Close ends the Locker's release-notice subscription. Its leases stay
// held until released or expired.
func (l *Locker) Close() error { return l.l.Close() }

// Lease is a held lock, taken by a [Locker]. It is a [keyorder.Commit]:
// a store given it with a write checks the lock's newest fence and may
// pass the turn on in its commit script. It is safe for concurrent use.
type Lease struct {
	l engineLease
}

// engineLease is what a Lease uses of the engine's lease.
type engineLease interface {
	keyorder.Commit
	Fence() int64
	Finish()
	Release(ctx context.Context) error
}

var _ keyorder.Commit = (*Lease)(nil)

func leaseOf(v any, err error) (*Lease, error) {
	if err != nil {
		return nil, err
	}
	l, ok := v.(engineLease)
	if !ok {
		return nil, fmt.Errorf("keyordertest: the engine's lease is a %T", v)
	}
	return &Lease{l: l}, nil
}

// Fence returns the lease's fencing token, strictly greater than any
// handed out for its key before.
func (l *Lease) Fence() int64 { return l.l.Fence() }

// FenceKey returns the key of the lock's newest handed-out fence
// ([keyorder.Commit]).
func (l *Lease) FenceKey() string { return l.l.FenceKey() }

// Handoff returns what a store's commit script needs to release the lock
// and pass its turn on ([keyorder.Commit]).
func (l *Lease) Handoff() *keyorder.Handoff { return l.l.Handoff() }

// Finish says that the work of the lease's position is done, as a
// Runner's run that ended: Release then passes the turn on to the next
// position. Without it (and without a store's commit) the position stays
// the head. It matters only for a lease taken with AcquireTurn.
func (l *Lease) Finish() { l.l.Finish() }

// Release releases the lock (a no-op when a store's commit already did)
// and stops its renewal. It returns an error when the lock was no longer
// this lease's (it expired, and someone else may hold it).
func (l *Lease) Release(ctx context.Context) error { return l.l.Release(ctx) }
