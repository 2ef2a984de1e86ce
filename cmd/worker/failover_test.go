package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/intake"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/intaketest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The tests in this file break Redis under the worker binary's run (given
// REDIS_URL alone) while changes keep coming: a Sentinel failover, and a
// Cluster master killed and replaced. Each sends modifies to several
// orders without pause, retrying a failed acceptance with the same event
// ID, and checks per order that every change whose acceptance succeeded
// was applied exactly once, in acceptance order, at the position its
// acceptance answered.
//
// A write the old master acknowledged but the new master never got is lost
// (docs/scaling.md, "What a failover can lose"): one the replica had not received
// yet when it took over (replication is asynchronous), or, on Sentinel, one
// made on the old master after the replica was promoted. SENTINEL FAILOVER
// leaves the old master a writable master until the sentinels make it a
// replica of the new one, at least 8 s later, and a client writes to it
// until it hears of the switch (+switch-master): here about when the
// failover ends, at times seconds later. So a change may be missing from
// its order's history only if its acceptance overlapped the switch's
// window: from lagBound before the switch began (docs/scaling.md's "a
// second or less" of replication lag) until no node the clients may still use
// accepts writes as a master: on a Cluster, until every node names the
// killed master's replica (the killed one accepts nothing); on Sentinel,
// until the old master was demoted. Any other missing change fails the
// test; the ones inside the window are counted and logged. On a Cluster
// none is expected; on Sentinel, every change accepted on the old master
// after the promotion is lost, and the producer saw no error for any.

// lagBound is how far before a switch began a write may have been
// acknowledged and still not replicated.
const lagBound = time.Second

// change is one change a sender got accepted.
type change struct {
	eventID string
	// seq is the position the acceptance answered; 0 when the answer was
	// a duplicate that did not say (the intake's 409).
	seq int64
	// began is when the first attempt began, accepted when the attempt
	// that succeeded returned.
	began, accepted time.Time
	attempts        int
}

// window is the span around a switch within which an acknowledged write
// may have been lost.
type window struct{ from, to time.Time }

// allows reports whether c's acceptance overlapped w.
func (w window) allows(c change) bool { return !c.accepted.Before(w.from) && !c.began.After(w.to) }

// sendFunc makes one attempt to get a modify of order no accepted. It
// returns the position answered, or an error after which the change must
// be sent again with the same event ID. It reports what must never happen
// with t.Errorf itself.
type sendFunc func(ctx context.Context, no, eventID, remark string) (seq int64, err error)

// ledger records what the senders got accepted. It is safe for
// concurrent use.
type ledger struct {
	mu       sync.Mutex
	byOrder  map[string][]change // in acceptance order
	failures []time.Time         // when failed attempts returned
	samples  []string            // the first failures' texts
}

func newLedger() *ledger { return &ledger{byOrder: make(map[string][]change)} }

func (l *ledger) add(no string, c change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byOrder[no] = append(l.byOrder[no], c)
}

func (l *ledger) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, time.Now())
	if len(l.samples) < 3 {
		l.samples = append(l.samples, err.Error())
	}
}

// snapshot returns a copy of the accepted changes.
func (l *ledger) snapshot() map[string][]change {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]change, len(l.byOrder))
	for no, cs := range l.byOrder {
		out[no] = slices.Clone(cs)
	}
	return out
}

// failed returns how many attempts failed, and when the first and the last
// returned.
func (l *ledger) failed() (n int, first, last time.Time, samples []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) == 0 {
		return 0, time.Time{}, time.Time{}, nil
	}
	return len(l.failures), l.failures[0], l.failures[len(l.failures)-1], slices.Clone(l.samples)
}

// maxChanges is the most changes produce sends to one order: an order's
// history keeps the last 1000 entries (redisstore's default), which verify
// reads.
const maxChanges = 800

