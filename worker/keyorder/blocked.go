package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// The blocked-keys read ([Runner.Blocked]) answers, without a key: which
// keys' heads do not move, why, and since when.
//
// # How it finds them without scanning
//
// It reads only what asynq already keeps about the tasks that are not
// moving, never the keyspace and never the keys that are fine:
//
//   - the retry set of each queue of [BlockedQuery].Queues: a task that
//     waits behind a head that is not done is parked there (an error that
//     is no failure, which asynq v0.25.1 puts in the retry set with the
//     Runner's delay and without counting it), and a head that failed
//     backs off there;
//   - the scheduled set of each queue: a head that runs only later;
//   - the expired leases of each queue: a task active on a worker that is
//     gone;
//   - the keys on hold (the index of holds, Sequencer.pausedKeys).
//
// Each task is mapped to its key (RunnerConfig.Key), and to the keys it
// linked ([BlockedQuery].Linked); the keys are deduplicated, and only they
// are read: each one's sequence, one position deep, its head's task, and,
// when that task runs, the key's lock. Its cost grows with the tasks that
// wait in those sets, at most BlockedQuery.Scan per set and queue, not with
// the keys; past the bound the result says Truncated. A member of a
// retry or scheduled set that names no task (its task hash has no
// message) is passed over without counting towards Scan, and counted in
// BlockedKeys.Ghosts, so that such members cannot push a blocked key out
// of the read.
//
// A key is found only once something of it sits in one of those sets: a
// key whose head waits for a task that will not come, with nothing behind
// it yet, holds nothing back and is not listed until something comes.

// The reasons of a [Blocked] key. Their set is closed.
const (
	// BlockedHeld is a key on hold ([Runner.Hold]): its tasks are accepted
	// and none runs until [Runner.Resume].
	BlockedHeld = "held"
	// BlockedHalted is a key halted by its head's failure past its budget
	// ([FailureHalt]): the head's task is archived, no task behind it
	// runs, and Head.Held is the halt (its Reason the task's last error,
	// Halted the head's label), until an operator retries the head in its
	// place ([Runner.Retry]) or skips it ([Runner.Skip]).
	BlockedHalted = "halted"
	// BlockedFailing is a head whose task failed and backs off in asynq's
	// retry set: past its failure budget it is archived and the key goes
	// on, or halts under FailureHalt.
	BlockedFailing = "failing"
	// BlockedGap is a head whose task will not come (never enqueued,
	// deleted, archived, completed without its turn, or holding another
	// position): Blocked.Fate says which. The Runners skip it when their
	// GapWait ends, except an archived task that halts
	// (RunnerConfig.Failure): its key is halted instead.
	BlockedGap = "gap"
	// BlockedStale is a key held up by a worker that is gone: the head's
	// task is active in asynq with its lease ended, or the key's lock is
	// held by a task that no longer runs. Blocked.Stale says which.
	BlockedStale = "stale"
	// BlockedScheduled is a head whose task is scheduled to run later.
	BlockedScheduled = "scheduled"
	// BlockedWaiting is a head whose task exists and will run, but has
	// not for longer than BlockedQuery.After: pending in a queue the
	// workers do not keep up with (or a paused one), parked, or running
	// for that long. Head.State says which.
	BlockedWaiting = "waiting"
	// BlockedUnreadable is a key among the candidates that could not be
	// read: its sequence is malformed (written by hand, say: [ErrMalformed]),
	// one of its keys has the wrong Redis type, or its head's task cannot
	// be read (a task of a queue asynq does not list). It is listed, with
	// Blocked.Err, rather than failing the whole read and hiding every
	// other blocked key.
	BlockedUnreadable = "unreadable"
)

// The defaults of a [BlockedQuery].
const (
	// defaultBlockedScan is the default of BlockedQuery.Scan.
	defaultBlockedScan = 2000
	// DefaultBlockedAfter is the default of BlockedQuery.After.
	DefaultBlockedAfter = time.Minute
	// blockedReaders bounds the keys Blocked reads at once.
	blockedReaders = 16
)

// BlockedQuery says what [Runner.Blocked] reads.
type BlockedQuery struct {
	// Queues are the queues whose retry and scheduled sets and expired
	// leases it reads: every queue the keys' tasks may be in. Required.
	Queues []string
	// Scan bounds the read: at most Scan tasks of each set of each queue,
	// and Scan keys on hold; past it, BlockedKeys.Truncated. Defaults to
	// defaultBlockedScan (2000).
	Scan int64
	// After is how long a head may wait, from when its position was
	// handed out, before its key counts as blocked. A key on hold counts
	// at once. Defaults to DefaultBlockedAfter (1 minute); set it to a
	// nanosecond to see every head that is not moving.
	After time.Duration
	// Now is the time ages are measured against. Defaults to time.Now().
	Now time.Time
	// Linked, when set, returns the other keys a task took a position in
	// besides its own ([AtOnce].Link): their heads may wait for it, so
	// they are read too. A key it returns that is not valid is passed
	// over.
	Linked func(*asynq.Task) []string
}

