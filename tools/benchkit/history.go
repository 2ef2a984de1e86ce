package benchkit

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
)

// LockHeld reports whether a history entry of type typ was written under
// the lock of the order whose history holds it: modifies and exchanges are.
// A put is not locked, and the entry that creates a replacement order is
// written under the lock of the exchanged order, not the new one.
func LockHeld(typ string) bool { return typ == orders.TypeModify || typ == orders.TypeExchange }

// Violation is one broken invariant found in the histories.
type Violation struct {
	Kind    string `json:"kind"` // overlap, fence, version, created
	OrderNo string `json:"order_no"`
	Detail  string `json:"detail"`
}

func (v Violation) String() string { return v.Kind + " " + v.OrderNo + ": " + v.Detail }

// Analysis is what [Analyze] finds in a set of order histories.
type Analysis struct {
	// Orders and Entries count what was read.
	Orders, Entries int
	// Handoffs are, for every two consecutive lock-held entries of one
	// order that do not overlap, the time from the first's ended_at (the
	// store's commit, Redis TIME) to the second's started_at (when its
	// worker had the lock, the worker's clock; same host). It is the
	// lock's hand-off plus the first holder's release round trip, and,
	// when no task was waiting yet, the queue's idle time.
	Handoffs []time.Duration
	// Violations are overlapping critical sections (a lock-held entry that
	// started before the previous one on the same order ended), fences
	// that do not strictly increase along the lock-held entries of an
	// order, versions that are not 1, 2, 3, ... along a history, and
	// created entries whose fence is not that of their exchange.
	Violations []Violation
	// Applied counts history entries per event ID and type, e.g.
	// Applied["ev-1"]["order:modify"] == 1.
	Applied map[string]map[string]int
}

// Count returns the violations of one kind.
func (a *Analysis) Count(kind string) int {
	n := 0
	for _, v := range a.Violations {
		if v.Kind == kind {
			n++
		}
	}
	return n
}

// Analyze checks the histories of orders, by order number, for the lock's
// invariants and collects the hand-off gaps. Each history is in store order
// (oldest first).
func Analyze(hist map[string][]orders.Entry) Analysis {
	a := Analysis{Orders: len(hist), Applied: map[string]map[string]int{}}
	exchangeFence := map[string]int64{} // event → fence of its exchange entry
	type created struct {
		no    string
		event string
		fence int64
	}
	var creations []created
	nos := slices.Sorted(maps.Keys(hist))
	for _, no := range nos {
		entries := hist[no]
		a.Entries += len(entries)
		var prev *orders.Entry
		for i := range entries {
			e := &entries[i]
			if e.Version != int64(i+1) {
				a.Violations = append(a.Violations, Violation{"version", no,
					fmt.Sprintf("entry %d (event %s) has version %d", i, e.EventID, e.Version)})
			}
			if e.EventID != "" {
				m := a.Applied[e.EventID]
				if m == nil {
					m = map[string]int{}
					a.Applied[e.EventID] = m
				}
				m[e.Type]++
			}
			switch {
			case e.Type == orders.TypeCreated:
				creations = append(creations, created{no, e.EventID, e.Fence})
			case e.Type == orders.TypeExchange:
				exchangeFence[e.EventID] = e.Fence
			}
			if !LockHeld(e.Type) {
				continue
			}
			if prev != nil {
				// A fence names one hold of the lock: the changes a worker
				// drains in one hold (worker.Config.DrainMax) share it, so
				// an equal fence is right for the same writer and wrong
				// for another; a lower one is always wrong.
				if e.Fence < prev.Fence || e.Fence == prev.Fence && e.Worker != prev.Worker {
					a.Violations = append(a.Violations, Violation{"fence", no,
						fmt.Sprintf("event %s (v%d, %s) has fence %d, not above %d of event %s (v%d, %s)",
							e.EventID, e.Version, e.Worker, e.Fence, prev.Fence, prev.EventID, prev.Version, prev.Worker)})
				}
				if gap := e.StartedAt.Sub(prev.EndedAt); gap < 0 {
					a.Violations = append(a.Violations, Violation{"overlap", no,
						fmt.Sprintf("event %s (v%d, %s, fence %d) started %v before event %s (v%d, %s, fence %d) ended",
							e.EventID, e.Version, e.Worker, e.Fence, -gap, prev.EventID, prev.Version, prev.Worker, prev.Fence)})
				} else {
					a.Handoffs = append(a.Handoffs, gap)
				}
			}
			prev = e
		}
	}
	for _, c := range creations {
		if f, ok := exchangeFence[c.event]; ok && f != c.fence {
			a.Violations = append(a.Violations, Violation{"created", c.no,
				fmt.Sprintf("created by event %s under fence %d, but the exchange's fence is %d", c.event, c.fence, f)})
		}
	}
	slices.Sort(a.Handoffs)
	return a
}