// produce sends modifies of order no, one after the other, every pace,
// until stop is closed or it sent maxChanges: each change is sent again with its event ID until
// it is accepted, so that a sender stops only between changes and every
// change it began is in the ledger. It returns early when ctx ends.
func (l *ledger) produce(ctx context.Context, stop <-chan struct{}, no string, pace time.Duration, send sendFunc) {
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for i := 1; i <= maxChanges; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c := change{eventID: fmt.Sprintf("%s-%d", no, i), began: time.Now()}
		for {
			c.attempts++
			seq, err := send(ctx, no, c.eventID, "remark "+strconv.Itoa(i))
			if err == nil {
				c.seq, c.accepted = seq, time.Now()
				l.add(no, c)
				break
			}
			if ctx.Err() != nil {
				return
			}
			l.fail(err)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}
}

// producerAttempt bounds one attempt through the producer.
const producerAttempt = 2 * time.Second

// producerSender sends through p. An error that is neither a duplicate
// nor ErrUnavailable fails the test.
func producerSender(t *testing.T, p *producer.Producer) sendFunc {
	return func(ctx context.Context, no, eventID, remark string) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, producerAttempt)
		defer cancel()
		res, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: &remark}, producer.WithEventID(eventID))
		var dup *producer.DuplicateError
		switch {
		case err == nil:
			return res.Seq, nil
		case errors.As(err, &dup) && dup.LookupErr == nil:
			// An earlier attempt was accepted after all: the caller takes
			// the duplicate of the same change for success.
			if !dup.SamePayload {
				t.Errorf("producer: %s refused as another change: %v", eventID, err)
			}
			return dup.Seq, nil
		case errors.As(err, &dup):
			return 0, err // the existing task could not be read: send again
		case !errors.Is(err, producer.ErrUnavailable) || !strings.HasPrefix(err.Error(), "producer: "):
			t.Errorf("producer: %s: an error that is not ErrUnavailable: %v", eventID, err)
		}
		return 0, err
	}
}

// intakeKey is the intake's API key in these tests.
const intakeKey = "failover-test-key-0123456789"

// intakeSender posts to the intake through s (see intaketest.Sender.Modify
// for what it checks of every answer).
func intakeSender(t *testing.T, s *intaketest.Sender) sendFunc {
	return func(ctx context.Context, no, eventID, remark string) (int64, error) {
		return s.Modify(ctx, t, no, eventID, remark)
	}
}

// verify compares the orders' histories with the ledger. It returns the
// event IDs missing from their order's history that w allows (lost in the
// switch), the modifies applied per order, and what is wrong: a change
// applied twice, out of acceptance order or at another position than its
// acceptance answered, an unknown change applied, or a change missing that
// w does not allow (which, while tasks still run, may only be late).
func (l *ledger) verify(ctx context.Context, store orders.Store, w window) (lost []string, applied map[string][]orders.Entry, problems []string) {
	applied = make(map[string][]orders.Entry)
	for no, cs := range l.snapshot() {
		all, err := orders.AllHistory(ctx, store, no)
		if err != nil {
			return nil, nil, []string{fmt.Sprintf("history of %s: %v", no, err)}
		}
		var mods []orders.Entry
		for _, e := range all {
			if e.Type == orders.TypeModify {
				mods = append(mods, e)
			}
		}
		applied[no] = mods
		seen := make(map[string]bool)
		for i, e := range mods {
			if seen[e.EventID] {
				problems = append(problems, fmt.Sprintf("%s: %s applied twice", no, e.EventID))
			}
			seen[e.EventID] = true
			if i > 0 && e.Seq <= mods[i-1].Seq {
				problems = append(problems, fmt.Sprintf("%s: %s at position %d applied after %s at %d", no, e.EventID, e.Seq, mods[i-1].EventID, mods[i-1].Seq))
			}
		}
		j := 0
		for _, c := range cs {
			if j < len(mods) && mods[j].EventID == c.eventID {
				if c.seq != 0 && mods[j].Seq != c.seq {
					problems = append(problems, fmt.Sprintf("%s: %s applied at position %d, accepted at %d", no, c.eventID, mods[j].Seq, c.seq))
				}
				j++
				continue
			}
			if seen[c.eventID] {
				problems = append(problems, fmt.Sprintf("%s: %s applied out of acceptance order", no, c.eventID))
				continue
			}
			if w.allows(c) {
				lost = append(lost, fmt.Sprintf("%s (%+dms..%+dms)", c.eventID, c.began.Sub(w.to).Milliseconds(), c.accepted.Sub(w.to).Milliseconds()))
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: %s (began %+dms, accepted %+dms after the window ended, %d attempts) not applied",
				no, c.eventID, c.began.Sub(w.to).Milliseconds(), c.accepted.Sub(w.to).Milliseconds(), c.attempts))
		}
		for _, e := range mods[j:] {
			if !slices.ContainsFunc(cs, func(c change) bool { return c.eventID == e.EventID }) {
				problems = append(problems, fmt.Sprintf("%s: %s applied, never accepted", no, e.EventID))
			}
		}
	}
	return lost, applied, problems
}

