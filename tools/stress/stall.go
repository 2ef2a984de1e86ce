package main

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// How long a hot order waits after a promotion.
//
// For each Redis switch that saw its new master serve (switched.served,
// from redisproc's Promoted: every node or sentinel naming the new master),
// and each hot order with a change still to run then, the wait is from the
// later of the promotion and that change's acceptance to the first run of
// the order that a worker logged as done after the promotion (the first
// run of a change not run before: a task run again waited for nothing;
// an order whose changes had all run is not measured). It is read
// from the workers' logs (their clock is the machine's, whatever the
// Redis clocks say), and bounded by maxPromotionStall.
//
// A wait past the bound is a violation unless a nemesis of the suite's own
// explains it: the worker that ran the order last before the promotion, or
// first after it, was killed, frozen, cut off, reset or slowed in the
// window from LOCK_TTL before the promotion to that first run (the trouble
// log below), and the first run came within the bound of the end of what
// that nemesis leaves behind (a kill: its lock's TTL and its tasks' asynq
// leases; a freeze, a cut or a slow spell: its length and a second; a
// reset: a second). A killed holder's order waits for its lock and its
// tasks' leases whether or not Redis switched.

// maxPromotionStall is the bound issue 44 sets: no hot order waits more
// than a second after a promotion.
const maxPromotionStall = time.Second

// trouble is one nemesis aimed at one worker slot.
type trouble struct {
	slot     int
	kind     string
	from, to time.Time // while it acts, and the time it leaves behind
}

// troubleLog records the nemeses aimed at the workers. It is safe for
// concurrent use; the zero value is ready.
type troubleLog struct {
	mu  sync.Mutex
	all []trouble
}

// add records kind on slot from now for d.
func (t *troubleLog) add(slot int, kind string, d time.Duration) {
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all = append(t.all, trouble{slot: slot, kind: kind, from: now, to: now.Add(d)})
}

// on returns the troubles of the slots that overlap [from, to].
func (t *troubleLog) on(slots []int, from, to time.Time) []trouble {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []trouble
	for _, tr := range t.all {
		if slices.Contains(slots, tr.slot) && !tr.to.Before(from) && !tr.from.After(to) {
			out = append(out, tr)
		}
	}
	return out
}

// hotRun is one run of a hot order a worker logged as done.
type hotRun struct {
	at    time.Time
	event string
	slot  int
}

// promotionWait is a hot order's wait after one promotion.
type promotionWait struct {
	switchName string
	orderNo    string
	wait       time.Duration
	event      string    // the first change run after the promotion
	explained  []trouble // the nemeses of its workers in the window
}

func (w promotionWait) String() string {
	s := fmt.Sprintf("%s: first run after the promotion of %s (%s) came %v after it", w.orderNo, w.switchName, w.event, w.wait.Round(time.Millisecond))
	for i, tr := range w.explained {
		sep := "; its worker's "
		if i > 0 {
			sep = ", "
		}
		s += fmt.Sprintf("%s%s (slot %d)", sep, tr.kind, tr.slot)
	}
	return s
}

// firstRuns returns the first run of each change of rs (sorted by time):
// a later one is a task brought back after its run (a killed worker's, or
// one whose end a failover lost, by the recoverer), which ran its change
// already and waited for nothing.
func firstRuns(rs []hotRun) []hotRun {
	seen := make(map[string]bool, len(rs))
	out := make([]hotRun, 0, len(rs))
	for _, r := range rs {
		if !seen[r.event] {
			seen[r.event] = true
			out = append(out, r)
		}
	}
	return out
}

// promotionWaits measures, for each switch that served and each hot order
// of nos, the wait after the promotion; runs are each order's logged runs,
// accepted each change's acceptance, lockTTL the workers' LOCK_TTL. It
// returns every wait, and those past maxPromotionStall that no trouble
// explains.
func promotionWaits(switches []switched, nos []string, runs map[string][]hotRun, accepted map[string]time.Time, trouble *troubleLog, lockTTL time.Duration) (all, stalls []promotionWait) {
	for k, s := range switches {
		if s.served.IsZero() {
			continue
		}
		for _, no := range nos {
			rs := firstRuns(runs[no])
			i, _ := slices.BinarySearchFunc(rs, s.served, func(r hotRun, t time.Time) int { return r.at.Compare(t) })
			if i == len(rs) {
				continue // nothing of it ran after the promotion: its flood had drained
			}
			first := rs[i]
			from := s.served
			if a, ok := accepted[first.event]; ok && a.After(from) {
				from = a // it had nothing waiting until then
			}
			w := promotionWait{switchName: fmt.Sprintf("switch %d (%v into the chaos)", k+1, s.began.Round(100*time.Millisecond)), orderNo: no, wait: first.at.Sub(from), event: first.event}
			if w.wait < 0 {
				w.wait = 0
			}
			slots := []int{first.slot}
			if i > 0 {
				slots = append(slots, rs[i-1].slot)
			}
			if trouble != nil {
				w.explained = trouble.on(slots, s.served.Add(-lockTTL), first.at)
			}
			all = append(all, w)
			// A nemesis explains the wait only up to the end of what it
			// leaves behind: past that, the bound holds again.
			end := from
			for _, tr := range w.explained {
				if tr.to.After(end) {
					end = tr.to
				}
			}
			if first.at.Sub(end) > maxPromotionStall {
				stalls = append(stalls, w)
			}
		}
	}
	return all, stalls
}
