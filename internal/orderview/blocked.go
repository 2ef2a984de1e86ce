package orderview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/internal/asynqwire"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The blocked-orders list answers, without an order number: which orders
// are stuck, why, and since when. An order is blocked when the change at
// the head of its sequence has waited longer than Config.BlockedAfter (or
// an operator holds it).
//
// # How it finds them without scanning
//
// It reads only what asynq already keeps about the tasks that are not
// moving, never the keyspace and never the orders that are fine:
//
//   - the retry set of every queue of the deployment (tasks.Shards
//     AllQueues): a task that waits behind a head that is not done is
//     parked there by its worker (an error that is no failure, which asynq
//     v0.25.1 puts in the retry set with the worker's delay and without
//     counting it), and a head that failed backs off there;
//   - the scheduled set of every queue: a head that runs only later;
//   - the expired leases of every queue: a task active on a worker that is
//     gone;
//   - the orders an operator holds (the index of holds, keyorder.Sequencer.PausedKeys).
//
// Each task is mapped to its order by its payload's order_no (and an
// exchange also to the order it creates); the orders are deduplicated, and
// only they are read: each one's sequence, one position deep, and its
// head's task, to say why. Its cost grows with the tasks that wait in those
// sets, at most Config.BlockedScan per set and queue, not with the orders;
// past the bound the page says Truncated.
//
// An order is listed only once something of it sits in one of those sets:
// an order whose head waits for a task that will not come, with nothing
// behind it yet, holds no change back and is not listed until one comes.

// The reasons of a [BlockedOrder]. Their set is closed and small: the
// dashboard's gauge orderworker_orders_blocked has one series per reason.
const (
	// ReasonFailing is a head whose task failed and backs off in asynq's
	// retry set: see BlockedOrder.Failing.
	ReasonFailing = "failing"
	// ReasonGap is a head whose task will not come (deleted, never
	// enqueued, archived or completed without its turn): the workers skip
	// it when the gap wait ends. See BlockedOrder.Gap.
	ReasonGap = "gap"
	// ReasonLockStale is an order whose lock, or head's task, is held by a
	// worker that is gone: the head's task is active in asynq with its
	// lease expired, or the lock's holder is no longer running. See
	// BlockedOrder.Lock.
	ReasonLockStale = "lock_stale"
	// ReasonCreation is an order (a replacement) that waits for its
	// creation by an exchange of another order: see BlockedOrder.Creation.
	ReasonCreation = "creation"
	// ReasonScheduled is a head whose task is scheduled to run later: see
	// BlockedOrder.Scheduled.
	ReasonScheduled = "scheduled"
	// ReasonHeld is an order an operator holds: its changes are accepted
	// but not applied until it is resumed. See BlockedOrder.Hold.
	ReasonHeld = "held"
	// ReasonUnreadable is an order among the candidates that cannot be
	// read: its sequence is malformed (keyorder.ErrMalformed: written by hand,
	// say), one of its keys has the wrong Redis type (WRONGTYPE), or any
	// other read of it failed (a task asynq cannot read, a task of a queue
	// asynq does not list: asynqwire.ErrQueueUnlisted). It is listed, with
	// the error in its explanation, rather than failing the whole list and
	// hiding every other blocked order. Its age is 0.
	ReasonUnreadable = "unreadable"
	// ReasonWaiting is a head whose task exists and will run, but has not
	// for longer than BlockedAfter: pending in a queue the workers do not
	// keep up with (or a paused one), parked, or running for that long.
	// BlockedOrder.Explanation says which.
	ReasonWaiting = "waiting"
)

// Reasons returns every reason of a [BlockedOrder], in the order the list
// documents them.
func Reasons() []string {
	return []string{ReasonFailing, ReasonGap, ReasonLockStale, ReasonCreation, ReasonScheduled, ReasonHeld, ReasonWaiting, ReasonUnreadable}
}

// The bounds of a [BlockedQuery].
const (
	// DefaultBlockedLimit is the page size of a BlockedQuery without one.
	DefaultBlockedLimit = 50
	// MaxBlockedLimit is the largest page size.
	MaxBlockedLimit = 1000
	// maxCreationHops bounds how far Blocked follows a chain of creations.
	maxCreationHops = 8
	// blockedWorkers bounds the orders Blocked reads at once.
	blockedWorkers = 16
)