// queuesIdle reports whether no task of the order queues is pending,
// scheduled or waiting to be retried, and every active task is one whose
// change is applied already (done is nil, or holds the applied event IDs).
// It returns those active tasks too: tasks whose end asynq could not
// record when the queue's master died. asynq v0.25.1 queues that write
// for a retry that never succeeds (the retry carries a context cancelled
// as it is queued), so they stay active until asynq's recoverer takes
// them back, 60 to 120 s later, and run again (the store answers them as
// replays).
func queuesIdle(insp *asynq.Inspector, done map[string]bool) (idle bool, stranded []string) {
	queues, err := insp.Queues()
	if err != nil {
		return false, nil
	}
	for _, q := range queues {
		info, err := insp.GetQueueInfo(q)
		if err != nil || info.Pending+info.Scheduled+info.Retry > 0 {
			return false, nil
		}
		if info.Active == 0 {
			continue
		}
		active, err := insp.ListActiveTasks(q)
		if err != nil {
			return false, nil
		}
		for _, ti := range active {
			if !done[ti.ID] {
				return false, nil
			}
			stranded = append(stranded, ti.ID)
		}
	}
	return true, stranded
}

// diagnose describes the state of a run that does not go on.
func diagnose(ctx context.Context, l *ledger, store orders.Store, insp *asynq.Inspector, nos []string, since time.Time, w *faultWorker) string {
	n, _, last, samples := l.failed()
	sent := l.snapshot()
	var out []string
	out = append(out, fmt.Sprintf("%d failed attempts, the last at %s: %q", n, last.Format("15:04:05.000"), samples))
	for _, no := range nos {
		k := 0
		for _, c := range sent[no] {
			if c.began.After(since) {
				k++
			}
		}
		all, _ := orders.AllHistory(ctx, store, no)
		lastApplied := ""
		if len(all) > 0 {
			e := all[len(all)-1]
			lastApplied = fmt.Sprintf("%s at %d (%s)", e.EventID, e.Seq, e.EndedAt.Format("15:04:05.000"))
		}
		out = append(out, fmt.Sprintf("%s: %d accepted, %d since; last applied %s", no, len(sent[no]), k, lastApplied))
	}
	out = append(out, queueStates(insp), "worker log:", w.logs.String())
	return strings.Join(out, "\n")
}

// queueStates describes the order queues, for a failure message.
func queueStates(insp *asynq.Inspector) string {
	var out []string
	for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
		info, err := insp.GetQueueInfo(q)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", q, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %d pending, %d active, %d scheduled, %d retry, %d archived",
			q, info.Pending, info.Active, info.Scheduled, info.Retry, info.Archived))
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){insp.ListActiveTasks, insp.ListRetryTasks, insp.ListScheduledTasks, insp.ListArchivedTasks} {
			ts, _ := list(q)
			for _, ti := range ts {
				out = append(out, fmt.Sprintf("  %s %s retried %d next %s last error %q", ti.ID, ti.State, ti.Retried, ti.NextProcessAt.Format("15:04:05.000"), ti.LastErr))
			}
		}
	}
	return strings.Join(out, "\n")
}

