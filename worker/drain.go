package worker

import "github.com/orderworker/orderworker/worker/keyorder"

// The drain of a hold.
//
// Only the head of an order waits in the queue: a change accepted behind
// unfinished changes of its order is parked (the producer puts its task in
// asynq's retry set, its position marked parked), and the change before it
// hands it the turn. When a run in its turn commits, and the order's next
// change is parked, the commit keeps the order's lock (the engine's drain,
// keyorder.RunnerConfig.DrainMax),
// and the engine's hold (the Runner's) takes that change's task
// out of asynq itself, runs it here in the same hold, with the same fence,
// as its own run (its log line, metrics, span and OnDone), records its end
// in asynq as asynq's processor would, and goes on for a quantum
// (Config.DrainMax and DrainFor; keyorder.RunnerConfig.DrainMax says how
// long it lasts and when the hold yields to other orders). On one Redis,
// a drained change's commit also takes the next change's task, in its own
// round trip (keyorder's "fold").
//
// A failure ends the hold (the commit of a failed run does not keep the
// lock), and the failed change backs off in asynq's retry set as a failing
// head does. A Worker killed mid-hold loses nothing: the changes it had
// taken are active in asynq with a lease, and the recoverer brings them
// back once the lease ends (Config.RecoverAfter past it); one it had
// applied replays (the store knows its event) and completes.

// The defaults of the drain's quantum: the engine's.
const (
	// DefaultDrainMax is the default of Config.DrainMax.
	DefaultDrainMax = keyorder.DefaultDrainMax
	// DefaultDrainFor is the default of Config.DrainFor.
	DefaultDrainFor = keyorder.DefaultDrainFor
)

// locateChange is the holds' Locate (RunnerConfig.HoldLocate): the
// placements of a change's task under Config.Shards (orderkeys.Locate). A
// replacement's creation, whose position is held by an exchange of
// another order, is no change to take in a hold.
func (w *Worker) locateChange(orderNo, label string) ([]string, string, bool) {
	if _, _, from, ok := w.kinds.ParseLabel(label); !ok || from != "" {
		return nil, "", false
	}
	return w.locate(orderNo, label)
}