// ErrBadQuery is returned by Blocked for a limit out of range or a reason
// that is none of [Reasons]; ErrBadCursor for a cursor it did not hand
// out.
var ErrBadQuery = errors.New("orderview: bad blocked-orders query")

// BlockedQuery selects a page of the blocked-orders list.
type BlockedQuery struct {
	// Limit is the page's size, 1 to MaxBlockedLimit. Defaults to
	// DefaultBlockedLimit.
	Limit int
	// Cursor is the NextCursor of the page before; empty for the first.
	Cursor string
	// Reason keeps only the orders blocked for it (one of [Reasons]);
	// empty for all.
	Reason string
}

// BlockedPage is a page of the blocked-orders list, oldest first.
type BlockedPage struct {
	// At is when it was read; ages are relative to it.
	At time.Time `json:"at"`
	// BlockedAfterMS is the setting (BLOCKED_AFTER) it was read with.
	BlockedAfterMS int64 `json:"blocked_after_ms"`
	// Orders are the page's blocked orders, by Since then OrderNo. Never
	// nil.
	Orders []BlockedOrder `json:"orders"`
	// NextCursor reads the next page; empty on the last.
	NextCursor string `json:"next_cursor,omitempty"`
	// Total counts the blocked orders of the reason asked (all reasons
	// when none), over every page.
	Total int `json:"total"`
	// Counts counts the blocked orders by reason, whatever the query's
	// reason; every reason is present. OldestAgeMS is the age of the
	// oldest blocked order, 0 when none.
	Counts      map[string]int `json:"counts"`
	OldestAgeMS int64          `json:"oldest_age_ms"`
	// Candidates is how many orders were looked at: those with a task in
	// the sets read, and those held.
	Candidates int `json:"candidates"`
	// Truncated says a set held more than Config.BlockedScan tasks, of
	// which only the first were read: there may be blocked orders that the
	// list does not show.
	Truncated bool `json:"truncated,omitempty"`
}

// BlockedOrder is an order of the blocked-orders list: why its next change
// is not applied, and since when. Exactly one of the detail fields
// (Failing, Gap, Lock, Creation, Scheduled, Hold) is set, by Reason, but
// for ReasonWaiting, which has none.
type BlockedOrder struct {
	OrderNo string `json:"order_no"`
	// Reason is one of [Reasons].
	Reason string `json:"reason"`
	// Since is when the head started waiting: when its change was
	// accepted (its position reserved), or, for a hold, when it was held.
	// AgeMS is how long ago.
	Since time.Time `json:"since"`
	AgeMS int64     `json:"age_ms"`
	// Explanation says in a sentence or two what holds the order up and
	// what ends it.
	Explanation string `json:"explanation"`
	// Head is the position whose turn it is, with its task. Nil for a held
	// order with nothing waiting.
	Head *Position `json:"head,omitempty"`
	// Waiting counts the positions after the cursor, the head included:
	// the changes held back.
	Waiting int64 `json:"waiting"`

	Failing   *Failing   `json:"failing,omitempty"`
	Gap       *Gap       `json:"gap,omitempty"`
	Lock      *StaleLock `json:"lock,omitempty"`
	Creation  *Creation  `json:"creation,omitempty"`
	Scheduled *Scheduled `json:"scheduled,omitempty"`
	Hold      *Hold      `json:"hold,omitempty"`
}

// Failing is a head whose task fails and backs off.
type Failing struct {
	TaskID string `json:"task_id"`
	Queue  string `json:"queue"`
	// LastError is the task's last failure, LastFailedAt when.
	LastError    string    `json:"last_error"`
	LastFailedAt time.Time `json:"last_failed_at,omitzero"`
	// Retried is how many times it failed; MaxRetry its failure budget:
	// past it, the task is archived and the order goes on.
	Retried  int `json:"retried"`
	MaxRetry int `json:"max_retry"`
	// NextRunAt is when it runs again.
	NextRunAt time.Time `json:"next_run_at,omitzero"`
}