// drain waits until the queues are idle (see queuesIdle) and verify finds
// nothing wrong, and returns what verify found then; it fails the test with
// the problems when that does not happen within timeout.
func (l *ledger) drain(t *testing.T, ctx context.Context, store orders.Store, insp *asynq.Inspector, w window, timeout time.Duration, logs *lockedBuffer) (lost []string, applied map[string][]orders.Entry) {
	t.Helper()
	var problems, stranded []string
	ok := poll(ctx, timeout, func() bool {
		lost, applied, problems = l.verify(ctx, store, w)
		if len(problems) > 0 {
			return false
		}
		done := make(map[string]bool)
		for _, es := range applied {
			for _, e := range es {
				done[e.EventID] = true
			}
		}
		var idle bool
		idle, stranded = queuesIdle(insp, done)
		return idle
	})
	if !ok {
		t.Fatalf("not drained after %v (%s); problems:\n%s", timeout, queueStates(insp), strings.Join(problems, "\n")+"\nworker log:\n"+logs.String())
	}
	if len(stranded) > 0 {
		t.Logf("tasks applied but still active (their end was not recorded; asynq's recoverer runs them again later): %v", stranded)
	}
	// A task whose position the old master handed out, enqueued on the new
	// one after the clients switched, is archived there (its position was
	// never handed out there): lost like the rest of the window, and only
	// then allowed.
	inWindow := make(map[string]bool)
	for _, cs := range l.snapshot() {
		for _, c := range cs {
			inWindow[c.eventID] = w.allows(c)
		}
	}
	for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
		archived, err := insp.ListArchivedTasks(q, asynq.PageSize(1000))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Errorf("archived tasks of %s: %v", q, err)
		}
		var excused int
		for _, a := range archived {
			if inWindow[a.ID] {
				excused++
				continue
			}
			t.Errorf("task %s archived in %s: %s", a.ID, q, a.LastErr)
		}
		if excused > 0 {
			t.Logf("%d tasks accepted in the window archived in %s (their position was handed out by the old master only)", excused, q)
		}
	}
	return lost, applied
}

// poll calls cond every 20 ms until it returns true (true), or timeout or
// ctx ends (false).
func poll(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// appliedSince returns the fewest modifies that any order of nos had
// applied among its changes first sent after t, the earliest time one of
// them was applied, and the time by which every order had one applied
// (zero until then).
func appliedSince(ctx context.Context, store orders.Store, l *ledger, nos []string, t time.Time) (least int, first, every time.Time) {
	least = -1
	sent := l.snapshot()
	for _, no := range nos {
		after := make(map[string]bool)
		for _, c := range sent[no] {
			if c.began.After(t) {
				after[c.eventID] = true
			}
		}
		all, err := orders.AllHistory(ctx, store, no)
		if err != nil {
			return 0, time.Time{}, time.Time{}
		}
		n := 0
		var mine time.Time
		for _, e := range all {
			if after[e.EventID] {
				n++
				if mine.IsZero() || e.EndedAt.Before(mine) {
					mine = e.EndedAt
				}
			}
		}
		if first.IsZero() || (!mine.IsZero() && mine.Before(first)) {
			first = mine
		}
		if mine.After(every) {
			every = mine
		}
		if least < 0 || n < least {
			least = n
		}
	}
	if least == 0 {
		every = time.Time{}
	}
	return least, first, every
}

// longestPause returns the longest time between two applications of the
// histories, and when it began.
func longestPause(applied map[string][]orders.Entry) (gap time.Duration, from time.Time) {
	var ends []time.Time
	for _, es := range applied {
		for _, e := range es {
			ends = append(ends, e.EndedAt)
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(ends); i++ {
		if d := ends[i].Sub(ends[i-1]); d > gap {
			gap, from = d, ends[i-1]
		}
	}
	return gap, from
}

// readiness polls a /readyz every 100 ms and records the answers that were
// not 200.
type readiness struct {
	mu          sync.Mutex
	downs       int
	first, last time.Time
}

func (r *readiness) watch(ctx context.Context, url string) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ok := readyz(ctx, url)
		if ok || ctx.Err() != nil {
			continue
		}
		r.mu.Lock()
		now := time.Now()
		if r.downs == 0 {
			r.first = now
		}
		r.downs++
		r.last = now
		r.mu.Unlock()
	}
}

func (r *readiness) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.downs == 0 {
		return "/readyz answered 200 throughout"
	}
	return fmt.Sprintf("/readyz failed %d times from %s to %s", r.downs, r.first.Format("15:04:05.000"), r.last.Format("15:04:05.000"))
}

