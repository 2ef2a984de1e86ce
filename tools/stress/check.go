package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/tools/stress/history"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
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
	nos       []string          // every order, seeded and created
	redis     string            // -redis
	switched  []switched        // the Redis switches of the chaos phase
	placement []int             // -redis cluster: orders per shard
	hot       *hotReport        // the hot-order phase's evidence, if it ran
	appliedBy map[string]string // the flood's events (hot.go) → the worker that wrote their entry

	completed, archived, retriedOK int
	archivedBy                     map[string]int // reason class → tasks
	unfinished                     map[string]int // asynq state → tasks left after the drain

	// Violations.
	lost          []string        // enqueued, and neither completed, archived nor queued
	lostWindow    []time.Duration // the first and the last lost task's acceptance, into the chaos phase
	badArchive    []string        // archived for a reason other than a closed or unknown order
	doubleApplied []string        // an event with more than one history entry of a type
	notApplied    []string        // completed, but no history entry
	archApplied   []string        // archived, but written to the history
	unknownEvents []string        // history entries of events never enqueued
	versionOff    []string        // an order whose version is not its history's length
	locksLeft     []string        // lock keys left once drained

	// Ordering.
	inversions   []string // an order's history applying a position after a later one
	clientOrder  []string // a client's changes of an order applied out of the order it sent them
	replayOff    []string // an order whose state is not the replay of its changes in sequence order
	stalled      []string // a sequence with positions left once drained
	badSkips     []string // a skipped position whose task had existed
	skips, voids int

	// A skipped position whose task applied its change there and completed
	// without passing its turn on: the turn's end lost with the order's
	// master. A violation unless lossy.
	lostTurns []string
	// lossy says the run's Redis switches may lose acknowledged writes
	// (-lag, or a plain switch): lostTurns are then what a failover can
	// lose (docs/scaling.md), counted.
	lossy bool
	// The fence regressions of the analysis, by kind: an equal fence (two
	// consecutive lock-held entries written under one lease, as a drained
	// hold writes them) or a lower one.
	fenceEqual, fenceBelow int
	lateRejected           int // modifies accepted after their order's exchange, rejected naming the replacement

	// The history checker (tools/stress/history): its findings over the
	// store's histories, how many writes it read there, and, with -store
	// http, what the order API's log shows and its findings over it.
	historyFound  []string
	historyWrites int
	api           *apiLog
}

func (r *results) violations() int {
	n := len(r.lost) + len(r.badArchive) + len(r.doubleApplied) + len(r.notApplied) + len(r.archApplied) +
		len(r.unknownEvents) + len(r.versionOff) + len(r.locksLeft) + len(r.analysis.Violations) + len(r.crashes) +
		len(r.inversions) + len(r.clientOrder) + len(r.replayOff) + len(r.stalled) + len(r.badSkips) + len(r.historyFound)
	if !r.lossy {
		n += len(r.lostTurns)
	}
	if r.api != nil {
		n += len(r.api.findings)
	}
	if r.hot != nil {
		n += len(r.hot.stalls)
	}
	if r.hot != nil && len(r.hot.actions) == 0 {
		// The phase must hit at least one hold; a later planned kill that
		// finds the floods drained already (a busy machine drains them
		// more slowly, or a random kill stalled them) is reported only.
		n += len(r.hot.uncovered)
	}
	for _, c := range r.unfinished {
		n += c
	}
	return n
}

