package keyorder

// Commit is the engine's hook for a store whose data lives on the lock's
// own Redis: the one way such a store reaches the key's lock and
// sequence, handed to it with the write ([Run].Commit, which the handler
// passes on to its store), never through the context.
//
// Given one, every write also refuses a fence older than the newest the
// lock has handed out (FenceKey), so a holder whose lease has passed to
// someone else cannot write even before the new holder's first write; and
// the script that commits the write's last step also releases the lock
// and passes the key's turn on (Handoff, with [CommitLua]'s lock_commit),
// which saves the release's round trip per task. A write with more steps
// after it leaves the release to the engine. *lease implements it. Stores
// that cannot use it ignore it.
type Commit interface {
	// FenceKey returns the key of the lock's newest handed-out fence. It
	// carries the key's hash tag ("{<key>}"), so that one script touches
	// one Cluster slot; "" means none.
	FenceKey() string
	// Handoff returns what the commit script needs to release the lock
	// and pass its turn on, or nil to leave the release to the engine. The
	// store calls its Committing before the script and its Released when
	// the script released the lock.
	Handoff() *Handoff
}

var _ Commit = (*lease)(nil)