func readyz(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// faultWorker is the worker binary's run on a REDIS_URL, with a short gap
// wait (a change accepted on a second attempt leaves a position behind).
type faultWorker struct {
	ops  string
	logs lockedBuffer
	stop context.CancelFunc
	done chan error
}

// gapWait is the workers' GAP_WAIT in these tests: above every attempt's
// bound (producerAttempt, the intake's request timeout), so that no
// position is skipped while its task may still be enqueued.
const gapWait = 5 * time.Second

func startFaultWorker(t *testing.T, ctx context.Context, url, prefix string) *faultWorker {
	t.Helper()
	w := &faultWorker{ops: freeAddr(t), done: make(chan error, 1)}
	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix, "OPS_ADDR": w.ops, "LOG_LEVEL": "warn", "GAP_WAIT": gapWait.String()}
	runCtx, stop := context.WithCancel(ctx)
	w.stop = stop
	go func() {
		w.done <- runLogTo(runCtx, []string{"-concurrency", "8"}, func(k string) string { return env[k] }, &w.logs)
	}()
	return w
}

// shutdown stops the worker and checks that run returned without error.
func (w *faultWorker) shutdown(t *testing.T) {
	t.Helper()
	w.stop()
	select {
	case err := <-w.done:
		require.NoError(t, err, w.logs.String())
	case <-time.After(30 * time.Second):
		t.Error("run did not return after cancel")
	}
}

