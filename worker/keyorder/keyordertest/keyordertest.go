// Package keyordertest runs a handler written for a keyorder Runner in a
// unit test, without asynq's server or Redis: [Run] gives the handler a
// [keyorder.Run] in its context, as [keyorder.Runner.Handler] would, so
// that handler code calling [keyorder.RunFrom] (for the key, position and
// fence its store checks) runs as it does under a Runner.
//
// It tests the handler, not the engine: there is no lock, no turn, no
// lease that renews or is lost, and the Commit hook hands nothing off.
// The engine's own guarantees are tested in package keyorder, against a
// real Redis. A test that needs a real lock outside a Runner (a key held
// by someone else, a store's commit that passes the turn on) takes it
// with [NewLocker], on a real Redis. It is for tests only.
package keyordertest

import (
	"context"
	"sync/atomic"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/internal/runctx"
)

// Context returns ctx carrying run, as a Runner's handler's context does:
// [keyorder.RunFrom] of it returns run as given. [Run] fills run's
// defaults first; Context does not.
func Context(ctx context.Context, run keyorder.Run) context.Context {
	return context.WithValue(ctx, runctx.Key{}, run)
}

// Run runs h on t with run in its context ([Context]) and returns the run
// the handler was given and h's error. Zero fields of run default: Key to
// "key", Pos to 1, Fence to 1, Mode to [keyorder.ModeTurn], Commit to a
// new [*Commit]; Record is true in ModeTurn (as under a Runner) and as
// given otherwise. Run calls h once, on the caller's goroutine.
func Run(ctx context.Context, h asynq.Handler, t *asynq.Task, run keyorder.Run) (keyorder.Run, error) {
	if run.Key == "" {
		run.Key = "key"
	}
	if run.Pos == 0 {
		run.Pos = 1
	}
	if run.Fence == 0 {
		run.Fence = 1
	}
	if run.Mode == "" {
		run.Mode = keyorder.ModeTurn
	}
	run.Record = run.Record || run.Mode == keyorder.ModeTurn
	if run.Commit == nil {
		run.Commit = &Commit{}
	}
	return run, h.ProcessTask(Context(ctx, run), t)
}

// Commit is a [keyorder.Commit] for a handler under test: it names no
// fence key ("") and hands nothing off (nil), so that a store given it
// leaves the lock to the engine, and counts the calls. It is safe for
// concurrent use; the zero value is ready.
type Commit struct {
	fenceKeys, handoffs atomic.Int64
}

var _ keyorder.Commit = (*Commit)(nil)

// FenceKey returns "" (no fence key) and counts the call.
func (c *Commit) FenceKey() string {
	c.fenceKeys.Add(1)
	return ""
}

// Handoff returns nil (the release is the engine's) and counts the call.
func (c *Commit) Handoff() *keyorder.Handoff {
	c.handoffs.Add(1)
	return nil
}

// Calls returns how many times FenceKey and Handoff were called.
func (c *Commit) Calls() (fenceKeys, handoffs int64) {
	return c.fenceKeys.Load(), c.handoffs.Load()
}
