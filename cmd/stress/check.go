package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/benchkit"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/redis/go-redis/v9"
)

// outcome is what became of one enqueued task.
type outcome struct {
	state   string // completed, archived, or asynq's state of a task still queued, or "lost"
	lastErr string
	retried int
}

// results are the figures of a run and the violations found.
type results struct {
	tasks     []enqueued
	outcomes  map[string]outcome // by event ID (= task ID)
	analysis  benchkit.Analysis
	drained   bool
	drainTook time.Duration
	crashes   []string

	completed, archived, retriedOK int
	archivedBy                     map[string]int // reason class → tasks
	unfinished                     map[string]int // asynq state → tasks left after the drain

	// Violations.
	lost          []string // enqueued, and neither completed, archived nor queued
	badArchive    []string // archived for a reason other than a closed or unknown order
	doubleApplied []string // an event with more than one history entry of a type
	notApplied    []string // completed, but no history entry
	archApplied   []string // archived, but written to the history
	unknownEvents []string // history entries of events never enqueued
	versionOff    []string // an order whose version is not its history's length
	locksLeft     []string // lock keys left once drained
}

func (r *results) violations() int {
	n := len(r.lost) + len(r.badArchive) + len(r.doubleApplied) + len(r.notApplied) + len(r.archApplied) +
		len(r.unknownEvents) + len(r.versionOff) + len(r.locksLeft) + len(r.analysis.Violations) + len(r.crashes)
	for _, c := range r.unfinished {
		n += c
	}
	return n
}

// check reads asynq's view of every enqueued task and every order's
// history, and cross-checks them.
func check(ctx context.Context, rdb redis.UniversalClient, store orders.Store, insp *asynq.Inspector, l *load) (*results, error) {
	r := &results{tasks: l.tasks, outcomes: map[string]outcome{}, archivedBy: map[string]int{}, unfinished: map[string]int{}}
	for _, q := range benchkit.Queues {
		if err := listAll(insp.ListCompletedTasks, q, "completed", r.outcomes); err != nil {
			return nil, err
		}
		if err := listAll(insp.ListArchivedTasks, q, "archived", r.outcomes); err != nil {
			return nil, err
		}
	}
	for _, t := range l.tasks {
		if _, ok := r.outcomes[t.EventID]; ok {
			continue
		}
		info, err := insp.GetTaskInfo(t.Queue, t.EventID)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
			r.outcomes[t.EventID] = outcome{state: "lost"}
		case err != nil:
			return nil, fmt.Errorf("task %s: %w", t.EventID, err)
		default:
			r.outcomes[t.EventID] = outcome{state: info.State.String(), lastErr: info.LastErr, retried: info.Retried}
		}
	}

	nos, err := benchkit.OrderNos(ctx, rdb, prefix)
	if err != nil {
		return nil, err
	}
	hist, err := benchkit.Histories(ctx, store, nos, 8)
	if err != nil {
		return nil, err
	}
	r.analysis = benchkit.Analyze(hist)
	for _, no := range nos {
		o, err := store.Get(ctx, no)
		if err != nil {
			return nil, err
		}
		if h := hist[no]; o.Version != int64(len(h)) {
			r.versionOff = append(r.versionOff, fmt.Sprintf("%s: version %d, %d history entries", no, o.Version, len(h)))
		}
	}

	known := map[string]bool{}
	for _, t := range l.tasks {
		known[t.EventID] = true
		o := r.outcomes[t.EventID]
		applied := r.analysis.Applied[t.EventID]
		for typ, n := range applied {
			if n > 1 {
				r.doubleApplied = append(r.doubleApplied, fmt.Sprintf("%s %s on %s: %d %s entries", t.Type, t.EventID, t.OrderNo, n, typ))
			}
		}
		switch o.state {
		case "completed":
			r.completed++
			if o.retried > 0 {
				r.retriedOK++
			}
			want := []string{orders.TypeModify}
			if t.Type == taskExchange {
				want = []string{orders.TypeExchange, orders.TypeCreated}
			}
			for _, typ := range want {
				if applied[typ] == 0 {
					r.notApplied = append(r.notApplied, fmt.Sprintf("%s %s on %s: completed, no %s entry", t.Type, t.EventID, t.OrderNo, typ))
				}
			}
		case "archived":
			r.archived++
			class := archiveClass(t, o.lastErr)
			r.archivedBy[class]++
			if strings.HasPrefix(class, "other") {
				r.badArchive = append(r.badArchive, fmt.Sprintf("%s %s on %s: %s", t.Type, t.EventID, t.OrderNo, o.lastErr))
			}
			if len(applied) > 0 {
				r.archApplied = append(r.archApplied, fmt.Sprintf("%s %s on %s: archived (%s) but applied %v", t.Type, t.EventID, t.OrderNo, o.lastErr, applied))
			}
		case "lost":
			r.lost = append(r.lost, fmt.Sprintf("%s %s on %s", t.Type, t.EventID, t.OrderNo))
		default:
			r.unfinished[o.state]++
		}
	}
	for _, ev := range slices.Sorted(maps.Keys(r.analysis.Applied)) {
		if !known[ev] {
			r.unknownEvents = append(r.unknownEvents, fmt.Sprintf("%s: %v", ev, r.analysis.Applied[ev]))
		}
	}

	iter := rdb.Scan(ctx, 0, prefix+"lock:{*", 1000).Iterator()
	for iter.Next(ctx) {
		if k := iter.Val(); !strings.HasSuffix(k, ":fence") {
			r.locksLeft = append(r.locksLeft, k)
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("scan locks: %w", err)
	}
	return r, nil
}