// seed puts each order of nos in store.
func seed(t *testing.T, ctx context.Context, store orders.Store, nos []string) {
	t.Helper()
	for _, no := range nos {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
}

// senders runs l.produce for each order of send with its sender, every pace, until
// stop; wait returns once all have returned.
func senders(ctx context.Context, l *ledger, stop <-chan struct{}, pace time.Duration, send map[string]sendFunc) (wait func()) {
	var wg sync.WaitGroup
	for no, s := range send {
		wg.Go(func() { l.produce(ctx, stop, no, pace, s) })
	}
	return wg.Wait
}

// report logs what a fault test measured.
func report(t *testing.T, what string, began, ended time.Time, l *ledger, lost []string, applied map[string][]orders.Entry, again, every time.Time) {
	t.Helper()
	n, first, last, samples := l.failed()
	total := 0
	for _, es := range applied {
		total += len(es)
	}
	t.Logf("%s took %v; %d changes applied, %d lost in the window %v", what, ended.Sub(began).Round(time.Millisecond), total, len(lost), lost[max(0, len(lost)-3):])
	if n > 0 {
		t.Logf("%d failed attempts, from %v to %v after the switch began; first: %q", n,
			first.Sub(began).Round(time.Millisecond), last.Sub(began).Round(time.Millisecond), samples)
	} else {
		t.Logf("no failed attempt")
	}
	gap, from := longestPause(applied)
	t.Logf("longest pause in applications: %v, from %v after the switch began; changes sent after the switch were applied from %v after it began, for every order by %v",
		gap.Round(time.Millisecond), from.Sub(began).Round(time.Millisecond), again.Sub(began).Round(time.Millisecond), every.Sub(began).Round(time.Millisecond))
}

// A Sentinel failover in the middle of a run: the worker, and a producer
// sending modifies to four orders without pause, follow the new master;
// every change accepted is applied once, in order, except changes lost
// in the switch's window, which lasts until the old master is demoted
// (logged: every change accepted on the old master after the promotion,
// about a second's worth, at times several).
func TestSentinelFailoverMidRun(t *testing.T) {
	// Without WaitReplicas the changes the old master took after the
	// promotion are lost (inside the window); with WaitReplicas 1 none
	// is: the producer reports them unconfirmed, and they are sent again.
	t.Run("plain", func(t *testing.T) { sentinelFailoverMidRun(t, 0) })
	t.Run("WaitReplicas=1", func(t *testing.T) { sentinelFailoverMidRun(t, 1) })
}

// sentinelFailoverMidRun runs TestSentinelFailoverMidRun with the
// producer's WaitReplicas set to waitReplicas; with 1 or more, no change
// may be lost at all.
func sentinelFailoverMidRun(t *testing.T, waitReplicas int) {
	db := redistest.DedicatedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	url := db.URL()
	o, err := redisconn.Parse(url)
	require.NoError(t, err)
	rdb := o.NewClient() // the producer's and the test's, as another process's
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	nos := []string{"SO1", "SO2", "SO3", "SO4"}
	seed(t, ctx, store, nos)

	w := startFaultWorker(t, ctx, url, db.Prefix)
	defer w.shutdown(t)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: waitReplicas})
	require.NoError(t, err)
	defer p.Close()

	l := newLedger()
	stop := make(chan struct{})
	send := make(map[string]sendFunc)
	for _, no := range nos {
		send[no] = producerSender(t, p)
	}
	wait := senders(ctx, l, stop, 40*time.Millisecond, send)
	stopped := false
	stopSenders := func() {
		if !stopped {
			stopped = true
			close(stop)
			wait()
		}
	}
	defer stopSenders()

	start := time.Now()
	require.True(t, poll(ctx, 30*time.Second, func() bool {
		n, _, _ := appliedSince(ctx, store, l, nos, start)
		return n >= 5
	}), "changes do not flow before the failover")

	began := time.Now()
	old, cur, err := db.Group.Failover(ctx)
	require.NoError(t, err)
	ended := time.Now()
	t.Logf("failover from %s to %s, %s to %s", old, cur, began.Format("15:04:05.000"), ended.Format("15:04:05.000"))
	// The old master stays a writable master until the sentinels make it
	// a replica of the new one, at least 8 s after the failover; a client
	// that has not heard of the switch writes there until then, and the
	// write is lost.
	oc := redis.NewClient(&redis.Options{Addr: old})
	defer oc.Close()
	require.True(t, poll(ctx, 30*time.Second, func() bool {
		role, err := oc.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	}), "the sentinels do not demote the old master")
	demoted := time.Now()
	t.Logf("the old master was demoted %v after the failover ended", demoted.Sub(ended).Round(time.Millisecond))
	var again, every time.Time
	require.True(t, poll(ctx, 75*time.Second, func() bool {
		var n int
		n, again, every = appliedSince(ctx, store, l, nos, ended)
		return n >= 5
	}), "the worker applies no change sent after the failover: %s", diagnose(ctx, l, store, insp, nos, ended, w))
	// Enough sent (about 250 changes an order since the failover, well
	// within the history an order keeps; with WaitReplicas, whose changes
	// are confirmed again only once the old master replicates the new one,
	// a few after that); an order may still wait for a stranded task (see
	// queuesIdle).
	stopSenders()

	w0 := window{began.Add(-lagBound), demoted}
	if waitReplicas > 0 {
		w0 = window{} // every confirmed change is on the promoted replica
	}
	lost, applied := l.drain(t, ctx, store, insp, w0, 75*time.Second, &w.logs)
	report(t, "the failover", began, ended, l, lost, applied, again, every)
	require.True(t, readyz(ctx, "http://"+w.ops+"/readyz"), "the worker is ready after the failover")
	cleanQueues(t, rdb)
}

// startIntake serves the intake (the handler of "producer serve") on url
// with a client of its own, as its own process would, and returns its base
// URL. Its request timeout is below gapWait.
func startIntake(t *testing.T, url, prefix string) string {
	t.Helper()
	o, err := redisconn.Parse(url)
	require.NoError(t, err)
	rdb := o.NewClient()
	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	h, err := intake.New(rdb, p, store, intake.Config{APIKeys: []string{intakeKey}, RequestTimeout: producerAttempt, Logger: zap.NewNop()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		_ = p.Close()
		_ = rdb.Close()
	})
	return srv.URL
}