// StaleLock is an order held up by a worker that is gone.
type StaleLock struct {
	// Holder is the lock's holder ("<task type> <task ID>"), when the lock
	// is still held; LockLeaseMS the lock's lease left (it expires by
	// itself at 0).
	Holder      string `json:"holder,omitempty"`
	LockLeaseMS int64  `json:"lock_lease_ms,omitempty"`
	// TaskID, Queue and TaskState are the stale task's: the head's task
	// active on a dead worker, or the holder's task that no longer runs.
	TaskID    string `json:"task_id"`
	Queue     string `json:"queue"`
	TaskState string `json:"task_state"`
	// LeaseEndedAt is when asynq's lease of the task ended, when it is
	// active; asynq's recoverer (or the workers' RecoverAfter) takes it
	// back after that.
	LeaseEndedAt time.Time `json:"lease_ended_at,omitzero"`
}

// Creation is a replacement order that waits for its creation by an
// exchange of another order.
type Creation struct {
	// Exchange is the event ID (and task ID) of the exchange, of order
	// From, that creates this order; Queue is where that task is.
	Exchange string `json:"exchange"`
	From     string `json:"from"`
	// ExchangeState is the exchange task's asynq state, or TaskMissing.
	ExchangeState string `json:"exchange_state"`
	// FromWaits says the exchange is not at the head of From's sequence:
	// From's own head (FromHead, its label) must go first.
	FromWaits bool   `json:"from_waits"`
	FromHead  string `json:"from_head,omitempty"`
	// Chain is the orders along the creations, this one first: this one
	// waits for an exchange of Chain[1], which itself waits for its
	// creation by an exchange of Chain[2], and so on (at most 8 hops).
	Chain []string `json:"chain"`
	// Cycle says the chain comes back to an order in it: none of them can
	// go on until someone deletes or archives one of the exchanges.
	Cycle bool `json:"cycle,omitempty"`
}

// Scheduled is a head whose task runs only later.
type Scheduled struct {
	TaskID string    `json:"task_id"`
	Queue  string    `json:"queue"`
	RunAt  time.Time `json:"run_at"`
}