// archiveClass says why a task was archived: a modify of an order that an
// exchange had closed, or of a replacement not created yet, is a valid
// outcome; anything else is a violation (class "other").
func archiveClass(t enqueued, lastErr string) string {
	switch {
	case strings.Contains(lastErr, "is exchanged"):
		return t.Type + " of an exchanged order"
	case strings.Contains(lastErr, "order not found"):
		return t.Type + " of an order not (yet) created"
	}
	return "other"
}

// listAll lists every task of one state in queue q into out.
func listAll(list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), q, state string, out map[string]outcome) error {
	const size = 1000
	for page := 1; ; page++ {
		infos, err := list(q, asynq.PageSize(size), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s tasks of %s: %w", state, q, err)
		}
		for _, info := range infos {
			out[info.ID] = outcome{state: state, lastErr: info.LastErr, retried: info.Retried}
		}
		if len(infos) < size {
			return nil
		}
	}
}

func (r *results) print(out io.Writer, took time.Duration) {
	drained := "drained"
	if !r.drained {
		drained = "NOT drained"
	}
	fmt.Fprintf(out, "\nqueues %s %v after the chaos phase; run took %v\n\n", drained, r.drainTook.Round(time.Second), took.Round(time.Second))
	fmt.Fprintf(out, "tasks:         %d enqueued, %d completed (%d after a retry), %d archived with a reason, %d lost, %d unfinished %v\n",
		len(r.tasks), r.completed, r.retriedOK, r.archived, len(r.lost), sumMap(r.unfinished), r.unfinished)
	for _, k := range slices.Sorted(maps.Keys(r.archivedBy)) {
		fmt.Fprintf(out, "               archived: %s: %d\n", k, r.archivedBy[k])
	}
	a := &r.analysis
	applied := 0
	for _, m := range a.Applied {
		if m[orders.TypeModify] > 0 || m[orders.TypeExchange] > 0 {
			applied++
		}
	}
	fmt.Fprintf(out, "exactly once:  %d events applied; %d double-applied, %d completed but not applied, %d archived but applied, %d unknown events\n",
		applied, len(r.doubleApplied), len(r.notApplied), len(r.archApplied), len(r.unknownEvents))
	fmt.Fprintf(out, "locking:       %d history entries on %d orders; %d overlapping critical sections, %d fence regressions, %d version gaps, %d replacement fences off, %d orders whose version is off\n",
		a.Entries, a.Orders, a.Count("overlap"), a.Count("fence"), a.Count("version"), a.Count("created"), len(r.versionOff))
	fmt.Fprintf(out, "locks left:    %d\n", len(r.locksLeft))
	fmt.Fprintf(out, "worker crashes: %d\n", len(r.crashes))

	show := func(title string, items []string) {
		if len(items) == 0 {
			return
		}
		fmt.Fprintf(out, "\n%s (%d):\n", title, len(items))
		for _, it := range items[:min(len(items), 20)] {
			fmt.Fprintf(out, "  %s\n", it)
		}
		if len(items) > 20 {
			fmt.Fprintf(out, "  ... and %d more\n", len(items)-20)
		}
	}
	var hv []string
	for _, v := range a.Violations {
		hv = append(hv, v.String())
	}
	show("LOST tasks", r.lost)
	show("ARCHIVED for an unexpected reason", r.badArchive)
	show("DOUBLE-APPLIED events", r.doubleApplied)
	show("COMPLETED but NOT APPLIED", r.notApplied)
	show("ARCHIVED but APPLIED", r.archApplied)
	show("UNKNOWN events in the histories", r.unknownEvents)
	show("HISTORY violations", hv)
	show("ORDER VERSION off", r.versionOff)
	show("LOCKS LEFT", r.locksLeft)
	show("WORKER CRASHES (exited on their own)", r.crashes)
	if n := r.violations(); n > 0 {
		fmt.Fprintf(out, "\nFAIL: %d violations\n", n)
	} else {
		fmt.Fprintln(out, "\nPASS: 0 lost, 0 double-applied, 0 overlaps, 0 locks left")
	}
}

func sumMap(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
