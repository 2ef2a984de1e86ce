package main

import (
	"slices"
	"sync"
	"time"

	"github.com/orderworker/orderworker/worker"
)

// waits collects how long tasks waited for their order's lock: every wait,
// and the wait of the run that got the lock, by event ID. It is safe for
// concurrent use.
type waits struct {
	mu      sync.Mutex
	d       []time.Duration
	byEvent map[string]time.Duration
}

func newWaits() *waits { return &waits{byEvent: map[string]time.Duration{}} }

// add records a wait; locked says the run got the lock.
func (w *waits) add(event string, d time.Duration, locked bool) {
	w.mu.Lock()
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

// done records the lock wait of one run of (b)'s worker, from its OnDone:
// every run that took the lock, or met its wait deadline.
func (w *waits) done(d worker.Done) {
	switch d.Outcome {
	case worker.OutcomeBusy, worker.OutcomeWaiting:
		w.add(d.EventID, d.Lock.Waited, false)
	default:
		if d.Locked {
			w.add(d.EventID, d.Lock.Waited, true)
		}
	}
}
