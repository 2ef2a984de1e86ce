package main

import (
	"slices"
	"sync"
	"time"

	"github.com/orderworker/orderworker/worker"
)

// waits collects how long tasks waited for their order's lock: every wait,
// and the wait of the run that got the lock, by event ID; and how many runs
// there were, and why a run went back to its queue. It is safe for
// concurrent use.
type waits struct {
	mu           sync.Mutex
	d            []time.Duration
	byEvent      map[string]time.Duration
	n            int64 // runs
	parked, busy int64 // runs that went back to their queue: not their turn; lock held past the deadline
}

func newWaits() *waits { return &waits{byEvent: map[string]time.Duration{}} }

// add records a wait; locked says the run got the lock.
func (w *waits) add(event string, d time.Duration, locked bool) {
	w.mu.Lock()
	w.n++
	w.d = append(w.d, d)
	if locked {
		w.byEvent[event] = d
	}
	w.mu.Unlock()
}

// of returns the wait of the run of event that got the lock.
func (w *waits) of(event string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d, ok := w.byEvent[event]
	return d, ok
}

// sorted returns the waits collected so far, shortest first.
func (w *waits) sorted() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(slices.Values(w.d))
}

// runs returns how many runs were recorded, and how many of them went back
// to their queue because it was not their turn (parked) or the lock stayed
// held past the wait deadline (busy).
func (w *waits) runs() (n, parked, busy int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.parked, w.busy
}

// done records one run of (b)'s or (b0)'s worker, from its OnDone, and the
// lock wait of every run that took the lock, or went back to its queue to
// wait.
func (w *waits) done(d worker.Done) {
	switch d.Outcome {
	case worker.OutcomeBusy, worker.OutcomeWaiting:
		w.add(d.EventID, d.Lock.Waited, false)
		w.mu.Lock()
		if d.Outcome == worker.OutcomeBusy {
			w.busy++
		} else {
			w.parked++
		}
		w.mu.Unlock()
	default:
		if d.Locked {
			w.add(d.EventID, d.Lock.Waited, true)
		} else {
			w.mu.Lock()
			w.n++
			w.mu.Unlock()
		}
	}
}