// A Cluster master killed in the middle of a run, the master of the
// modify queue and of two of the six orders: the worker and the intake
// recover by themselves, the intake answers 202 or 503 with Retry-After,
// the producer's errors match ErrUnavailable, and every change sent again
// with its event ID until accepted is applied once, in order. The old
// master then rejoins as a replica, still under load.
func TestClusterMasterKilledMidRun(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	url := db.URL()
	o, err := redisconn.Parse(url)
	require.NoError(t, err)
	rdb := o.NewClient()
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	name := func(p string) func(int) string { return func(i int) string { return p + strconv.Itoa(i) } }
	viaProducer := db.Cluster.OnEachMaster(name("SP"))
	viaIntake := db.Cluster.OnEachMaster(name("SI"))
	nos := append(slices.Clone(viaProducer), viaIntake...)
	seed(t, ctx, store, nos)
	shard := db.Cluster.ShardOf("asynq:{" + tasks.QueueModify + "}")
	t.Logf("killing the master of shard %d (%s): the modify queue, orders %s and %s",
		shard, db.Cluster.Masters()[shard], viaProducer[shard], viaIntake[shard])

	w := startFaultWorker(t, ctx, url, db.Prefix)
	defer w.shutdown(t)
	var ready readiness
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { ready.watch(watchCtx, "http://"+w.ops+"/readyz") })
	defer watching.Wait()
	defer stopWatch()

	prdb := o.NewClient() // the Go producer's, as another process's
	defer prdb.Close()
	p, err := producer.New(prdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	defer p.Close()
	base := startIntake(t, url, db.Prefix)
	intakeTo := intaketest.NewSender(t, base, intakeKey)

	l := newLedger()
	stop := make(chan struct{})
	send := make(map[string]sendFunc)
	for _, no := range viaProducer {
		send[no] = producerSender(t, p)
	}
	for _, no := range viaIntake {
		send[no] = intakeSender(t, intakeTo)
	}
	wait := senders(ctx, l, stop, 80*time.Millisecond, send)
	stopped := false
	stopSenders := func() {
		if !stopped {
			stopped = true
			close(stop)
			wait()
		}
	}
	defer stopSenders()

	start := time.Now()
	require.True(t, poll(ctx, 30*time.Second, func() bool {
		n, _, _ := appliedSince(ctx, store, l, nos, start)
		return n >= 5
	}), "changes do not flow before the kill")
	t.Logf("flowing after %v", time.Since(start).Round(time.Millisecond))

	began := time.Now()
	old, cur, err := db.Cluster.KillMaster(ctx, shard)
	require.NoError(t, err)
	ended := time.Now()
	t.Logf("master %s killed, %s took over", old, cur)

	// An order whose turn a stranded task holds (see queuesIdle) waits
	// until the workers' recoverer brings that task back: its asynq lease
	// of 30 s, then RecoverAfter (10 s), looked for every 5 s.
	var again, every time.Time
	require.True(t, poll(ctx, 75*time.Second, func() bool {
		var n int
		n, again, every = appliedSince(ctx, store, l, nos, ended)
		return n >= 5
	}), "the worker applies no change sent after the switch: %s", diagnose(ctx, l, store, insp, nos, ended, w))
	require.True(t, poll(ctx, 10*time.Second, func() bool { return readyz(ctx, "http://"+w.ops+"/readyz") }),
		"the worker's /readyz after the switch")

	rejoinBegan := time.Now()
	require.NoError(t, db.Cluster.Rejoin(ctx, old))
	rejoined := time.Now()
	t.Logf("%s rejoined as a replica in %v", old, rejoined.Sub(rejoinBegan).Round(time.Millisecond))
	require.True(t, poll(ctx, 30*time.Second, func() bool {
		n, _, _ := appliedSince(ctx, store, l, nos, rejoined)
		return n >= 3
	}), "the worker applies no change sent after the rejoin")
	stopSenders()
	drainBegan := time.Now()

	lost, applied := l.drain(t, ctx, store, insp, window{began.Add(-lagBound), ended}, 75*time.Second, &w.logs)
	t.Logf("drained in %v", time.Since(drainBegan).Round(time.Millisecond))
	report(t, "the switch", began, ended, l, lost, applied, again, every)
	t.Logf("the intake answered 503 (with Retry-After) %d times; %s", intakeTo.Unavailable.Load(), &ready)
	require.True(t, readyz(ctx, "http://"+w.ops+"/readyz"), "the worker is ready at the end")
	cleanQueues(t, rdb)
}