// OrderNos lists the orders in the store under prefix (the store's
// redisstore.Config.Prefix) by scanning for their hashes (on every master
// of a Cluster; see [ScanKeys]).
func OrderNos(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]string, error) {
	head := prefix + "order:{"
	keys, err := ScanKeys(ctx, rdb, head+"*}")
	if err != nil {
		return nil, fmt.Errorf("scan orders: %w", err)
	}
	var nos []string
	for _, k := range keys {
		if no, ok := strings.CutSuffix(strings.TrimPrefix(k, head), "}"); ok && !strings.ContainsAny(no, "{}") {
			nos = append(nos, no)
		}
	}
	slices.Sort(nos)
	return slices.Compact(nos), nil
}

// ScanKeys returns the keys matching pattern (SCAN MATCH), sorted. On a
// Cluster it scans every master: a SCAN sent through a ClusterClient
// reaches one node, whose keys are only its slots'.
func ScanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(ctx, rdb)
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// Histories reads the histories of orders nos from store, parallel
// goroutines at a time.
func Histories(ctx context.Context, store orders.Store, nos []string, parallel int) (map[string][]orders.Entry, error) {
	out := make(map[string][]orders.Entry, len(nos))
	var mu sync.Mutex
	err := ForEach(ctx, len(nos), parallel, func(ctx context.Context, i int) error {
		h, err := orders.AllHistory(ctx, store, nos[i])
		if err != nil {
			return err
		}
		mu.Lock()
		out[nos[i]] = h
		mu.Unlock()
		return nil
	})
	return out, err
}

// ForEach calls fn for 0..n-1 from parallel goroutines and returns the
// first error (the others stop taking work then).
func ForEach(ctx context.Context, n, parallel int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range cmp.Or(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// WaiterHandoffs returns, sorted, the hand-offs of a lock to a task that
// was already waiting for it: for every two consecutive lock-held entries
// of one order, the gap from the first's ended_at to the second's
// started_at, counted only when the second's wait for the lock (given by
// waited, e.g. from the worker's lock_wait log field) began before the
// first ended. A newcomer that took the lock without waiting is left out,
// and so is an overlap.
func WaiterHandoffs(hist map[string][]orders.Entry, waited func(orders.Entry) (time.Duration, bool)) []time.Duration {
	var out []time.Duration
	for _, entries := range hist {
		var prev *orders.Entry
		for i := range entries {
			e := &entries[i]
			if !LockHeld(e.Type) {
				continue
			}
			if prev != nil {
				gap := e.StartedAt.Sub(prev.EndedAt)
				if w, ok := waited(*e); ok && gap >= 0 && e.StartedAt.Add(-w).Before(prev.EndedAt) {
					out = append(out, gap)
				}
			}
			prev = e
		}
	}
	slices.Sort(out)
	return out
}

// Inversions checks that the lock-held entries of each order were applied in
// the order of pos, the entry's place in the order of acceptance (e.Seq for
// changes accepted with a position). It returns how many consecutive pairs
// it compared and one violation of kind "order" for each entry whose place
// is not above the one applied before it. Entries for which pos reports
// false are left out.
func Inversions(hist map[string][]orders.Entry, pos func(orders.Entry) (int64, bool)) (pairs int, inversions []Violation) {
	for _, no := range slices.Sorted(maps.Keys(hist)) {
		var prev *orders.Entry
		var prevPos int64
		for i := range hist[no] {
			e := &hist[no][i]
			if !LockHeld(e.Type) {
				continue
			}
			p, ok := pos(*e)
			if !ok {
				continue
			}
			if prev != nil {
				pairs++
				if p <= prevPos {
					inversions = append(inversions, Violation{"order", no,
						fmt.Sprintf("event %s (place %d, v%d) applied after event %s (place %d, v%d)",
							e.EventID, p, e.Version, prev.EventID, prevPos, prev.Version)})
				}
			}
			prev, prevPos = e, p
		}
	}
	return pairs, inversions
}

// BySeq is the pos of [Inversions] for changes accepted with a position:
// the entry's Seq, when it has one.
func BySeq(e orders.Entry) (int64, bool) { return e.Seq, e.Seq > 0 }
