package main

// The hot-order phase.
//
// A few orders of their own (-hot-orders) are flooded with many changes
// each (-hot-changes), sent back to back by two clients per order, far
// faster than the workers apply them: every change but the head is parked
// at acceptance (on a Cluster, by the workers when they find it is not its
// turn), and a worker that commits one of them keeps the order's lock and
// runs the next ones itself in the same hold (worker/drain.go). The flood
// starts a second before the chaos phase's first Redis switch, so that the
// switch finds holds draining, and the phase aims its own chaos at the
// holds: it tails the workers' logs, and a worker that has just logged
// runs of a hot order taken in a hold ("drained":true) is SIGKILLed (and
// started again) or frozen with SIGSTOP for -pause-for, past its lock's
// lease, in the middle of that hold (-hot-kills, -hot-freezes; the kill
// after the first two waits for the Redis switch). A killed holder's
// claimed tasks stay active in asynq until the workers' recoverer brings
// them back (asynq's 30 s lease plus RecoverAfter), and the one it had
// applied replays from the store's dedupe.
//
// The hot orders are checked with everything else (check.go): nothing
// lost, nothing applied twice, no overlap, no inversion, each order the
// replay of its changes. The phase adds its evidence to the report: each
// kill and freeze with the runs its worker had just logged in the hold,
// the hot order's tasks still active in asynq 3 s after a kill (the dead
// holder's claims), the runs taken in holds, the hot tasks the recoverer
// brought back, and the holds running when Redis switched. A kill or
// freeze that found no worker mid-hold is a violation: the phase did not
// test what it is for.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
)

const (
	// hotClients is how many clients flood each hot order, each sending
	// one change after another.
	hotClients = 2
	// hotPoll is how often the phase reads the workers' logs for holds.
	hotPoll = 25 * time.Millisecond
	// hotMidHold is how many runs of a hot order a worker must have logged
	// as drained since the last poll to count as in the middle of a hold.
	hotMidHold = 2
	// hotGap is the least time between two of the phase's kills and
	// freezes.
	hotGap = 300 * time.Millisecond
	// hotTargetFor bounds how long after the flood starts the phase looks
	// for holds to kill or freeze: past the recovery of a killed holder's
	// tasks (asynq's 30 s lease, RecoverAfter, RecoverEvery), which its
	// hot orders wait for.
	hotTargetFor = 60 * time.Second
	// hotHoldsSeen is how lately a worker must have logged a drained run
	// of a hot order to count as holding it.
	hotHoldsSeen = 200 * time.Millisecond
	// hotPicky is how long the phase waits for a worker holding one hot
	// order only before it takes one holding several. It waits less when
	// hotPickyShare of the flood drains first: a fast engine drains the
	// whole flood within hotPicky, and a phase that waited for it would
	// find no hold left to hit.
	hotPicky = 2 * time.Second
	// hotPickyShare is the share of the flood (all hot orders' changes)
	// whose runs end the wait for a worker holding one hot order only.
	hotPickyShare = 4
	// hotActiveAfter is when, after a kill, the phase lists the killed
	// hold's order's tasks still active in asynq.
	hotActiveAfter = 3 * time.Second
	// hotEventPrefix starts the event IDs of the flood.
	hotEventPrefix = "hot-"
)

// hotOrderNos returns n order numbers for the hot orders, spread over the
// shards of a cluster (nil for one Redis) so that every master's failure
// finds one.
func hotOrderNos(n int, cl *redisproc.Cluster) []string {
	if cl == nil {
		nos := make([]string, n)
		for i := range n {
			nos[i] = "H" + strconv.Itoa(i)
		}
		return nos
	}
	perShard := make([][]string, redisproc.ClusterMasters)
	for i, found := 0, 0; found < n && i < 100*n+1000; i++ {
		no := "H" + strconv.Itoa(i)
		sh := cl.ShardOf(prefix + "order:{" + no + "}")
		// Fill the shards evenly: at most ceil(n/masters) each.
		if len(perShard[sh]) < (n+redisproc.ClusterMasters-1)/redisproc.ClusterMasters {
			perShard[sh] = append(perShard[sh], no)
			found++
		}
	}
	var nos []string
	for i := 0; len(nos) < n; i++ {
		for _, s := range perShard {
			if i < len(s) && len(nos) < n {
				nos = append(nos, s[i])
			}
		}
	}
	return nos
}