// failEnqueue is a Redis client hook that fails the next asynq enqueue
// once armed, before Redis runs it, as a connection that breaks would.
type failEnqueue struct{ armed atomic.Bool }

var _ redis.Hook = (*failEnqueue)(nil)

func (f *failEnqueue) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failEnqueue) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (f *failEnqueue) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n != "evalsha" && n != "eval") || !enqueuesTask(cmd) || !f.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		err := errors.New("test: connection reset by peer")
		cmd.SetErr(err)
		return err
	}
}

// enqueuesTask reports whether a script's keys include a queue's pending
// list, as asynq's enqueue script's do.
func enqueuesTask(cmd redis.Cmder) bool {
	return slices.ContainsFunc(cmd.Args(), func(a any) bool {
		s, ok := a.(string)
		return ok && strings.HasPrefix(s, "asynq:{") && strings.HasSuffix(s, "}:pending")
	})
}

// A change whose enqueue failed after its event ID was claimed and its
// position taken (as in a failover) is completed by sending it again with
// the same event ID: the worker skips the position left behind and applies
// the change once, in its place among the changes accepted after it. The
// same for an exchange, whose replacement's first position is taken too.
// It runs on a Cluster, where the claim and the position (in the event's
// and the order's slots) and the enqueue (in the queue's) are separate
// steps; on one Redis they are one script, which cannot be half done.
func TestRetryCompletesHalfAcceptedChange(t *testing.T) {
	db := redistest.NewCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	seed(t, ctx, store, []string{"SO1", "SO2"})
	w := startFaultWorker(t, ctx, db.URL(), db.Prefix)
	defer w.shutdown(t)
	defer cleanQueues(t, db.Client)

	prdb := db.NewClient(t)
	hook := &failEnqueue{}
	prdb.AddHook(hook)
	p, err := producer.New(prdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	defer p.Close()
	modify := func(no, ev, addr string) (producer.Result, error) {
		return p.EnqueueModify(ctx, no, tasks.Changes{Address: &addr}, producer.WithEventID(ev))
	}

	hook.armed.Store(true)
	_, err = modify("SO1", "m1", "first")
	require.ErrorIs(t, err, producer.ErrUnavailable)
	r1, err := modify("SO1", "m1", "first")
	require.NoError(t, err)
	r2, err := modify("SO1", "m2", "second")
	require.NoError(t, err)

	hook.armed.Store(true)
	items := []tasks.Item{{SKU: "B", Qty: 2}}
	_, err = p.EnqueueExchange(ctx, "SO2", items, producer.WithEventID("x1"), producer.WithNewOrderNo("SO3"))
	require.ErrorIs(t, err, producer.ErrUnavailable)
	_, err = p.EnqueueExchange(ctx, "SO2", items, producer.WithEventID("x1"), producer.WithNewOrderNo("SO3"))
	require.NoError(t, err)
	r3, err := modify("SO3", "m3", "of the replacement")
	require.NoError(t, err)

	require.True(t, poll(ctx, 30*time.Second, func() bool {
		o, err := store.Get(ctx, "SO3")
		idle, _ := queuesIdle(asynq.NewInspectorFromRedisClient(db.Client), nil)
		return err == nil && o.Address == "of the replacement" && idle
	}), "the changes are not applied; worker log:\n%s", w.logs.String())
	history := func(no string) []string {
		all, err := orders.AllHistory(ctx, store, no)
		require.NoError(t, err)
		var out []string
		for _, e := range all[1:] { // after the put
			out = append(out, fmt.Sprintf("%s %s %d", e.Type, e.EventID, e.Seq))
		}
		return out
	}
	require.Equal(t, []string{
		fmt.Sprintf("order:modify m1 %d", r1.Seq),
		fmt.Sprintf("order:modify m2 %d", r2.Seq),
	}, history("SO1"))
	require.Len(t, history("SO2"), 1)
	require.True(t, strings.HasPrefix(history("SO2")[0], "order:exchange x1 "), history("SO2"))
	require.Len(t, history("SO3"), 1)
	require.Equal(t, fmt.Sprintf("order:modify m3 %d", r3.Seq), history("SO3")[0])
}