// Hold is an operator's hold of an order, as the holds record it.
type Hold struct {
	By     string    `json:"by,omitempty"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// Blocked reads a page of the blocked-orders list: the orders whose head
// has waited longer than Config.BlockedAfter, or that an operator holds,
// oldest first, each with its reason and what it waits for. See the
// comment above [ReasonFailing] for how it finds them: it never scans the
// keyspace, and reads at most Config.BlockedScan tasks of each set of each
// queue. Every page reads the whole bounded set again, so a page is
// consistent in itself; an order that stops or starts being blocked
// between two pages may be missed or shown twice.
//
// An order that cannot be read is listed as [ReasonUnreadable], whatever
// the error, so that one bad key never hides the others. It returns
// ErrBadQuery or ErrBadCursor (wrapped) for a bad query, ctx's error, and
// the Redis errors of the reads that are not one order's (the sets, the
// held orders), wrapped.
func (r *Reader) Blocked(ctx context.Context, q BlockedQuery) (BlockedPage, error) {
	q.Limit = cmp.Or(q.Limit, DefaultBlockedLimit)
	if q.Limit < 1 || q.Limit > MaxBlockedLimit {
		return BlockedPage{}, fmt.Errorf("%w: limit %d, want 1 to %d", ErrBadQuery, q.Limit, MaxBlockedLimit)
	}
	if q.Reason != "" && !slices.Contains(Reasons(), q.Reason) {
		return BlockedPage{}, fmt.Errorf("%w: reason %q, want one of %s", ErrBadQuery, q.Reason, strings.Join(Reasons(), ", "))
	}
	after, err := parseBlockedCursor(q.Cursor)
	if err != nil {
		return BlockedPage{}, err
	}
	now := r.cfg.Now().UTC()
	cands, held, truncated, err := r.candidates(ctx, now)
	if err != nil {
		return BlockedPage{}, err
	}
	all, err := r.classifyAll(ctx, now, cands, held)
	if err != nil {
		return BlockedPage{}, err
	}
	slices.SortFunc(all, func(a, b BlockedOrder) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.OrderNo, b.OrderNo))
	})
	page := BlockedPage{At: now, BlockedAfterMS: r.cfg.BlockedAfter.Milliseconds(), Orders: []BlockedOrder{},
		Counts: map[string]int{}, Candidates: len(cands), Truncated: truncated}
	for _, reason := range Reasons() {
		page.Counts[reason] = 0
	}
	for _, b := range all {
		page.Counts[b.Reason]++
		page.OldestAgeMS = max(page.OldestAgeMS, b.AgeMS)
		if q.Reason != "" && b.Reason != q.Reason {
			continue
		}
		page.Total++
		if after != nil && !after.before(b) {
			continue
		}
		if len(page.Orders) == q.Limit {
			last := page.Orders[len(page.Orders)-1]
			page.NextCursor = strconv.FormatInt(last.Since.UnixMilli(), 10) + "." + last.OrderNo
			continue
		}
		page.Orders = append(page.Orders, b)
	}
	return page, nil
}

// blockedCursor is a position in the list: after the order no that has
// waited since ms.
type blockedCursor struct {
	ms int64
	no string
}

// before reports whether c comes before b in the list's order.
func (c *blockedCursor) before(b BlockedOrder) bool {
	ms := b.Since.UnixMilli()
	return ms > c.ms || (ms == c.ms && b.OrderNo > c.no)
}

func parseBlockedCursor(s string) (*blockedCursor, error) {
	if s == "" {
		return nil, nil
	}
	msText, no, ok := strings.Cut(s, ".")
	ms, err := strconv.ParseInt(msText, 10, 64)
	if !ok || err != nil || !tasks.ValidOrderNo(no) {
		return nil, fmt.Errorf("%w: %q", ErrBadCursor, s)
	}
	return &blockedCursor{ms: ms, no: no}, nil
}

// candidates returns the orders that may be blocked, each once, in the
// order found: those of the tasks in the retry and scheduled sets and the
// expired leases of every queue, and the held ones (with their hold's
// time, Unix ms). truncated says a set had more than BlockedScan.
func (r *Reader) candidates(ctx context.Context, now time.Time) (out []string, held map[string]int64, truncated bool, err error) {
	queues := r.cfg.Shards.AllQueues(r.cfg.Kinds)
	limit := int64(r.cfg.BlockedScan)
	seen := map[string]bool{}
	add := func(no string) {
		if tasks.ValidOrderNo(no) && !seen[no] {
			seen[no] = true
			out = append(out, no)
		}
	}
	for _, set := range []string{asynqwire.SetRetry, asynqwire.SetScheduled, "lease"} {
		var found []asynqwire.SetTask
		var more bool
		if set == "lease" {
			found, more, err = asynqwire.ExpiredLeases(ctx, r.rdb, queues, now, limit)
		} else {
			found, more, err = asynqwire.SetTasks(ctx, r.rdb, set, queues, limit)
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("orderview: blocked orders: %w", err)
		}
		truncated = truncated || more
		for _, t := range found {
			k := r.cfg.Kinds.Of(t.Type)
			if k == nil || t.Payload == nil {
				continue // not a configured kind, or gone meanwhile
			}
			p, err := k.Decode(t.Payload)
			if err != nil {
				continue
			}
			add(p.Header().OrderNo)
			if c, ok := p.(tasks.Creator); ok {
				add(c.Creates()) // a replacement that waits for this exchange
			}
		}
	}
	zs, err := r.seq.PausedKeys(ctx, 0, limit+1)
	if err != nil {
		return nil, nil, false, fmt.Errorf("orderview: held orders: %w", err)
	}
	if int64(len(zs)) > limit {
		truncated, zs = true, zs[:limit]
	}
	held = make(map[string]int64, len(zs))
	for _, z := range zs {
		held[z.Key] = z.Since.UnixMilli()
		add(z.Key)
	}
	return out, held, truncated, nil
}

// classifyAll classifies the candidates, blockedWorkers at a time, and
// returns the blocked ones. An order that cannot be read is listed as
// unreadable (see [ReasonUnreadable]); only ctx's end fails the whole list.
func (r *Reader) classifyAll(ctx context.Context, now time.Time, cands []string, held map[string]int64) ([]BlockedOrder, error) {
	results := make([]*BlockedOrder, len(cands))
	sem := make(chan struct{}, blockedWorkers)
	var wg sync.WaitGroup
	for i, no := range cands {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			heldMS, isHeld := held[no]
			b, err := r.classify(ctx, now, no, isHeld, heldMS)
			if err != nil && ctx.Err() == nil {
				// One order that cannot be read (a sequence written by
				// hand, a key of the wrong type, a task asynq cannot
				// read) must not hide every other blocked order: it is
				// listed as unreadable, with the error.
				b = unreadable(now, no, err)
			}
			results[i] = b
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("orderview: blocked orders: %w", err)
	}
	var out []BlockedOrder
	for _, b := range results {
		if b != nil {
			out = append(out, *b)
		}
	}
	return out, nil
}

// unreadable is order no, listed as ReasonUnreadable for err, the error
// that reading it met.
func unreadable(now time.Time, no string, err error) *BlockedOrder {
	return &BlockedOrder{OrderNo: no, Reason: ReasonUnreadable, Since: now,
		Explanation: "It cannot be read: " + strings.TrimSuffix(err.Error(), ".") + ". Look at it with producer order status, and at its keys in Redis."}
}

// classify reads order no's sequence one position deep and its head's
// task, and returns the order as blocked, or nil when it is not.
func (r *Reader) classify(ctx context.Context, now time.Time, no string, isHeld bool, heldMS int64) (*BlockedOrder, error) {
	st, err := r.head.Status(ctx, no)
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	b := &BlockedOrder{OrderNo: no, Waiting: st.Waiting}
	var head *keyorder.Pending
	if st.Exists && len(st.Pending) > 0 && st.Pending[0].Pos == st.Done+1 && !st.Pending[0].Reserved.IsZero() {
		head = &st.Pending[0]
		pos := position(*head, st.Done)
		b.Head, b.Since = &pos, head.Reserved
	}
	if isHeld || st.Paused != nil {
		return r.held(now, b, st, heldMS)
	}
	if head == nil || now.Sub(head.Reserved) < r.cfg.BlockedAfter {
		// Nothing waits, the cursor is about to pass a settled head, or the
		// head has not waited long enough.
		return nil, nil
	}
	b.AgeMS = now.Sub(b.Since).Milliseconds()
	typ, id, from, ok := r.cfg.Kinds.ParseLabel(head.Label)
	if !ok {
		b.Reason, b.Gap = ReasonGap, r.gap(now, *b.Head, nil)
		b.Explanation = r.gapExplanation(b.Gap)
		return b, nil
	}
	if from != "" {
		return b, r.creation(ctx, b, id, from)
	}
	b.Head.TaskID = id
	rf := ref{queues: r.cfg.Shards.Placements(r.cfg.Kinds.Of(typ), no), id: id, typ: typ, source: SourcePosition}
	b.Head.Queue = rf.queues[0]
	info, err := r.lookupOne(ctx, rf)
	if err != nil {
		return nil, err
	}
	b.Head.TaskState = TaskMissing
	if info != nil {
		b.Head.TaskState, b.Head.Queue = info.State.String(), info.Queue
	}
	if g := r.gap(now, *b.Head, info); g != nil {
		b.Reason, b.Gap, b.Explanation = ReasonGap, g, r.gapExplanation(g)
		return b, nil
	}
	switch {
	case info.State == asynq.TaskStateRetry && info.Retried > 0:
		f := &Failing{TaskID: id, Queue: info.Queue, LastError: info.LastErr, LastFailedAt: utc(info.LastFailedAt),
			Retried: info.Retried, MaxRetry: tasks.FailureBudget(info.MaxRetry), NextRunAt: utc(info.NextProcessAt)}
		b.Reason, b.Failing = ReasonFailing, f
		b.Explanation = fmt.Sprintf("Its next change, task %s, failed %d time(s) of the %d allowed (%s); it runs again at %s. Past its budget it is archived and the order goes on; or retry it now, or skip it.",
			id, f.Retried, f.MaxRetry+1, f.LastError, f.NextRunAt.Format(time.RFC3339))
		return b, nil
	case info.State == asynq.TaskStateScheduled:
		b.Reason, b.Scheduled = ReasonScheduled, &Scheduled{TaskID: id, Queue: info.Queue, RunAt: utc(info.NextProcessAt)}
		b.Explanation = fmt.Sprintf("Its next change, task %s, is scheduled to run at %s; the changes behind it wait until then.",
			id, b.Scheduled.RunAt.Format(time.RFC3339))
		return b, nil
	}
	stale, err := r.staleLock(ctx, now, no, typ, info)
	if err != nil || stale != nil {
		if stale != nil {
			b.Reason, b.Lock = ReasonLockStale, stale
			b.Explanation = staleExplanation(stale)
		}
		return b, err
	}
	b.Reason = ReasonWaiting
	switch info.State {
	case asynq.TaskStateActive:
		b.Explanation = fmt.Sprintf("Its next change, task %s, is running (on a live worker) and has not finished.", id)
	case asynq.TaskStatePending:
		b.Explanation = fmt.Sprintf("Its next change, task %s, is pending in queue %s: the workers do not keep up with the queue, or it is paused.", id, info.Queue)
	default:
		b.Explanation = fmt.Sprintf("Its next change, task %s, is %s in queue %s and comes back to run by itself.", id, info.State, info.Queue)
	}
	return b, nil
}

// staleLock says whether order no is held up by a worker that is gone:
// the head's task (of type typ, info) active with its asynq lease ended,
// or the lock held by a task that is no longer running.
func (r *Reader) staleLock(ctx context.Context, now time.Time, no, typ string, info *asynq.TaskInfo) (*StaleLock, error) {
	holder, err := r.seq.Holder(ctx, no)
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	sl := &StaleLock{TaskID: info.ID, Queue: info.Queue, TaskState: info.State.String()}
	if holder.Held {
		sl.Holder, sl.LockLeaseMS = holder.Meta, holder.TTL.Milliseconds()
	}
	if info.State == asynq.TaskStateActive {
		end, ok, err := asynqwire.LeaseEnd(ctx, r.rdb, info.Queue, info.ID)
		if err != nil {
			return nil, fmt.Errorf("orderview: %w", err)
		}
		if ok && end.Before(now) {
			sl.LeaseEndedAt = end
			return sl, nil
		}
	}
	if !holder.Held || holder.Meta == typ+" "+info.ID {
		return nil, nil
	}
	htyp, hid, _, ok := r.cfg.Kinds.ParseLabel(holder.Meta)
	if !ok {
		return nil, nil
	}
	hr := ref{queues: r.cfg.Shards.Placements(r.cfg.Kinds.Of(htyp), no), id: hid, typ: htyp, source: SourceLock}
	hinfo, err := r.lookupOne(ctx, hr)
	if err != nil {
		return nil, err
	}
	sl.TaskID, sl.Queue, sl.TaskState = hid, hr.queues[0], TaskMissing
	if hinfo == nil {
		return sl, nil
	}
	sl.Queue, sl.TaskState = hinfo.Queue, hinfo.State.String()
	if hinfo.State != asynq.TaskStateActive {
		return sl, nil
	}
	end, ok, err := asynqwire.LeaseEnd(ctx, r.rdb, hinfo.Queue, hid)
	if err != nil {
		return nil, fmt.Errorf("orderview: %w", err)
	}
	if ok && end.Before(now) {
		sl.LeaseEndedAt = end
		return sl, nil
	}
	return nil, nil // the holder runs
}

func staleExplanation(sl *StaleLock) string {
	var s string
	if !sl.LeaseEndedAt.IsZero() {
		s = fmt.Sprintf("Task %s is active in %s on a worker that is gone: asynq's lease of it ended at %s. asynq's recoverer (or the workers' RecoverAfter) brings it back; if no worker serves %s, start one.",
			sl.TaskID, sl.Queue, sl.LeaseEndedAt.Format(time.RFC3339), sl.Queue)
	} else {
		s = fmt.Sprintf("The order's lock is held by task %s, which is no longer running (%s).", sl.TaskID, sl.TaskState)
	}
	if sl.Holder != "" {
		s += fmt.Sprintf(" The lock (held by %s) expires by itself in %v.", sl.Holder, (time.Duration(sl.LockLeaseMS) * time.Millisecond).Round(time.Second))
	}
	return s
}

func (r *Reader) gapExplanation(g *Gap) string {
	left := time.Duration(g.LeftMS) * time.Millisecond
	when := fmt.Sprintf("in %v, when the gap wait (%v) ends", left.Round(time.Second), r.cfg.GapWait)
	if left == 0 {
		when = fmt.Sprintf("now that the gap wait (%v) is over, as soon as a task behind it runs", r.cfg.GapWait)
	}
	return fmt.Sprintf("Position %d (%s) waits for a task that will not come: %s. It is skipped %s.", g.Seq, g.Label, g.Reason, when)
}

// creation fills b, whose head is the creation of b's order by exchange
// id of order from, following the chain of creations.
func (r *Reader) creation(ctx context.Context, b *BlockedOrder, id, from string) error {
	c := &Creation{Exchange: id, From: from, Chain: []string{b.OrderNo}}
	b.Reason, b.Creation = ReasonCreation, c
	// A creation label reads back only against a table with a creator.
	creator := r.cfg.Kinds.Creator()
	xr := ref{queues: r.cfg.Shards.Placements(creator, from), id: id, typ: creator.Type, source: SourcePosition}
	info, err := r.lookupOne(ctx, xr)
	if err != nil {
		return err
	}
	c.ExchangeState = TaskMissing
	b.Head.TaskID, b.Head.Queue, b.Head.TaskState = id, xr.queues[0], TaskMissing
	if info != nil {
		c.ExchangeState = info.State.String()
		b.Head.Queue, b.Head.TaskState = info.Queue, c.ExchangeState
	}
	seen := map[string]bool{b.OrderNo: true}
	var hops []string
	exchange, of := id, from
	for hop := 0; hop < maxCreationHops; hop++ {
		c.Chain = append(c.Chain, of)
		if seen[of] {
			c.Cycle = true
			break
		}
		seen[of] = true
		st, err := r.head.Status(ctx, of)
		if err != nil {
			return fmt.Errorf("orderview: %w", err)
		}
		if !st.Exists || len(st.Pending) == 0 || st.Pending[0].Pos != st.Done+1 {
			hops = append(hops, fmt.Sprintf("%s has no change waiting", of))
			break
		}
		label := st.Pending[0].Label
		if label == tasks.PositionLabel(creator.Type, exchange) {
			hops = append(hops, fmt.Sprintf("exchange %s is at the head of %s", exchange, of))
			break
		}
		if hop == 0 {
			c.FromWaits, c.FromHead = true, label
		}
		_, next, nextFrom, ok := r.cfg.Kinds.ParseLabel(label)
		if !ok || nextFrom == "" {
			hops = append(hops, fmt.Sprintf("%s waits for its position %d (%s)", of, st.Pending[0].Pos, label))
			break
		}
		hops = append(hops, fmt.Sprintf("%s waits for its own creation by exchange %s of %s", of, next, nextFrom))
		exchange, of = next, nextFrom
	}
	s := fmt.Sprintf("%s waits for its creation by exchange %s of %s (task %s); %s.",
		b.OrderNo, id, from, c.ExchangeState, strings.Join(hops, "; "))
	if c.Cycle {
		s += fmt.Sprintf(" The chain %s is a cycle: none of them can go on until one of its exchanges is deleted or skipped.", strings.Join(c.Chain, " → "))
	} else if len(c.Chain) > 2 {
		s += fmt.Sprintf(" Chain: %s.", strings.Join(c.Chain, " → "))
	}
	b.Explanation = s
	return nil
}

// held fills b as held, from the pause of its sequence (st.Paused, see
// keyorder.Pause), or, when the index lists it but the sequence has no pause
// (the index is best effort), from the index's time (heldMS, Unix ms).
func (r *Reader) held(now time.Time, b *BlockedOrder, st keyorder.Status, heldMS int64) (*BlockedOrder, error) {
	h := &Hold{At: time.UnixMilli(heldMS).UTC()}
	if p := st.Paused; p != nil {
		h.By, h.Reason, h.At = p.By, p.Reason, p.At
	}
	b.Reason, b.Hold, b.Since = ReasonHeld, h, h.At
	b.AgeMS = max(now.Sub(b.Since), 0).Milliseconds()
	b.Explanation = fmt.Sprintf("Held by %s since %s (%s): its changes are accepted but not applied until it is resumed; %s wait.",
		cmp.Or(h.By, "an operator"), h.At.Format(time.RFC3339), cmp.Or(h.Reason, "no reason given"), Count(b.Waiting))
	return b, nil
}
