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

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The blocked-orders list answers, without an order number: which orders
// are stuck, why, and since when. An order is blocked when the change at
// the head of its sequence has waited longer than Config.BlockedAfter (or
// an operator holds it).
//
// It is the engine's blocked-keys read (keyorder.Runner.Blocked), in the
// order domain's words. The engine finds the keys without scanning: it
// reads at most Config.BlockedScan tasks of the retry set, the scheduled
// set and the expired leases of every queue of the deployment
// (tasks.Shards AllQueues), and as many held orders; it maps each task to
// its order by its payload's order_no (and an exchange also to the order
// it creates), and reads only those orders: each one's sequence, one
// position deep, and its head's task. Its cost grows with the tasks that
// wait in those sets, not with the orders; past the bound the page says
// Truncated. A member of those sets that names no task (a ghost, which
// the intake's Redis user may ZADD) is passed over without counting
// towards the bound, up to ten times it, and counted in Ghosts. An order whose head waits for a task that will not come,
// with nothing behind it yet, holds no change back and is not listed
// until one comes.
//
// What it adds to the engine's read: the creation of a replacement, whose
// head waits for an exchange of another order (the chain of creations), a
// sentence that says what holds each order up and what ends it, the
// reasons' counts, and paging.

// The reasons of a [BlockedOrder]. Their set is closed and small: the
// dashboard's gauge orderworker_orders_blocked has one series per reason.
const (
	// ReasonFailing is a head whose task failed and backs off in asynq's
	// retry set: see BlockedOrder.Failing.
	ReasonFailing = "failing"
	// ReasonHalted is an order whose head failed past its budget under
	// the halt failure policy (its kind's): the change stays the head,
	// archived, and nothing behind it is applied until an operator
	// retries it in its place or skips it. See BlockedOrder.Halted.
	ReasonHalted = "halted"
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
	// asynq does not list). It is listed, with
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
	return []string{ReasonFailing, ReasonHalted, ReasonGap, ReasonLockStale, ReasonCreation, ReasonScheduled, ReasonHeld, ReasonWaiting, ReasonUnreadable}
}

// The bounds of a [BlockedQuery].
const (
	// DefaultBlockedLimit is the page size of a BlockedQuery without one.
	DefaultBlockedLimit = 50
	// MaxBlockedLimit is the largest page size.
	MaxBlockedLimit = 1000
	// maxCreationHops bounds how far Blocked follows a chain of creations.
	maxCreationHops = 8
	// blockedReaders bounds the orders Blocked explains at once.
	blockedReaders = 16
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
	// Ghosts counts the members of the retry and scheduled sets that named
	// no task (no task hash, or one without a message), left out: the
	// read goes on past them (see keyorder.BlockedKeys.Ghosts).
	Ghosts int `json:"ghosts,omitempty"`
}

// BlockedOrder is an order of the blocked-orders list: why its next change
// is not applied, and since when. Exactly one of the detail fields
// (Failing, Halted, Gap, Lock, Creation, Scheduled, Hold) is set, by Reason, but
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
	Halted    *Halted    `json:"halted,omitempty"`
}

// Halted is an order halted by its head's failure past its budget.
type Halted struct {
	// TaskID and Queue name the head's task, archived.
	TaskID string `json:"task_id"`
	Queue  string `json:"queue"`
	// LastError is the failure that halted the order; At when.
	LastError string    `json:"last_error"`
	At        time.Time `json:"at"`
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
	found, err := r.run.Blocked(ctx, keyorder.BlockedQuery{Queues: r.cfg.Shards.AllQueues(r.cfg.Kinds),
		Scan: int64(r.cfg.BlockedScan), After: r.cfg.BlockedAfter, Now: now, Linked: r.creates})
	if err != nil {
		return BlockedPage{}, fmt.Errorf("orderview: blocked orders: %w", err)
	}
	// A creation follows its chain with a read per hop: the orders are
	// explained blockedReaders at a time, as the engine reads them.
	all := make([]BlockedOrder, len(found.Keys))
	sem := make(chan struct{}, blockedReaders)
	var wg sync.WaitGroup
	for i, k := range found.Keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b, err := r.blockedOrder(ctx, now, k)
			if err != nil {
				b = unreadable(now, k.Head.Key, err)
			}
			all[i] = b
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return BlockedPage{}, fmt.Errorf("orderview: blocked orders: %w", err)
	}
	slices.SortFunc(all, func(a, b BlockedOrder) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.OrderNo, b.OrderNo))
	})
	page := BlockedPage{At: now, BlockedAfterMS: r.cfg.BlockedAfter.Milliseconds(), Orders: []BlockedOrder{},
		Counts: map[string]int{}, Candidates: found.Candidates, Truncated: found.Truncated, Ghosts: found.Ghosts}
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

// creates returns the order a task of a configured kind creates (an
// exchange's replacement), whose head waits for it: the engine's
// BlockedQuery.Linked.
func (r *Reader) creates(t *asynq.Task) []string {
	k := r.cfg.Kinds.Of(t.Type())
	if k == nil {
		return nil
	}
	p, err := k.Decode(t.Payload())
	if err != nil {
		return nil
	}
	if c, ok := p.(tasks.Creator); ok && c.Creates() != "" {
		return []string{c.Creates()}
	}
	return nil
}

// unreadable is order no, listed as ReasonUnreadable for err, the error
// that reading it met.
func unreadable(now time.Time, no string, err error) BlockedOrder {
	return BlockedOrder{OrderNo: no, Reason: ReasonUnreadable, Since: now,
		Explanation: "It cannot be read: " + strings.TrimSuffix(err.Error(), ".") + ". Look at it with producer order status, and at its keys in Redis."}
}