// BlockedKeys is what [Runner.Blocked] found.
type BlockedKeys struct {
	// At is the time the ages were measured against (BlockedQuery.Now).
	At time.Time
	// Keys are the blocked keys, by Since, then key. Never nil.
	Keys []Blocked
	// Candidates counts the keys read: those of the tasks found in the
	// sets, and those on hold.
	Candidates int
	// Truncated says a set, or the index of holds, held more than
	// BlockedQuery.Scan entries, of which only the first were read: there
	// may be blocked keys that Keys does not show. Members that name no
	// task (ghosts) do not count towards Scan: the read goes on past them,
	// up to asynqwire's bound (ten times Scan members of each set of each
	// queue), and only past that bound are they a cause of Truncated.
	Truncated bool
	// Ghosts counts the members of the retry and scheduled sets read that
	// named no task (their task hash had no message: written by a Redis
	// user that may ZADD there, or a task that ended during the read).
	// They are left out.
	Ghosts int
}

// Blocked is a key whose head has not moved.
type Blocked struct {
	// Head is the key's head and its task, as [Runner.Head] reads it, but
	// without writing anything. Head.Key is always set; Head.Pos is 0 for
	// a key on hold with nothing waiting, and for an unreadable one; a
	// held key's Head.State is "" when its task could not be read.
	// Head.Held is the hold, for BlockedHeld: a key is on hold when its
	// sequence says so, whatever the index of holds lists.
	Head Head
	// Reason is one of blockedReasons.
	Reason string
	// Since is when the key stopped moving: when its head's position was
	// handed out, or for a key on hold when it was held. For an
	// unreadable key it is BlockedKeys.At.
	Since time.Time
	// Fate says, for BlockedGap, why the head's task will not come.
	Fate string
	// staleHold is, for BlockedStale, the task that holds the key up.
	Stale *staleHold
	// Err is, for BlockedUnreadable, the error that reading the key met.
	Err error
}

// staleHold is the task that holds up a [BlockedStale] key.
type staleHold struct {
	// Holder is the meta of the key's lock's holder, and HolderTTL the
	// lock's lease left (it expires by itself at 0): "" and 0 when the
	// lock is free.
	Holder    string
	HolderTTL time.Duration
	// TaskID, Queue and State are the stale task's: the head's task, active
	// on a worker that is gone, or the lock holder's task, which no longer
	// runs (State is [StateMissing] when no queue of the query holds it).
	TaskID, Queue, State string
	// LeaseEnded is when asynq's lease of the task ended, when it is
	// active: asynq's recoverer takes it back after that.
	LeaseEnded time.Time
}

// Blocked reads the keys whose head does not move: held, halted, failing, waiting
// for a task that will not come, held up by a worker that is gone,
// scheduled for later, or waiting for longer than q.After; see the
// comment above [BlockedHeld] for how it finds them without scanning the
// keyspace. It only reads, so a Redis user that may only read the
// sequences and asynq's queues may call it. It reads up to 16 keys at
// once, and is safe for concurrent use.
//
// A key that cannot be read is listed as [BlockedUnreadable], whatever the
// error, so that one bad key never hides the others. It returns an error
// for a query without queues or with a negative bound, ctx's error, and
// the Redis errors of the reads that are not one key's (the sets, the
// index of holds), wrapped.
func (r *Runner) Blocked(ctx context.Context, q BlockedQuery) (BlockedKeys, error) {
	if len(q.Queues) == 0 || q.Scan < 0 || q.After < 0 {
		return BlockedKeys{}, fmt.Errorf("keyorder: blocked keys: want queues and no negative bound, got %d queues, scan %d, after %v",
			len(q.Queues), q.Scan, q.After)
	}
	q.Scan = cmp.Or(q.Scan, defaultBlockedScan)
	q.After = cmp.Or(q.After, DefaultBlockedAfter)
	if q.Now.IsZero() {
		q.Now = time.Now()
	}
	cands, truncated, ghosts, err := r.candidates(ctx, q)
	if err != nil {
		return BlockedKeys{}, fmt.Errorf("keyorder: blocked keys: %w", err)
	}
	results := make([]*Blocked, len(cands))
	sem := make(chan struct{}, blockedReaders)
	var wg sync.WaitGroup
	for i, key := range cands {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			b, err := r.blocked(ctx, q, key)
			if err != nil && ctx.Err() == nil {
				b = &Blocked{Head: Head{Key: key}, Reason: BlockedUnreadable, Since: q.Now, Err: err}
			}
			results[i] = b
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return BlockedKeys{}, fmt.Errorf("keyorder: blocked keys: %w", err)
	}
	out := BlockedKeys{At: q.Now, Keys: []Blocked{}, Candidates: len(cands), Truncated: truncated, Ghosts: ghosts}
	for _, b := range results {
		if b != nil {
			out.Keys = append(out.Keys, *b)
		}
	}
	slices.SortFunc(out.Keys, func(a, b Blocked) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Head.Key, b.Head.Key))
	})
	return out, nil
}

