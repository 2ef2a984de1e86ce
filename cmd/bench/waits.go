package main

import (
	"slices"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
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

// waitCore is a zap core for (b)'s worker that keeps only the lock_wait
// field of its one log line per task ("task done", and "order busy" for a
// task that met its wait deadline) and drops everything else, so that
// logging costs next to nothing.
type waitCore struct{ w *waits }

var _ zapcore.Core = waitCore{}

func (c waitCore) Enabled(l zapcore.Level) bool      { return l >= zapcore.InfoLevel }
func (c waitCore) With([]zapcore.Field) zapcore.Core { return c }
func (c waitCore) Sync() error                       { return nil }

func (c waitCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "task done" || e.Message == "order busy; task back to its queue" {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c waitCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	var event string
	var wait time.Duration
	found := false
	for _, f := range fields {
		switch {
		case f.Key == "event_id" && f.Type == zapcore.StringType:
			event = f.String
		case f.Key == "lock_wait" && f.Type == zapcore.DurationType:
			wait, found = time.Duration(f.Integer), true
		}
	}
	if found {
		c.w.add(event, wait, e.Message == "task done")
	}
	return nil
}