// check reads asynq's view of every enqueued task and every order's
// history, and cross-checks them. The orders are store's, whose keys are
// on ordersRDB (rdb, the workers' Redis, with the Redis store).
func check(ctx context.Context, rdb, ordersRDB redis.UniversalClient, store orders.Store, seq *keyorder.Sequencer, insp *asynq.Inspector, l *load) (*results, error) {
	r := &results{tasks: l.tasks, outcomes: map[string]outcome{}, archivedBy: map[string]int{}, unfinished: map[string]int{}}
	queues, err := orderQueues(insp)
	if err != nil {
		return nil, err
	}
	for _, q := range queues {
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
		o, err := taskOutcome(ctx, rdb, insp, t.Queue, t.EventID)
		if err != nil {
			return nil, err
		}
		r.outcomes[t.EventID] = o
	}

	nos, err := benchkit.OrderNos(ctx, ordersRDB, prefix)
	if err != nil {
		return nil, err
	}
	r.nos = nos
	hist, err := benchkit.Histories(ctx, store, nos, 8)
	if err != nil {
		return nil, err
	}
	r.analysis = benchkit.Analyze(hist)
	r.fenceEqual, r.fenceBelow = fenceKinds(hist)
	r.appliedBy = map[string]string{}
	for _, h := range hist {
		for _, e := range h {
			if _, ok := hotOrderOf(e.EventID); ok && e.Type == orders.TypeModify {
				r.appliedBy[e.EventID] = e.Worker
			}
		}
	}
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
			} else if x, ok := exchangeOf(hist[t.OrderNo]); !ok || t.Seq <= x.Seq {
				// Only a change accepted after its order's exchange may
				// find the order exchanged.
				r.badArchive = append(r.badArchive, fmt.Sprintf("%s %s on %s at position %d: %s, but the exchange is at %d",
					t.Type, t.EventID, t.OrderNo, t.Seq, o.lastErr, x.Seq))
			} else {
				r.lateRejected++
			}
			if len(applied) > 0 {
				r.archApplied = append(r.archApplied, fmt.Sprintf("%s %s on %s: archived (%s) but applied %v", t.Type, t.EventID, t.OrderNo, o.lastErr, applied))
			}
		case "lost":
			r.lost = append(r.lost, fmt.Sprintf("%s %s on %s, accepted %v into the chaos phase", t.Type, t.EventID, t.OrderNo, t.At.Round(time.Millisecond)))
			if len(r.lostWindow) == 0 {
				r.lostWindow = []time.Duration{t.At, t.At}
			}
			r.lostWindow[0], r.lostWindow[1] = min(r.lostWindow[0], t.At), max(r.lostWindow[1], t.At)
		default:
			r.unfinished[o.state]++
		}
	}
	for _, ev := range slices.Sorted(maps.Keys(r.analysis.Applied)) {
		if !known[ev] {
			r.unknownEvents = append(r.unknownEvents, fmt.Sprintf("%s: %v", ev, r.analysis.Applied[ev]))
		}
	}

	lockKeys, err := benchkit.ScanKeys(ctx, rdb, prefix+"lock:{*")
	if err != nil {
		return nil, fmt.Errorf("scan locks: %w", err)
	}
	for _, k := range lockKeys {
		// The fence counters, the sequences and the WAIT_REPLICAS markers
		// stay; a lock does not.
		if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":seq") && !strings.HasSuffix(k, ":wait") {
			r.locksLeft = append(r.locksLeft, k)
		}
	}
	if err := r.checkOrder(ctx, store, seq, l, nos, hist); err != nil {
		return nil, err
	}
	final, err := finalOrders(ctx, store, nos)
	if err != nil {
		return nil, err
	}
	sh := storeHistory(hist, l)
	for _, ws := range sh {
		r.historyWrites += len(ws)
	}
	r.historyFound = findingLines(history.Check(sh, final))
	return r, nil
}

// fenceKinds counts, over consecutive lock-held entries of each order, the
// later entry's fence equal to the earlier one's, and below it.
func fenceKinds(hist map[string][]orders.Entry) (equal, below int) {
	for _, h := range hist {
		var prev *orders.Entry
		for i := range h {
			e := &h[i]
			if !benchkit.LockHeld(e.Type) {
				continue
			}
			if prev != nil {
				switch {
				case e.Fence == prev.Fence:
					equal++
				case e.Fence < prev.Fence:
					below++
				}
			}
			prev = e
		}
	}
	return equal, below
}

// exchangeOf returns the order:exchange entry of a history.
func exchangeOf(hist []orders.Entry) (orders.Entry, bool) {
	for _, e := range hist {
		if e.Type == orders.TypeExchange {
			return e, true
		}
	}
	return orders.Entry{}, false
}

