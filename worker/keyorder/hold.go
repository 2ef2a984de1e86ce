package keyorder

import "context"

// Hold is a writer's hold of a key's lock, for a store whose data lives on
// the lock's own Redis (internal/orders/redisstore): it is that store's
// only tie to the lock. Given one (see [WithHold]), every write also
// refuses a fence older than the newest the lock has handed out
// (FenceKey), so a holder whose lease has passed to someone else cannot
// write even before the new holder's first write; and the script that
// commits a modify also releases the lock and passes the key's turn on
// (Handoff, with [CommitLua]'s lock_commit), which saves the release's
// round trip per task. An exchange, which writes again after closing the
// order, leaves the release to the caller. *Lease implements it. Other
// stores ignore it.
type Hold interface {
	// FenceKey returns the key of the lock's newest handed-out fence. It
	// must carry the key's hash tag ("{<key>}"), so that one script
	// touches one Cluster slot; "" means none.
	FenceKey() string
	// Handoff returns what the commit script needs to release the lock
	// and pass its turn on, or nil to leave the release to the caller. The
	// store calls its Committing before the script and its Released when
	// the script released the lock.
	Handoff() *Handoff
}

var _ Hold = (*Lease)(nil)

type holdKey struct{}

// WithHold returns a copy of ctx that offers the writer's lock hold to the
// store (see [Hold]). Stores that cannot use it ignore it, so a caller may
// offer it whatever the store. The write's fence still comes from the
// orders.Write in ctx.
func WithHold(ctx context.Context, hold Hold) context.Context {
	return context.WithValue(ctx, holdKey{}, hold)
}

// HoldFrom returns the [Hold] that ctx offers, if any.
func HoldFrom(ctx context.Context) (Hold, bool) {
	h, ok := ctx.Value(holdKey{}).(Hold)
	return h, ok
}