// hotEvent is the event ID of change i of hot order no.
func hotEvent(no string, i int) string { return hotEventPrefix + no + "-" + strconv.Itoa(i) }

// hotOrderOf returns the hot order of a flood's event ID.
func hotOrderOf(ev string) (string, bool) {
	rest, ok := strings.CutPrefix(ev, hotEventPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// flood enqueues n modifies to each of the orders nos, from hotClients
// clients per order (numbered from firstClient), each sending one change
// after another as fast as the producer accepts them.
func (l *load) flood(ctx context.Context, nos []string, n, firstClient int) error {
	errs := make(chan error, len(nos)*hotClients)
	var wg sync.WaitGroup
	for j, no := range nos {
		for k := range hotClients {
			client := firstClient + j*hotClients + k
			wg.Go(func() {
				for i := k; i < n; i += hotClients {
					if err := l.hotChange(ctx, client, no, i); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// hotChange enqueues change i of hot order no, from client.
func (l *load) hotChange(ctx context.Context, client int, no string, i int) error {
	ev := hotEvent(no, i)
	t := enqueued{EventID: ev, Client: client, Type: taskModify, OrderNo: no}
	switch i % 3 {
	case 0:
		t.Changes.Address = new("hot address " + strconv.Itoa(i))
	case 1:
		t.Changes.Remark = new("hot remark " + strconv.Itoa(i))
	default:
		t.Changes.Items = []tasks.Item{{SKU: "A", Qty: 1 + i%7}, {SKU: "H" + strconv.Itoa(i%13), Qty: 1}}
	}
	payload := tasks.ModifyPayload{EventID: ev, OrderNo: no, Changes: t.Changes}
	res, err := l.retryEnqueue(ctx, func(ctx context.Context) (producer.Result, error) {
		return l.p.Enqueue(ctx, payload)
	})
	if err != nil {
		return fmt.Errorf("hot modify %s: %w", ev, err)
	}
	t.Seq, t.Queue = res.Seq, res.Queue
	t.At = time.Since(l.start)
	l.mu.Lock()
	l.tasks = append(l.tasks, t)
	l.mu.Unlock()
	return nil
}

// logLine is the part of a worker's JSON log line the phase reads.
type logLine struct {
	TS      string   `json:"ts"`
	Msg     string   `json:"msg"`
	OrderNo string   `json:"order_no"`
	EventID string   `json:"event_id"`
	Seq     int64    `json:"seq"`
	Fence   int64    `json:"fence"`
	Drained bool     `json:"drained"`
	TaskIDs []string `json:"task_ids"`
}

// logTimeLayout is the workers' log time (zap's ISO 8601 encoder).
const logTimeLayout = "2006-01-02T15:04:05.000Z0700"

// The log messages the phase reads (worker/middleware.go, worker/worker.go).
const (
	msgTaskDone  = "task done"
	msgRecovered = "brought back the tasks of a worker whose lease expired"
)

// relevant says whether a raw log line may be one the phase reads; it
// spares the JSON decoding of the others.
func relevant(b []byte) bool {
	return bytes.Contains(b, []byte(`"drained":true`)) || bytes.Contains(b, []byte(msgRecovered)) ||
		bytes.Contains(b, []byte(`"event_id":"`+hotEventPrefix))
}

// logTail reads the lines that log files gained since the last read.
type logTail struct {
	off map[string]int64
}

// skip makes the next read of path start at its current end.
func (t *logTail) skip(path string) {
	if st, err := os.Stat(path); err == nil {
		t.off[path] = st.Size()
	}
}

// read returns the relevant complete lines path gained since the last read.
func (t *logTail) read(path string) []logLine {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, t.off[path], 1<<40))
	if err != nil {
		return nil
	}
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return nil
	}
	t.off[path] += int64(end + 1)
	var lines []logLine
	for raw := range bytes.Lines(b[:end+1]) {
		if !relevant(raw) {
			continue
		}
		var l logLine
		if json.Unmarshal(raw, &l) == nil {
			lines = append(lines, l)
		}
	}
	return lines
}

// hotAction is one kill or freeze of a worker in the middle of a hold.
type hotAction struct {
	kind    string // "SIGKILL" or "SIGSTOP"
	slot    int
	pid     int
	orderNo string
	at      time.Duration // into the chaos phase
	window  int           // runs of the order the worker logged as drained in the poll before
	last    logLine       // the last of them
	holds   int           // the hot orders the worker was draining then
	// kills: the order's flood tasks still active in asynq hotActiveAfter
	// later (the dead holder's claims, which wait for the recoverer).
	activeAfter []string
	activeErr   error
}

func (a *hotAction) String() string {
	s := fmt.Sprintf("%s of worker %d (pid %d) %v into the chaos phase, in a hold of %s (holds of %d hot orders): %d runs of it logged \"drained\":true in the %v before, the last %s at seq %d with fence %d",
		a.kind, a.slot, a.pid, a.at.Round(time.Millisecond), a.orderNo, a.holds, a.window, hotPoll, a.last.EventID, a.last.Seq, a.last.Fence)
	if a.kind == "SIGKILL" {
		switch {
		case a.activeErr != nil:
			s += fmt.Sprintf("; its tasks active %v later: %v", hotActiveAfter, a.activeErr)
		default:
			s += fmt.Sprintf("; %d of %s's tasks still active in asynq %v later %v", len(a.activeAfter), a.orderNo, hotActiveAfter, a.activeAfter)
		}
	}
	return s
}

// hotSample is the runs of each hot order that the workers logged as
// drained in one poll.
type hotSample struct {
	at      time.Duration // into the chaos phase
	drained map[string]int
}

// hot runs the hot-order phase. Its figures are read once run returned.
type hot struct {
	c     settings
	nos   []string
	pool  *workerPool
	insp  *asynq.Inspector
	out   io.Writer
	start time.Time     // of the chaos phase
	at    time.Duration // when the flood starts, into the chaos phase
	later time.Duration // the actions after the first two wait until then

	mu        sync.Mutex
	actions   []*hotAction
	uncovered []string // kills and freezes that found no worker mid-hold
	samples   []hotSample
}

// newHot plans the phase: the flood starts at -hot-at, by default a second
// before the first Redis switch (a third into the chaos phase without
// one); the kills and freezes after the first two wait until a second
// after that switch.
func newHot(c settings, nos []string, pool *workerPool, insp *asynq.Inspector, switches []redisSwitch, out io.Writer) *hot {
	h := &hot{c: c, nos: nos, pool: pool, insp: insp, out: out}
	first := c.Duration / 3
	if len(switches) > 0 {
		first = switches[0].at
	}
	h.at = cmp.Or(c.HotAt, max(first-time.Second, 0))
	h.later = max(first+time.Second, h.at+2*time.Second)
	return h
}

// run waits until the flood's time, floods the hot orders through l and
// kills and freezes their holders, until the flood is enqueued and the
// planned kills and freezes are made (or hotTargetFor passed), and the
// frozen workers continued.
func (h *hot) run(ctx context.Context, l *load, firstClient int) error {
	h.start = l.start
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(time.Until(h.start.Add(h.at))):
	}
	fmt.Fprintf(h.out, "hot orders %v: flooding %d changes each, %v into the chaos phase\n", h.nos, h.c.HotChanges, time.Since(h.start).Round(100*time.Millisecond))
	floodDone := make(chan error, 1)
	go func() { floodDone <- l.flood(ctx, h.nos, h.c.HotChanges, firstClient) }()
	var wg sync.WaitGroup
	h.target(ctx, &wg)
	wg.Wait()
	return <-floodDone
}

// plan returns the kills and freezes of the phase, in turn.
func (h *hot) plan() []string {
	var p []string
	for i := range max(h.c.HotKills, h.c.HotFreezes) {
		if i < h.c.HotKills {
			p = append(p, "SIGKILL")
		}
		if i < h.c.HotFreezes {
			p = append(p, "SIGSTOP")
		}
	}
	return p
}

// target makes the planned kills and freezes, each of a worker that has
// just logged runs of a hot order taken in a hold, preferring the orders
// hit least so far. Freezes run in wg.
func (h *hot) target(ctx context.Context, wg *sync.WaitGroup) {
	plan := h.plan()
	tail := &logTail{off: map[string]int64{}}
	for slot := range h.c.Workers {
		_, log := h.pool.current(slot)
		tail.skip(log)
	}
	began := time.Now()
	notBefore := began
	hits := map[string]int{}
	frozen := map[*benchkit.Process]bool{}
	// seen is when each worker last logged a run of each hot order taken
	// in a hold: a kill or freeze stops every hold its worker has, so a
	// worker holding one hot order only is preferred.
	seen := map[*benchkit.Process]map[string]time.Time{}
	tick := time.NewTicker(hotPoll)
	defer tick.Stop()
	type holder struct {
		slot    int
		proc    *benchkit.Process
		orderNo string
	}
	next := 0
	// drained counts the hot orders' runs logged since notBefore, for the
	// wait for a worker holding one hot order only.
	drained := 0
	pickyRuns := max(len(h.nos)*h.c.HotChanges/hotPickyShare, 1)
	for next < len(plan) && time.Since(began) < hotTargetFor {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		window := map[holder][]logLine{}
		sample := hotSample{at: now.Sub(h.start), drained: map[string]int{}}
		for slot := range h.c.Workers {
			proc, log := h.pool.current(slot)
			for _, l := range tail.read(log) {
				if l.Msg == msgTaskDone && l.Drained && slices.Contains(h.nos, l.OrderNo) {
					k := holder{slot, proc, l.OrderNo}
					window[k] = append(window[k], l)
					sample.drained[l.OrderNo]++
					drained++
					if seen[proc] == nil {
						seen[proc] = map[string]time.Time{}
					}
					seen[proc][l.OrderNo] = now
				}
			}
		}
		h.mu.Lock()
		h.samples = append(h.samples, sample)
		h.mu.Unlock()
		if now.Before(notBefore) {
			drained = 0
			continue
		}
		// holds counts the hot orders a worker drained lately.
		holds := func(proc *benchkit.Process) int {
			n := 0
			for _, t := range seen[proc] {
				if now.Sub(t) < hotHoldsSeen {
					n++
				}
			}
			return n
		}
		// A worker in several hot holds qualifies only after a while, or
		// once a share of the flood drained without a worker holding one.
		picky := now.Sub(notBefore) < hotPicky && drained < pickyRuns
		var best *holder
		for k, ls := range window {
			if len(ls) < hotMidHold || frozen[k.proc] || picky && holds(k.proc) > 1 {
				continue
			}
			if best == nil || hits[k.orderNo] < hits[best.orderNo] ||
				hits[k.orderNo] == hits[best.orderNo] && holds(k.proc) < holds(best.proc) ||
				hits[k.orderNo] == hits[best.orderNo] && holds(k.proc) == holds(best.proc) && len(ls) > len(window[*best]) {
				best = &k
			}
		}
		if best == nil {
			continue
		}
		ls := window[*best]
		a := &hotAction{kind: plan[next], slot: best.slot, pid: best.proc.Pid(), orderNo: best.orderNo,
			at: now.Sub(h.start), window: len(ls), last: ls[len(ls)-1], holds: holds(best.proc)}
		switch a.kind {
		case "SIGKILL":
			if err := h.pool.killProc(best.slot, best.proc); err != nil {
				fmt.Fprintf(h.out, "hot: restart worker %d after its kill: %v\n", best.slot, err)
			}
			_, log := h.pool.current(best.slot)
			tail.skip(log)
			wg.Go(func() { h.activeAfter(ctx, a) })
		default:
			frozen[best.proc] = true
			h.pool.trouble.add(best.slot, "SIGSTOP", h.c.PauseFor+time.Second)
			wg.Go(func() { pauseProc(ctx, best.proc, h.c.PauseFor) })
		}
		fmt.Fprintf(h.out, "hot: %s of worker %d (pid %d) %v into the chaos phase, %d runs into a hold of %s (last %s, seq %d; holds of %d hot orders)\n",
			a.kind, a.slot, a.pid, a.at.Round(time.Millisecond), a.window, a.orderNo, a.last.EventID, a.last.Seq, a.holds)
		h.mu.Lock()
		h.actions = append(h.actions, a)
		h.mu.Unlock()
		hits[best.orderNo]++
		next++
		notBefore = time.Now().Add(hotGap)
		if next >= 2 {
			if t := h.start.Add(h.later); t.After(notBefore) {
				notBefore = t
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, kind := range plan[next:] {
		h.uncovered = append(h.uncovered, fmt.Sprintf("%s: no worker found in the middle of a hold of a hot order within %v of the flood", kind, hotTargetFor))
	}
}

// activeAfter lists, hotActiveAfter after kill a, the tasks of a's order
// that are active in asynq.
func (h *hot) activeAfter(ctx context.Context, a *hotAction) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(hotActiveAfter):
	}
	ids, err := h.activeOf(a.orderNo)
	h.mu.Lock()
	defer h.mu.Unlock()
	a.activeAfter, a.activeErr = ids, err
}

// activeOf returns the flood's tasks of order no that are active in asynq.
func (h *hot) activeOf(no string) ([]string, error) {
	queues, err := orderQueues(h.insp)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, q := range queues {
		for page := 1; ; page++ {
			infos, err := h.insp.ListActiveTasks(q, asynq.PageSize(1000), asynq.Page(page))
			if errors.Is(err, asynq.ErrQueueNotFound) {
				break
			}
			if err != nil {
				return ids, err
			}
			for _, info := range infos {
				if o, ok := hotOrderOf(info.ID); ok && o == no {
					ids = append(ids, info.ID)
				}
			}
			if len(infos) < 1000 {
				break
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// hotReport is the phase's evidence, for the results.
type hotReport struct {
	nos       []string
	changes   int
	at        time.Duration
	actions   []*hotAction
	uncovered []string
	// From every worker log of the run:
	done      map[string]int      // hot order → runs logged "task done"
	drained   map[string]int      // of them, taken in a hold
	recovered map[string][]string // hot order → its tasks the recoverer brought back
	killedLog map[int]int         // pid of a killed holder → the runs of its order it had logged as drained
	// Holds running at the Redis switches: for each switch, the runs of
	// each hot order logged as drained in the second before it began.
	atSwitch []string
	// The hot orders' waits after each promotion (stall.go), and those
	// past the bound that no nemesis explains.
	waits, stalls []promotionWait
}

// report reads the workers' logs in dir once the run has drained and
// returns the phase's evidence.
func (h *hot) report(dir string, switches []switched, accepted map[string]time.Time) (*hotReport, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &hotReport{nos: h.nos, changes: h.c.HotChanges, at: h.at, actions: h.actions, uncovered: h.uncovered,
		done: map[string]int{}, drained: map[string]int{}, recovered: map[string][]string{}, killedLog: map[int]int{}}
	logs, err := filepath.Glob(filepath.Join(dir, "worker*.log"))
	if err != nil {
		return nil, err
	}
	killedOrder := map[int]string{}
	for _, a := range h.actions {
		if a.kind == "SIGKILL" {
			killedOrder[a.pid] = a.orderNo
		}
	}
	runs := map[string][]hotRun{}
	for _, path := range logs {
		pid, slot := h.pool.pidOf(path), h.pool.slotOf(path)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			raw := sc.Bytes()
			if !relevant(raw) {
				continue
			}
			var l logLine
			if json.Unmarshal(raw, &l) != nil {
				continue
			}
			switch {
			case l.Msg == msgTaskDone && slices.Contains(h.nos, l.OrderNo):
				r.done[l.OrderNo]++
				if at, err := time.Parse(logTimeLayout, l.TS); err == nil {
					runs[l.OrderNo] = append(runs[l.OrderNo], hotRun{at: at, event: l.EventID, slot: slot})
				}
				if l.Drained {
					r.drained[l.OrderNo]++
					if o, ok := killedOrder[pid]; ok && o == l.OrderNo {
						r.killedLog[pid]++
					}
				}
			case l.Msg == msgRecovered:
				for _, id := range l.TaskIDs {
					if o, ok := hotOrderOf(id); ok {
						r.recovered[o] = append(r.recovered[o], id)
					}
				}
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	for _, rs := range runs {
		slices.SortFunc(rs, func(a, b hotRun) int { return a.at.Compare(b.at) })
	}
	r.waits, r.stalls = promotionWaits(switches, h.nos, runs, accepted, &h.pool.trouble, h.c.LockTTL)
	for _, s := range switches {
		per := map[string]int{}
		for _, smp := range h.samples {
			if smp.at >= s.began-time.Second && smp.at < s.began {
				for no, n := range smp.drained {
					per[no] += n
				}
			}
		}
		var parts []string
		for _, no := range h.nos {
			parts = append(parts, fmt.Sprintf("%s %d", no, per[no]))
		}
		r.atSwitch = append(r.atSwitch, fmt.Sprintf("%s at %v: runs taken in holds in the second before: %s", s.name, s.began.Round(100*time.Millisecond), strings.Join(parts, ", ")))
	}
	return r, nil
}

// print writes the evidence; appliedBy names the worker (its ID,
// "<host>-<pid>-<random>") that wrote each flood event's history entry.
func (r *hotReport) print(out io.Writer, appliedBy map[string]string) {
	fmt.Fprintf(out, "hot orders:    %d orders × %d changes flooded %v into the chaos phase; runs logged (taken in a hold):", len(r.nos), r.changes, r.at.Round(100*time.Millisecond))
	for _, no := range r.nos {
		fmt.Fprintf(out, " %s %d (%d)", no, r.done[no], r.drained[no])
	}
	fmt.Fprintln(out)
	for _, a := range r.actions {
		fmt.Fprintf(out, "               %s", a)
		if a.kind == "SIGKILL" {
			fmt.Fprintf(out, "; its log has %d runs of %s taken in holds", r.killedLog[a.pid], a.orderNo)
		}
		fmt.Fprintln(out)
	}
	total := 0
	for _, no := range slices.Sorted(maps.Keys(r.recovered)) {
		n := len(r.recovered[no]) // a task killed twice comes back twice
		ids := slices.Compact(slices.Sorted(slices.Values(r.recovered[no])))
		total += n
		fmt.Fprintf(out, "               brought back by the recoverer: %d tasks of %s (%d times) %v", len(ids), no, n, clipList(ids, 8))
		// Those the dead worker had applied replayed from the dedupe.
		var before []string
		for _, id := range ids {
			if w := appliedBy[id]; w != "" && r.killedWorker(w) {
				before = append(before, id+" by "+w)
			}
		}
		if len(before) > 0 {
			fmt.Fprintf(out, "; %d of them applied by a worker the phase killed, then replayed: %v", len(before), clipList(before, 4))
		}
		fmt.Fprintln(out)
	}
	if total == 0 {
		fmt.Fprintln(out, "               brought back by the recoverer: no task of a hot order")
	}
	for _, s := range r.atSwitch {
		fmt.Fprintf(out, "               %s\n", s)
	}
	if len(r.waits) > 0 {
		var worst time.Duration
		explained := 0
		for _, w := range r.waits {
			if len(w.explained) > 0 {
				explained++
				continue
			}
			worst = max(worst, w.wait)
		}
		fmt.Fprintf(out, "               after the promotions: %d waits of a hot order measured, the longest %v with no nemesis on its worker (bound %v); %d behind a nemesis of its worker, bounded from the end of what the nemesis leaves\n",
			len(r.waits), worst.Round(time.Millisecond), maxPromotionStall, explained)
		for _, w := range r.waits {
			fmt.Fprintf(out, "                 %s\n", w)
		}
	}
}

// killedWorker says whether worker ID w ("<host>-<pid>-<random>") is
// of a process the phase killed.
func (r *hotReport) killedWorker(w string) bool {
	for _, a := range r.actions {
		if a.kind == "SIGKILL" && strings.Contains(w, "-"+strconv.Itoa(a.pid)+"-") {
			return true
		}
	}
	return false
}

// clipList returns up to n of ids, and how many more there are.
func clipList(ids []string, n int) string {
	if len(ids) <= n {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v and %d more", ids[:n], len(ids)-n)
}