// candidates returns the keys that may be blocked, each once, in the order
// found: those of the tasks in the retry and scheduled sets and the expired
// leases of q's queues, and those the index of holds lists. truncated says
// a set had more than q.Scan; ghosts counts the members of the sets that
// named no task.
func (r *Runner) candidates(ctx context.Context, q BlockedQuery) (out []string, truncated bool, ghosts int, err error) {
	seen := map[string]bool{}
	add := func(key string) {
		if checkKey(key, "") == nil && !seen[key] {
			seen[key] = true
			out = append(out, key)
		}
	}
	for _, set := range []string{asynqwire.SetRetry, asynqwire.SetScheduled, "lease"} {
		var found []asynqwire.SetTask
		var more bool
		if set == "lease" {
			found, more, err = asynqwire.ExpiredLeases(ctx, r.rdb, q.Queues, q.Now, q.Scan)
		} else {
			var n int
			found, more, n, err = asynqwire.SetTasks(ctx, r.rdb, set, q.Queues, q.Scan)
			ghosts += n
		}
		if err != nil {
			return nil, false, 0, err
		}
		truncated = truncated || more
		for _, st := range found {
			if st.Payload == nil {
				continue // gone meanwhile
			}
			t := asynq.NewTask(st.Type, st.Payload)
			if key, err := r.cfg.Key(t); err == nil {
				add(key)
			}
			if q.Linked != nil {
				for _, key := range q.Linked(t) {
					add(key)
				}
			}
		}
	}
	ps, err := r.l.Sequencer().pausedKeys(ctx, 0, q.Scan+1)
	if err != nil {
		return nil, false, 0, err
	}
	if int64(len(ps)) > q.Scan {
		truncated, ps = true, ps[:q.Scan]
	}
	for _, p := range ps {
		add(p.Key)
	}
	return out, truncated, ghosts, nil
}

// blocked reads key, a candidate, and returns it as blocked, or nil when
// it is not.
func (r *Runner) blocked(ctx context.Context, q BlockedQuery, key string) (*Blocked, error) {
	st, err := r.headSeq.Status(ctx, key)
	if err != nil {
		return nil, err
	}
	b := &Blocked{Head: Head{Key: key, Held: st.Paused, Waiting: st.Waiting}}
	hasHead := headOf(st, &b.Head)
	// The sequence says whether the key is on hold; the index of holds is
	// best effort, and may still list a key whose hold ended (see Pause).
	if st.Paused != nil {
		b.Reason, b.Since = BlockedHeld, st.Paused.At
		if st.Paused.Halted != "" {
			b.Reason = BlockedHalted
		}
		if hasHead {
			switch _, err := r.tasks.look(ctx, &b.Head, false); {
			case errors.Is(err, errNoTask):
				b.Head.State = StateMissing
			case err != nil:
				// The hold is what holds the key up: a head's task that
				// cannot be read (one of a queue asynq does not list)
				// stays unread, State "".
				b.Head.State = ""
			}
		}
		return b, nil
	}
	if !hasHead || q.Now.Sub(b.Head.Since) < q.After {
		// Nothing waits, the cursor is about to pass a settled head, or
		// the head has not waited long enough.
		return nil, nil
	}
	b.Since = b.Head.Since
	info, err := r.tasks.look(ctx, &b.Head, false)
	switch {
	case errors.Is(err, errNoTask):
		b.Reason, b.Fate = BlockedGap, namesNoTask(b.Head.Label)
		return b, nil
	case err != nil:
		return nil, err
	}
	if why := r.tasks.fate(key, b.Head.Pos, b.Head.Label, info); why != "" {
		b.Reason, b.Fate = BlockedGap, why
		return b, nil
	}
	switch {
	case info.State == asynq.TaskStateRetry && info.Retried > 0:
		b.Reason = BlockedFailing
		return b, nil
	case info.State == asynq.TaskStateScheduled:
		b.Reason = BlockedScheduled
		return b, nil
	}
	stale, err := r.stale(ctx, q, b.Head, info)
	if err != nil {
		return nil, err
	}
	if stale != nil {
		b.Reason, b.Stale = BlockedStale, stale
		return b, nil
	}
	b.Reason = BlockedWaiting
	return b, nil
}