// checkOrder checks the promise of order: every order's history applies its
// positions in sequence, each client's changes apply in the order it sent
// them, every order ends as a replay of its applied changes in sequence
// order, no sequence is left waiting, and no position was skipped whose task
// existed.
func (r *results) checkOrder(ctx context.Context, store orders.Store, seq *keyorder.Sequencer, l *load, nos []string, hist map[string][]orders.Entry) error {
	byEvent := map[string]enqueued{}
	for _, t := range l.tasks {
		byEvent[t.EventID] = t
	}
	where := map[string]int{} // event → index in its order's history (applied changes)
	for _, no := range nos {
		var last orders.Entry
		for i, e := range hist[no] {
			if e.Type == orders.TypeModify || e.Type == orders.TypeExchange {
				where[e.EventID] = i
			}
			if e.Seq == 0 {
				continue
			}
			if e.Seq <= last.Seq {
				r.inversions = append(r.inversions, fmt.Sprintf("%s: %s (position %d) applied after %s (position %d)", no, e.EventID, e.Seq, last.EventID, last.Seq))
			}
			last = e
		}
	}
	// A client sends one change after another: of one order, they apply in
	// the order it sent them.
	type key struct {
		client int
		no     string
	}
	lastAt := map[key]int{}
	for _, t := range l.tasks {
		i, ok := where[t.EventID]
		if !ok {
			continue
		}
		k := key{t.Client, t.OrderNo}
		if prev, seen := lastAt[k]; seen && i <= prev {
			r.clientOrder = append(r.clientOrder, fmt.Sprintf("client %d, %s: %s applied at entry %d, before an earlier change (entry %d)", t.Client, t.OrderNo, t.EventID, i, prev))
		}
		lastAt[k] = i
	}
	// The final state is the replay, in sequence order, of the changes the
	// histories applied.
	for _, no := range nos {
		want, err := replay(no, hist, byEvent, 1<<62, 0)
		if err != nil {
			r.replayOff = append(r.replayOff, fmt.Sprintf("%s: %v", no, err))
			continue
		}
		o, err := store.Get(ctx, no)
		if err != nil {
			return err
		}
		if o.Address != want.Address || o.Remark != want.Remark || !slices.Equal(o.Items, want.Items) {
			r.replayOff = append(r.replayOff, fmt.Sprintf("%s: store has %q / %q / %v, the replay gives %q / %q / %v",
				no, o.Address, o.Remark, o.Items, want.Address, want.Remark, want.Items))
		}
	}
	// Sequences: nothing left waiting; skips only of positions whose task
	// never existed.
	for _, no := range nos {
		st, err := seq.Status(ctx, no)
		if err != nil {
			return err
		}
		for _, p := range st.Pending { // the first page
			r.stalled = append(r.stalled, fmt.Sprintf("%s: position %d still waits (%s)", no, p.Pos, p.Record))
		}
		if more := st.Waiting - int64(len(st.Pending)); more > 0 {
			r.stalled = append(r.stalled, fmt.Sprintf("%s: and %d more positions wait", no, more))
		}
		for _, e := range st.Log {
			switch e.Kind {
			case "void":
				r.voids++
			case "skip":
				r.skips++
				typ, ev, from, ok := tasks.Kinds().ParseLabel(e.Label)
				if !ok {
					r.badSkips = append(r.badSkips, fmt.Sprintf("%s: position %d skipped, with a label naming no task: %q", no, e.Pos, e.Label))
					continue
				}
				if from != "" {
					continue // a creation: its exchange's own position is checked
				}
				for _, h := range hist[no] {
					if h.EventID != ev || h.Seq != e.Pos {
						continue
					}
					what := fmt.Sprintf("%s: position %d skipped (%s), yet %s %s was applied there", no, e.Pos, e.Reason, typ, ev)
					if strings.HasSuffix(e.Reason, "completed without passing its turn on") {
						// The skip's time is the order's new master's clock
						// (behind by -behind, if set), the apply's the
						// store's: the wait the lost turn cost, near enough.
						what += fmt.Sprintf(", skipped %v after its apply ended", e.At.Sub(h.EndedAt).Round(time.Millisecond))
						// Applied in its turn, completed, and its turn's
						// end lost with the order's master (on a Cluster
						// the queue lives on another master, so the task
						// does not run again): the skip passes the turn on.
						r.lostTurns = append(r.lostTurns, what)
					} else {
						r.badSkips = append(r.badSkips, what)
					}
				}
			}
		}
	}
	return nil
}

