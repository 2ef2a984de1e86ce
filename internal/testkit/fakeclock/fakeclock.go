// Package fakeclock is a clock that tests move by hand, so that nothing
// waits for real time to pass (a token bucket to refill, a cache entry to
// age). It is test support: only _test.go files import it (depguard).
package fakeclock

import (
	"sync"
	"time"
)

// Clock stands still at the time it was given until Add moves it. Its
// methods are safe for concurrent use; pass its Now where a component takes
// a clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a Clock at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