// blockedOrder says, in the order domain's words, why k, a key the engine
// found blocked, is: an order whose head is the creation of a replacement
// waits for its exchange (following the chain of creations); the others
// are the engine's reasons, explained.
func (r *Reader) blockedOrder(ctx context.Context, now time.Time, k keyorder.Blocked) (BlockedOrder, error) {
	h := k.Head
	if k.Reason == keyorder.BlockedUnreadable {
		return unreadable(now, h.Key, k.Err), nil
	}
	b := BlockedOrder{OrderNo: h.Key, Waiting: h.Waiting, Since: k.Since.UTC(), AgeMS: max(now.Sub(k.Since), 0).Milliseconds()}
	if h.Pos > 0 {
		b.Head = &Position{Seq: h.Pos, Next: true, State: PositionReserved, Label: h.Label, TaskID: h.TaskID,
			Queue: h.Queue, TaskState: h.State, ReservedAt: h.Since, RetryAt: h.RetryAt}
	}
	switch k.Reason {
	case keyorder.BlockedHeld:
		r.held(&b, h.Held)
		return b, nil
	case keyorder.BlockedHalted:
		ht := &Halted{TaskID: h.TaskID, Queue: h.Queue, LastError: h.Held.Reason, At: h.Held.At.UTC()}
		b.Reason, b.Halted = ReasonHalted, ht
		b.Explanation = fmt.Sprintf("Halted since %s: its next change, task %s, failed past its retries (%s) and its kind halts: nothing behind it is applied (%s wait) until an operator retries it in its place or skips it.",
			ht.At.Format(time.RFC3339), cmp.Or(ht.TaskID, h.Label), ht.LastError, Count(b.Waiting))
		return b, nil
	}
	if _, id, from, ok := r.cfg.Kinds.ParseLabel(h.Label); ok && from != "" {
		return b, r.creation(ctx, &b, id, from)
	}
	switch k.Reason {
	case keyorder.BlockedGap:
		b.Reason, b.Gap = ReasonGap, r.gapOf(now, *b.Head, k.Fate)
		b.Explanation = r.gapExplanation(b.Gap)
	case keyorder.BlockedFailing:
		f := &Failing{TaskID: h.TaskID, Queue: h.Queue, LastError: h.LastErr, LastFailedAt: utc(h.LastFailedAt),
			Retried: h.Retried, MaxRetry: tasks.FailureBudget(h.MaxRetry), NextRunAt: utc(h.NextRunAt)}
		b.Reason, b.Failing = ReasonFailing, f
		b.Explanation = fmt.Sprintf("Its next change, task %s, failed %d time(s) of the %d allowed (%s); it runs again at %s. Past its budget it is archived and the order goes on; or retry it now, or skip it.",
			h.TaskID, f.Retried, f.MaxRetry+1, f.LastError, f.NextRunAt.Format(time.RFC3339))
	case keyorder.BlockedScheduled:
		b.Reason, b.Scheduled = ReasonScheduled, &Scheduled{TaskID: h.TaskID, Queue: h.Queue, RunAt: utc(h.NextRunAt)}
		b.Explanation = fmt.Sprintf("Its next change, task %s, is scheduled to run at %s; the changes behind it wait until then.",
			h.TaskID, b.Scheduled.RunAt.Format(time.RFC3339))
	case keyorder.BlockedStale:
		s := k.Stale
		b.Reason, b.Lock = ReasonLockStale, &StaleLock{Holder: s.Holder, LockLeaseMS: s.HolderTTL.Milliseconds(),
			TaskID: s.TaskID, Queue: s.Queue, TaskState: s.State, LeaseEndedAt: utc(s.LeaseEnded)}
		b.Explanation = staleExplanation(b.Lock)
	case keyorder.BlockedWaiting:
		b.Reason = ReasonWaiting
		switch h.State {
		case asynq.TaskStateActive.String():
			b.Explanation = fmt.Sprintf("Its next change, task %s, is running (on a live worker) and has not finished.", h.TaskID)
		case asynq.TaskStatePending.String():
			b.Explanation = fmt.Sprintf("Its next change, task %s, is pending in queue %s: the workers do not keep up with the queue, or it is paused.", h.TaskID, h.Queue)
		default:
			b.Explanation = fmt.Sprintf("Its next change, task %s, is %s in queue %s and comes back to run by itself.", h.TaskID, h.State, h.Queue)
		}
	default:
		return b, fmt.Errorf("orderview: the engine's reason %q is none of the list's", k.Reason)
	}
	return b, nil
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
	// The engine found the exchange where the creation's label says
	// (b.Head: a creation label reads back only against a table with a
	// creator).
	c := &Creation{Exchange: id, From: from, Chain: []string{b.OrderNo}, ExchangeState: b.Head.TaskState}
	b.Reason, b.Creation = ReasonCreation, c
	creator := r.cfg.Kinds.Creator()
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

// held fills b as held by p, the pause of its sequence.
func (r *Reader) held(b *BlockedOrder, p *keyorder.Pause) {
	h := &Hold{By: p.By, Reason: p.Reason, At: p.At.UTC()}
	b.Reason, b.Hold = ReasonHeld, h
	b.Explanation = fmt.Sprintf("Held by %s since %s (%s): its changes are accepted but not applied until it is resumed; %s wait.",
		cmp.Or(h.By, "an operator"), h.At.Format(time.RFC3339), cmp.Or(h.Reason, "no reason given"), Count(b.Waiting))
}