// state is an order's fields that changes set.
type state struct {
	Address, Remark string
	Items           []orders.Item
}

// replay returns what order no looks like after its applied changes with a
// position below before, applied in position order, starting from how it
// was seeded or created. depth bounds the chain of replacements.
func replay(no string, hist map[string][]orders.Entry, byEvent map[string]enqueued, before int64, depth int) (state, error) {
	h := hist[no]
	if len(h) == 0 || depth > 100 {
		return state{}, fmt.Errorf("no history")
	}
	var s state
	switch first := h[0]; first.Type {
	case orders.TypePut:
		s = state{Address: seedAddress, Items: seedItems}
	case orders.TypeCreated:
		x, ok := byEvent[first.EventID]
		if !ok {
			return state{}, fmt.Errorf("created by unknown event %s", first.EventID)
		}
		from, err := replay(x.OrderNo, hist, byEvent, x.Seq, depth+1)
		if err != nil {
			return state{}, fmt.Errorf("its exchanged order %s: %w", x.OrderNo, err)
		}
		s = state{Address: from.Address, Remark: from.Remark, Items: x.Items}
	default:
		return state{}, fmt.Errorf("first entry is %s", first.Type)
	}
	var mods []enqueued
	for _, e := range h {
		if e.Type != orders.TypeModify {
			continue
		}
		t, ok := byEvent[e.EventID]
		if !ok {
			return state{}, fmt.Errorf("modify of unknown event %s", e.EventID)
		}
		if t.Seq < before {
			mods = append(mods, t)
		}
	}
	slices.SortFunc(mods, func(a, b enqueued) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, m := range mods {
		if m.Changes.Address != nil {
			s.Address = *m.Changes.Address
		}
		if m.Changes.Remark != nil {
			s.Remark = *m.Changes.Remark
		}
		if m.Changes.Items != nil {
			s.Items = m.Changes.Items
		}
	}
	return s, nil
}

// archiveClass says why a task was archived: a change of an order that an
// exchange had closed is a valid outcome (when it was accepted after the
// exchange: see check); anything else is a violation (class "other"),
// including a modify of a replacement not created yet (it must wait for
// the creation) and a task out of its failure budget (waits never spend
// it, and nothing fails for real in this suite).
func archiveClass(t enqueued, lastErr string) string {
	if strings.Contains(lastErr, "is exchanged") {
		return t.Type + " of an exchanged order"
	}
	return "other: " + t.Type
}

// taskOutcome reads task id of queue as asynq has it. A task is lost only
// when asynq does not have it: a queue missing from asynq's set of queues
// (a failover of the chaos can lose it) whose task exists is listed again,
// as a worker's gap check does (asynqredis.TaskInfo), and the task read.
func taskOutcome(ctx context.Context, rdb redis.UniversalClient, insp *asynq.Inspector, queue, id string) (outcome, error) {
	info, _, err := asynqredis.TaskInfo(ctx, insp, rdb, queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		// ErrQueueNotFound is left only when the task's hash is gone too.
		return outcome{state: "lost"}, nil
	case err != nil:
		return outcome{}, fmt.Errorf("task %s: %w", id, err)
	}
	return outcome{state: info.State.String(), lastErr: info.LastErr, retried: info.Retried}, nil
}

// listAll lists every task of one state in queue q into out. A queue asynq
// does not list (any more) lists nothing: its tasks are then read one by
// one (taskOutcome), never taken for lost.
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

// print writes the figures and up to limit items of each violation list
// (all of them for a negative limit).
func (r *results) print(out io.Writer, took time.Duration, limit int) {
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
	fmt.Fprintf(out, "locking:       %d history entries on %d orders; %d overlapping critical sections, %d fence regressions (%d with an equal fence: consecutive entries under one lease; %d with a lower one), %d version gaps, %d replacement fences off, %d orders whose version is off\n",
		a.Entries, a.Orders, a.Count("overlap"), a.Count("fence"), r.fenceEqual, r.fenceBelow, a.Count("version"), a.Count("created"), len(r.versionOff))
	fmt.Fprintf(out, "locks left:    %d\n", len(r.locksLeft))
	fmt.Fprintf(out, "order:         %d inversions, %d client-order violations, %d orders off their replay, %d stalled positions; %d positions skipped (%d of a task that existed), %d voided; %d late modifies rejected naming the replacement\n",
		len(r.inversions), len(r.clientOrder), len(r.replayOff), len(r.stalled), r.skips, len(r.badSkips), r.voids, r.lateRejected)
	if len(r.lostTurns) > 0 {
		fmt.Fprintf(out, "               %d turns whose change was applied and whose end a master lost, skipped by the next change once it found the task completed\n", len(r.lostTurns))
	}
	fmt.Fprintf(out, "history:       %d accepted writes of the store's histories checked (positions, fences, holds, once, replay): %d findings\n",
		r.historyWrites, len(r.historyFound))
	if a := r.api; a != nil {
		fmt.Fprintf(out, "order API log: %d writes applied, %d answered as replays, refused %v; checked: %d findings\n",
			a.accepted, a.replayed, a.refused, len(a.findings))
	}
	fmt.Fprintf(out, "worker crashes: %d\n", len(r.crashes))
	fmt.Fprintf(out, "redis:         %s, %d switches", r.redis, len(r.switched))
	if r.placement != nil {
		fmt.Fprintf(out, "; orders per shard %v", r.placement)
	}
	fmt.Fprintln(out)
	for _, s := range r.switched {
		fmt.Fprintf(out, "               %v into the chaos phase: %s\n", s.began.Round(100*time.Millisecond), s)
	}
	if r.hot != nil {
		r.hot.print(out, r.appliedBy)
	}
	if len(r.lostWindow) == 2 {
		fmt.Fprintf(out, "lost tasks:    accepted from %v to %v into the chaos phase\n", r.lostWindow[0].Round(time.Millisecond), r.lostWindow[1].Round(time.Millisecond))
	}

	show := func(title string, items []string) {
		if len(items) == 0 {
			return
		}
		fmt.Fprintf(out, "\n%s (%d):\n", title, len(items))
		n := len(items)
		if limit >= 0 {
			n = min(n, limit)
		}
		for _, it := range items[:n] {
			fmt.Fprintf(out, "  %s\n", it)
		}
		if n < len(items) {
			fmt.Fprintf(out, "  ... and %d more (all of them in report.txt)\n", len(items)-n)
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
	show("INVERSIONS (a position applied after a later one)", r.inversions)
	show("CLIENT ORDER broken", r.clientOrder)
	show("REPLAY differs from the store", r.replayOff)
	show("STALLED sequences", r.stalled)
	show("SKIPPED positions whose task existed", r.badSkips)
	if r.lossy {
		show("turns lost with a master (not a violation: the switches lose writes; the change was applied in its turn)", r.lostTurns)
	} else {
		show("TURNS LOST (a change applied, its turn never passed on)", r.lostTurns)
	}
	show("HISTORY CHECKER findings over the store's histories", r.historyFound)
	if r.api != nil {
		show("HISTORY CHECKER findings over the order API's log", r.api.findings)
	}
	show("WORKER CRASHES (exited on their own)", r.crashes)
	if r.hot != nil {
		what := "HOT-ORDER PHASE did not hit a hold"
		if len(r.hot.actions) > 0 {
			what = "hot-order phase: planned actions that found no hold (not a violation: others hit one)"
		}
		show(what, r.hot.uncovered)
		var stalls []string
		for _, w := range r.hot.stalls {
			stalls = append(stalls, w.String())
		}
		show(fmt.Sprintf("HOT ORDERS STALLED past %v after a promotion", maxPromotionStall), stalls)
	}
	if n := r.violations(); n > 0 {
		fmt.Fprintf(out, "\nFAIL: %d violations\n", n)
	} else {
		fmt.Fprintln(out, "\nPASS: 0 lost, 0 double-applied, 0 overlaps, 0 locks left, 0 inversions, every order its replay")
	}
}

func sumMap(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
