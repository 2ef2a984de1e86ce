// Package lockhook lets package keyordertest take a key's lock by hand in
// other packages' tests, although the lock (keyorder's locker and lease) is
// behind keyorder's package line: package keyorder sets NewLocker when it
// is initialised. Nothing else may use it.
package lockhook

import (
	"context"
	"time"
)

// Locker is a keyorder locker as keyordertest uses it. Acquire and
// AcquireTurn return the engine's lease, which keyordertest asserts to the
// methods it needs (Fence, FenceKey, Handoff, Release).
type Locker interface {
	Acquire(ctx context.Context, key, holder string) (any, error)
	AcquireTurn(ctx context.Context, key, holder string, pos int64, label string, deadline time.Duration) (any, error)
	Close() error
}

// NewLocker returns a locker with every default on seq, a
// *keyorder.Sequencer. Package keyorder sets it.
var NewLocker func(seq any) (Locker, error)