// headOf fills h with the head of st, a sequence read at least one
// position deep, and reports whether there is one: a position right after
// the cursor that waits for its task.
func headOf(st Status, h *Head) bool {
	if !st.Exists || st.Waiting == 0 || len(st.Pending) == 0 || st.Pending[0].Pos != st.Done+1 || st.Pending[0].Label == "" {
		return false
	}
	p := st.Pending[0]
	h.Pos, h.Label, h.Since, h.RetryAt, h.record = p.Pos, p.Label, p.Reserved, p.RetryAt, p.Record
	return true
}

// fill sets h's task fields from info.
func (h *Head) fill(info *asynq.TaskInfo) {
	h.Queue, h.State, h.Retried, h.MaxRetry, h.LastErr = info.Queue, info.State.String(), info.Retried, info.MaxRetry, info.LastErr
	h.Type, h.Payload, h.NextRunAt, h.LastFailedAt = info.Type, info.Payload, info.NextProcessAt, info.LastFailedAt
}

// stale says whether key, whose head h's task (info) exists and neither
// fails nor is scheduled, is held up by a worker that is gone: h's task
// active with its asynq lease ended, or the key's lock held by a task that
// no longer runs: one no queue of q holds, one that is not active, or one
// active with its lease ended. A holder whose meta does not read "<task
// type> <task ID>" (the Runner's and the worker's) is taken as running.
func (r *Runner) stale(ctx context.Context, q BlockedQuery, h Head, info *asynq.TaskInfo) (*staleHold, error) {
	holder, err := r.l.Sequencer().Holder(ctx, h.Key)
	if err != nil {
		return nil, err
	}
	s := &staleHold{TaskID: h.TaskID, Queue: info.Queue, State: info.State.String()}
	if holder.Held {
		s.Holder, s.HolderTTL = holder.Meta, holder.TTL
	}
	if ended, err := r.leaseEnded(ctx, q.Now, info); err != nil || !ended.IsZero() {
		s.LeaseEnded = ended
		return s, err
	}
	_, id, ok := strings.Cut(holder.Meta, " ")
	if !holder.Held || !ok || id == "" || id == info.ID {
		return nil, nil
	}
	queue, hinfo, err := r.lookAnywhere(ctx, append([]string{info.Queue}, q.Queues...), id)
	if err != nil {
		return nil, err
	}
	s.TaskID, s.Queue, s.State = id, queue, StateMissing
	if hinfo == nil {
		return s, nil
	}
	s.State = hinfo.State.String()
	if hinfo.State != asynq.TaskStateActive {
		return s, nil
	}
	if s.LeaseEnded, err = r.leaseEnded(ctx, q.Now, hinfo); err != nil || !s.LeaseEnded.IsZero() {
		return s, err
	}
	return nil, nil // the holder runs
}

// leaseEnded returns when asynq's lease of info's task ended, when it is
// active and the lease ended before now; the zero time otherwise.
func (r *Runner) leaseEnded(ctx context.Context, now time.Time, info *asynq.TaskInfo) (time.Time, error) {
	if info.State != asynq.TaskStateActive {
		return time.Time{}, nil
	}
	end, ok, err := asynqwire.LeaseEnd(ctx, r.rdb, info.Queue, info.ID)
	if err != nil || !ok || !end.Before(now) {
		return time.Time{}, err
	}
	return end, nil
}

// lookAnywhere finds task id in the first of queues that holds it, and
// reads it there; it returns the first queue and nil info when none holds
// it.
func (r *Runner) lookAnywhere(ctx context.Context, queues []string, id string) (string, *asynq.TaskInfo, error) {
	var uniq []string
	for _, q := range queues {
		if !slices.Contains(uniq, q) {
			uniq = append(uniq, q)
		}
	}
	holding, err := asynqwire.TaskQueues(ctx, r.rdb, uniq, id)
	if err != nil {
		return "", nil, err
	}
	for _, q := range holding {
		info, err := asynqwire.LookTaskInfo(ctx, r.insp, r.rdb, q, id)
		if errors.Is(err, asynq.ErrTaskNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			return q, nil, fmt.Errorf("task %s in %s: %w", id, q, err)
		}
		return q, info, nil
	}
	return uniq[0], nil, nil
}
