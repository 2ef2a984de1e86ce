package orderview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
)

// Status is what is happening to one order, read in one call: the order,
// its sequence of accepted changes, its lock, the tasks its records name,
// and its latest history. [Reader.Status] reads it.
//
// The tasks are found through the order's own records, never by scanning
// queues: the positions waiting in its sequence name their tasks, the
// sequence's log names the tasks of positions skipped, finished ahead or
// archived in their turn, the lock names its holder, and the history names
// the events applied (whose tasks asynq keeps, completed, for the
// producer's retention, 24 h). A task enqueued by hand without a position
// (seq) is in none of these records until it is applied, and so is not
// shown while it waits; find it in asynqmon by its ID.
type Status struct {
	// OrderNo is the order number asked for.
	OrderNo string `json:"order_no"`
	// At is when the view was read, by the reader's clock; the ages and
	// times left below are relative to it.
	At time.Time `json:"at"`
	// Order is the order as the store holds it, or nil when the store has
	// no such order: a replacement whose exchange has not been applied
	// yet, or a number that was never an order.
	Order *orders.Order `json:"order,omitempty"`
	// Summary says in a few sentences, most important first, what is
	// happening to the order: who holds it, what waits and why. Never nil.
	Summary []string `json:"summary"`
	// Lock is the order's lock.
	Lock Lock `json:"lock"`
	// Sequence is the order's sequence of accepted changes.
	Sequence Sequence `json:"sequence"`
	// Tasks are the order's tasks that asynq still has, in any state,
	// ordered by position (tasks without one last). Never nil.
	Tasks []Task `json:"tasks"`
	// History holds the order's latest history entries, oldest first (at
	// most Config.HistoryLen); HistoryTotal is how many writes the order
	// has had, each with its entry (the order's version: the store may
	// keep fewer, see redisstore.Config.HistoryMax). Never nil.
	History      []orders.Entry `json:"history"`
	HistoryTotal int64          `json:"history_total"`
}

// Lock is an order's lock as [Reader.Status] reads it.
type Lock struct {
	// Held is false when no task holds the order; the other fields are
	// then empty.
	Held bool `json:"held"`
	// Holder describes the holder: "<task type> <task ID>".
	Holder string `json:"holder,omitempty"`
	// TaskID is the holder's task ID, when Holder names one; Queue is the
	// queue that holds that task (where it was found, or else where the
	// contract puts it).
	TaskID string `json:"task_id,omitempty"`
	Queue  string `json:"queue,omitempty"`
	// Fence is the holder's fencing token.
	Fence int64 `json:"fence,omitempty"`
	// LeaseMS is the holder's lease left, in milliseconds; the holder
	// renews it every third of the lock TTL while it works.
	LeaseMS int64 `json:"lease_ms,omitempty"`
}

// Sequence is an order's sequence of accepted changes: every change takes
// the next position when it is accepted, and the workers apply them in
// that order.
type Sequence struct {
	// Exists is false when the order has no sequence: no change was
	// accepted for it within the sequence retention (7 days since the
	// last use). The other fields are then empty.
	Exists bool `json:"exists"`
	// Done is the cursor: every position up to it is finished (applied,
	// rejected, archived or skipped).
	Done int64 `json:"done,omitempty"`
	// Last is the last position handed out; Last - Done positions wait.
	Last int64 `json:"last,omitempty"`
	// Waiting are the first positions after the cursor, in order, at
	// most Config.MaxPositions of them, read as one page whatever the
	// backlog; More counts the others (Last - Done - len(Waiting)). Never
	// nil.
	Waiting []Position `json:"waiting"`
	More    int64      `json:"more,omitempty"`
	// Gap is the next position when its task will not come (it does not
	// exist, or it ended without taking its turn): the changes behind it
	// wait until the workers skip it, GapWaitMS after it was reserved.
	// Nil otherwise.
	Gap *Gap `json:"gap,omitempty"`
	// Log holds the sequence's latest settlements, oldest first: the
	// positions voided (their enqueue was refused), skipped (no task came
	// for them), finished ahead of their turn, and the tasks noted as
	// archived in their turn. At most 20. Never nil.
	Log []LogEntry `json:"log"`
	// Hold is the operator's hold of the order (internal/orderops: who,
	// why, since when), nil when it is not held: its changes are accepted
	// but not applied until it is resumed.
	Hold *Hold `json:"hold,omitempty"`
}

// The states of a [Position].
const (
	// PositionReserved is a position whose change has not been applied
	// yet: it waits for its turn, or its task runs or will run.
	PositionReserved = "reserved"
	// PositionVoided is a position given up ahead of its turn: its enqueue
	// was refused. The cursor passes it.
	PositionVoided = "voided"
	// PositionFinished is a position whose task ended ahead of its turn
	// (archived without running, or a replacement's creation settled).
	// The cursor passes it.
	PositionFinished = "finished"
)

// TaskMissing is the TaskState of a position whose task asynq does not
// have.
const TaskMissing = "missing"

// TaskUnlisted is the TaskState of a position whose task exists in a queue
// missing from asynq's set of queues (lost in a failover, say): asynq's
// Inspector cannot read it, but it is not missing, and its position is no
// gap. A worker lists the queue again when it checks the order's turn.
const TaskUnlisted = "unlisted"

// Position is a position after an order's sequence cursor.
type Position struct {
	// Seq is the position.
	Seq int64 `json:"seq"`
	// Next says it is the position whose turn it is (the head).
	Next bool `json:"next"`
	// State is PositionReserved, PositionVoided or PositionFinished.
	State string `json:"state"`
	// Label is what the position was reserved for: "order:modify crm-1",
	// or "order:create crm-2 SO1" for the creation of a replacement by
	// exchange crm-2 of SO1. Empty for a voided or finished position.
	Label string `json:"label,omitempty"`
	// TaskID and Queue name the position's task, when its label names
	// one (Queue is where asynq has the task, or else where the contract
	// puts it); TaskState is that task's asynq state (pending, active,
	// scheduled, retry, archived, completed), TaskMissing or TaskUnlisted.
	TaskID    string `json:"task_id,omitempty"`
	Queue     string `json:"queue,omitempty"`
	TaskState string `json:"task_state,omitempty"`
	// ReservedAt is when the position was handed out (Redis clock).
	ReservedAt time.Time `json:"reserved_at,omitzero"`
	// RetryAt is, for the head, when its task runs again after a failure,
	// as its worker recorded it.
	RetryAt time.Time `json:"retry_at,omitzero"`
	// Reason is why a voided or finished position was settled.
	Reason string `json:"reason,omitempty"`
}

// Gap is the head of an order's sequence while its task will not come.
type Gap struct {
	// Seq is the position, Label what it was reserved for.
	Seq   int64  `json:"seq"`
	Label string `json:"label"`
	// TaskID names the task the label names, if any.
	TaskID string `json:"task_id,omitempty"`
	// Reason says why its task will not come.
	Reason string `json:"reason"`
	// ReservedAt is when the position was handed out; AgeMS how long ago.
	ReservedAt time.Time `json:"reserved_at"`
	AgeMS      int64     `json:"age_ms"`
	// GapWaitMS is the workers' gap wait (GAP_WAIT); LeftMS is how much of
	// it is left. At 0 the next task behind the position that runs checks
	// with asynq and skips it; the tasks behind come back to run within
	// the gap wait.
	GapWaitMS int64 `json:"gap_wait_ms"`
	LeftMS    int64 `json:"left_ms"`
}

// The kinds of a [LogEntry].
const (
	// LogVoid is a position voided because its enqueue was refused.
	LogVoid = "void"
	// LogSkip is a head position skipped because its task will not come.
	LogSkip = "skip"
	// LogFinish is a position finished ahead of its turn.
	LogFinish = "finish"
	// LogNote says a task of the order was archived, and why: after its
	// turn, or without one (its Seq is then 0 or a position that was not
	// its own). It outlives asynq's copy of the task.
	LogNote = "note"
	// LogAction is an operator's action on the order (internal/orderops:
	// retry now, hold, resume; a skip is a LogSkip), with who and why.
	LogAction = "action"
)

// LogEntry is an entry of an order's sequence log.
type LogEntry struct {
	// Seq is the position (0 for a task without one), At when it was
	// logged (Redis clock).
	Seq int64     `json:"seq"`
	At  time.Time `json:"at"`
	// Kind is LogVoid, LogSkip, LogFinish, LogNote or LogAction.
	Kind string `json:"kind"`
	// Label is what the position was reserved for; TaskID names its task,
	// when the label names one.
	Label  string `json:"label"`
	TaskID string `json:"task_id,omitempty"`
	// Reason says why, for people.
	Reason string `json:"reason"`
}

// Where a [Task] was found in the order's records.
const (
	// SourceLock is the task that holds the order's lock.
	SourceLock = "lock"
	// SourcePosition is the task of a position waiting in the sequence.
	SourcePosition = "position"
	// SourceLog is a task named by the sequence's log.
	SourceLog = "log"
	// SourceHistory is the task of an applied history entry.
	SourceHistory = "history"
)

// Task is one of an order's tasks, as asynq holds it.
type Task struct {
	TaskID string `json:"task_id"`
	Queue  string `json:"queue"`
	Type   string `json:"type"`
	// Seq is the task's position, from its payload; 0 for none.
	Seq int64 `json:"seq,omitempty"`
	// State is asynq's: pending, active, scheduled, retry, archived or
	// completed. A task waiting for its turn is parked in asynq's retry
	// set (state retry) without a failure.
	State string `json:"state"`
	// Source says which of the order's records names the task: SourceLock,
	// SourcePosition, SourceLog or SourceHistory.
	Source string `json:"source"`
	// Note says what the task means for the order, for people.
	Note string `json:"note"`
	// Retried is how many times it failed; MaxRetry its failure budget.
	Retried  int `json:"retried"`
	MaxRetry int `json:"max_retry"`
	// LastError is asynq's last error: a failure's, an archive's reason,
	// or, for a task parked to wait for its turn, the wait.
	LastError    string    `json:"last_error,omitempty"`
	LastFailedAt time.Time `json:"last_failed_at,omitzero"`
	// NextProcessAt is when a scheduled or retry task is due.
	NextProcessAt time.Time `json:"next_process_at,omitzero"`
	CompletedAt   time.Time `json:"completed_at,omitzero"`
}

// ref names a task an order's record points at, and the queues it may be
// in (its placements, where the contract puts it first).
type ref struct {
	queues        []string
	id, typ       string
	source        string
	creates, from string // for a creation position: the order created, and the exchanged one
	reason        string // the log entry's reason
	logKind       string
	entry         *orders.Entry
}

// Status reads what is happening to order orderNo: see [Status]. The order
// need not exist (a replacement being created has a sequence but no order
// yet); nothing known at all is an empty view, not an error.
//
// It costs a few round trips plus one asynq lookup per task named (at most
// Config.MaxPositions positions, 20 log entries, the lock holder and
// Config.HistoryLen history entries) in each of its placements until one
// has it: a history entry's task is looked for in the placements of every
// kind of Config.Kinds, its entry type's kind first, since the entry's
// type need not be its task's. It is meant for people, not for the hot
// path. It returns an error matching orders.ErrInvalid for a malformed
// order number, and the store's, Redis' and asynq's errors, wrapped.
func (r *Reader) Status(ctx context.Context, orderNo string) (Status, error) {
	if !tasks.ValidOrderNo(orderNo) {
		return Status{}, fmt.Errorf("orderview: order number %q: %w", orderNo, orders.ErrInvalid)
	}
	s := r.newStatusRead(orderNo)
	if err := s.readOrder(ctx); err != nil {
		return Status{}, err
	}
	if err := s.readLock(ctx); err != nil {
		return Status{}, err
	}
	if err := s.readSequence(ctx); err != nil {
		return Status{}, err
	}
	s.nameHistoryTasks()
	if err := s.lookTasks(ctx); err != nil {
		return Status{}, err
	}
	s.placeLock()
	s.placePositions()
	s.listTasks()
	s.summarize()
	return s.st, nil
}

// statusRead is one [Reader.Status] under way: the view its steps fill in
// turn, and what each step hands on to the next. Its steps run in the
// order Status calls them, on one goroutine.
type statusRead struct {
	r       *Reader
	orderNo string
	now     time.Time
	st      Status
	holder  keyorder.Holder
	seq     keyorder.Status
	// refs name the tasks the order's records point at, in the order the
	// records are read: the lock's holder first, then the waiting
	// positions, the log and the history. posKeys[i] is the ref key of the
	// task of st.Sequence.Waiting[i].
	refs    []ref
	posKeys map[int]string
	// found and unlisted are what lookup answered for refs.
	found    map[string]*asynq.TaskInfo
	unlisted map[string]string
}

// newStatusRead starts the read of order orderNo at the reader's now, with
// every list of the view empty (never nil).
func (r *Reader) newStatusRead(orderNo string) *statusRead {
	now := r.cfg.Now().UTC()
	return &statusRead{r: r, orderNo: orderNo, now: now, posKeys: map[int]string{},
		st: Status{OrderNo: orderNo, At: now, Summary: []string{}, Tasks: []Task{},
			Sequence: Sequence{Waiting: []Position{}, Log: []LogEntry{}}, History: []orders.Entry{}}}
}

// readOrder reads the order and its latest history entries. An order the
// store does not have leaves both empty.
func (s *statusRead) readOrder(ctx context.Context) error {
	o, err := s.r.store.Get(ctx, s.orderNo)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("orderview: order %s: %w", s.orderNo, err)
	}
	s.st.Order = &o
	// Every write to an order bumps its version and appends one entry, so
	// the latest entries are those after version − HistoryLen.
	page, err := s.r.store.History(ctx, s.orderNo, orders.HistoryQuery{After: max(0, o.Version-int64(s.r.cfg.HistoryLen)), Limit: s.r.cfg.HistoryLen})
	if err != nil && !errors.Is(err, orders.ErrNotFound) {
		return fmt.Errorf("orderview: history of %s: %w", s.orderNo, err)
	}
	s.st.History = append(s.st.History, page.Entries...)
	s.st.HistoryTotal = o.Version
	return nil
}

// readLock reads the order's lock, and names its holder's task first in
// refs when the holder's label names one.
func (s *statusRead) readLock(ctx context.Context) error {
	holder, err := s.r.seq.Holder(ctx, s.orderNo)
	if err != nil {
		return fmt.Errorf("orderview: %w", err)
	}
	s.holder = holder
	if !holder.Held {
		return nil
	}
	s.st.Lock = Lock{Held: true, Holder: holder.Meta, Fence: holder.Fence, LeaseMS: holder.TTL.Milliseconds()}
	if typ, id, _, ok := s.r.cfg.Kinds.ParseLabel(holder.Meta); ok {
		s.st.Lock.TaskID = id
		s.refs = append(s.refs, ref{queues: s.placed(typ, ""), id: id, typ: typ, source: SourceLock})
	}
	return nil
}

// readSequence reads the order's sequence: its operator's hold, its
// cursor, its first waiting positions and its log.
func (s *statusRead) readSequence(ctx context.Context) error {
	seq, err := s.r.seq.Status(ctx, s.orderNo)
	if err != nil {
		return fmt.Errorf("orderview: %w", err)
	}
	s.seq = seq
	if p := seq.Paused; p != nil {
		s.st.Sequence.Hold = &Hold{By: p.By, Reason: p.Reason, At: utc(p.At)}
	}
	if !seq.Exists {
		return nil
	}
	s.st.Sequence.Exists, s.st.Sequence.Done, s.st.Sequence.Last = true, seq.Done, seq.Last
	s.readPositions()
	s.readLog()
	return nil
}

// readPositions fills the waiting positions (at most MaxPositions: the
// Sequencer's page) and names the task of each whose label names one.
func (s *statusRead) readPositions() {
	sq := &s.st.Sequence
	for _, p := range s.seq.Pending {
		pos := position(p, s.seq.Done)
		if typ, id, from, ok := s.r.cfg.Kinds.ParseLabel(p.Label); ok {
			rf := ref{queues: s.placed(typ, from), id: id, typ: typ, source: SourcePosition}
			pos.TaskID, pos.Queue = id, rf.queues[0]
			s.posKeys[len(sq.Waiting)] = rf.key()
			if from != "" {
				rf.creates, rf.from = s.orderNo, from
			}
			s.refs = append(s.refs, rf)
		}
		sq.Waiting = append(sq.Waiting, pos)
	}
	sq.More = max(s.seq.Waiting-int64(len(sq.Waiting)), 0)
}

// readLog fills the sequence's log and names the task of each entry whose
// label names one, but for a voided position's.
func (s *statusRead) readLog() {
	for _, e := range s.seq.Log {
		le := LogEntry{Seq: e.Pos, At: e.At, Kind: e.Kind, Label: e.Label, Reason: e.Reason}
		if typ, id, from, ok := s.r.cfg.Kinds.ParseLabel(e.Label); ok {
			le.TaskID = id
			// A voided position's task was refused: asynq's task by that
			// ID, if any, holds another position.
			if e.Kind != LogVoid {
				s.refs = append(s.refs, ref{queues: s.placed(typ, from), id: id, typ: typ, source: SourceLog, reason: e.Reason, logKind: e.Kind})
			}
		}
		s.st.Sequence.Log = append(s.st.Sequence.Log, le)
	}
}

// nameHistoryTasks names the task of each history entry that a task made.
func (s *statusRead) nameHistoryTasks() {
	for i := range s.st.History {
		e := &s.st.History[i]
		if e.EventID == "" {
			continue // a put or a note: no task made it
		}
		s.refs = append(s.refs, ref{queues: s.r.entryQueues(e, s.orderNo, s.st.Order), id: e.EventID, source: SourceHistory, entry: e})
	}
}

// placed returns the queues a task of type typ may be in: its order's
// placements (a creation's task is the exchange of order from).
func (s *statusRead) placed(typ, from string) []string {
	return s.r.cfg.Shards.Placements(s.r.cfg.Kinds.Of(typ), cmp.Or(from, s.orderNo))
}

// lookTasks reads the tasks refs name from asynq (see lookup).
func (s *statusRead) lookTasks(ctx context.Context) error {
	found, unlisted, err := s.r.lookup(ctx, s.refs)
	if err != nil {
		return err
	}
	s.found, s.unlisted = found, unlisted
	return nil
}

// placeLock sets the queue of the lock holder's task: where asynq has it,
// or else where the contract puts it.
func (s *statusRead) placeLock() {
	if s.st.Lock.TaskID == "" {
		return
	}
	rf := s.refs[0] // readLock named the holder's task first
	s.st.Lock.Queue = rf.queues[0]
	if info := s.found[rf.key()]; info != nil {
		s.st.Lock.Queue = info.Queue
	} else if q, ok := s.unlisted[rf.key()]; ok {
		s.st.Lock.Queue = q
	}
}

// placePositions sets the state and queue of each waiting position's task,
// and the gap when the head's task will not come.
func (s *statusRead) placePositions() {
	for i := range s.st.Sequence.Waiting {
		p := &s.st.Sequence.Waiting[i]
		if p.TaskID == "" {
			continue
		}
		p.TaskState = TaskMissing
		info := s.found[s.posKeys[i]]
		if info != nil {
			p.TaskState, p.Queue = info.State.String(), info.Queue
		}
		if q, ok := s.unlisted[s.posKeys[i]]; ok {
			p.TaskState, p.Queue = TaskUnlisted, q
			continue // it exists: no gap
		}
		if p.Next && p.State == PositionReserved {
			s.st.Sequence.Gap = s.r.gap(s.now, *p, info)
		}
	}
}

// listTasks lists each task asynq has of those refs name, once, ordered by
// position (tasks without one last).
func (s *statusRead) listTasks() {
	head := int64(0) // no sequence: no turns
	if s.seq.Exists {
		head = s.seq.Done + 1
	}
	seen := map[string]bool{}
	for _, rf := range s.refs {
		key := rf.key()
		info := s.found[key]
		if info == nil || seen[key] {
			continue
		}
		seen[key] = true
		s.st.Tasks = append(s.st.Tasks, task(s.r.cfg.Kinds, info, rf, head, s.holder))
	}
	slices.SortStableFunc(s.st.Tasks, func(a, b Task) int {
		if (a.Seq == 0) != (b.Seq == 0) {
			if a.Seq == 0 {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
}

// summarize writes the view's summary, and a sentence for each task found
// in a queue missing from asynq's set of queues.
func (s *statusRead) summarize() {
	s.st.Summary = summary(&s.st, s.r.cfg.GapWait)
	seen := map[string]bool{}
	for _, rf := range s.refs {
		if q, ok := s.unlisted[rf.key()]; ok && !seen[rf.key()] {
			seen[rf.key()] = true
			s.st.Summary = append(s.st.Summary, fmt.Sprintf("Task %s exists in queue %s, which is missing from asynq's set of queues: asynq's Inspector and asynqmon do not show it, and this view cannot read its state. A worker lists the queue again when it next checks its order's turn, and so does the next change enqueued into it.", rf.id, q))
		}
	}
}

// key identifies the task of a ref in the map lookup returns.
func (rf ref) key() string { return rf.id + "@" + strings.Join(rf.queues, ",") }

// lookup reads the tasks refs name from asynq, by queue and ID, each once:
// in each of a ref's queues in turn, until one has it. A task asynq does
// not have is absent from found, which is keyed by ref.key. A task that
// exists in a queue missing from asynq's set of queues, which the
// Inspector cannot read (asynqredis.LookTaskInfo), is not taken for missing:
// it is in unlisted, by the same key, with its queue. lookup only reads.
func (r *Reader) lookup(ctx context.Context, refs []ref) (found map[string]*asynq.TaskInfo, unlisted map[string]string, err error) {
	found, unlisted = map[string]*asynq.TaskInfo{}, map[string]string{}
	looked := make(map[string]bool)
	for _, rf := range refs {
		key := rf.key()
		if looked[key] {
			continue
		}
		looked[key] = true
		for _, q := range rf.queues {
			info, err := asynqredis.LookTaskInfo(ctx, r.insp, r.rdb, q, rf.id)
			if errors.Is(err, asynq.ErrTaskNotFound) {
				continue
			}
			if errors.Is(err, asynqredis.ErrUnlisted) {
				unlisted[key] = q
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("orderview: task %s in %s: %w", rf.id, q, err)
			}
			found[key] = info
			break
		}
	}
	return found, unlisted, nil
}

// entryQueues returns the queues where the task that made history entry e
// of order orderNo (o, nil when the store has none) may be, most likely
// first. An entry's type is the store's record of the write, which need
// not be the type of the task that made it: the contract's stores record a
// modify and an exchange under their task types, but a creation as
// orders.TypeCreated (made by the creating kind's task of the order it
// replaced, tasks.Table.Creator), and a kind of a program's own may write
// through another kind's store method (and so under its type) or record
// a type of its own. So the queues of the kind the entry's type names come
// first (those of the creating kind, in the replaced order's placements,
// for a creation), then the placements of every other kind of the table:
// the task is found whatever kind made it, at the cost of one lookup in
// each queue that does not have it.
func (r *Reader) entryQueues(e *orders.Entry, orderNo string, o *orders.Order) []string {
	var out []string
	add := func(qs []string) {
		for _, q := range qs {
			if !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
	}
	if c := r.cfg.Kinds.Creator(); c != nil && e.Type == orders.TypeCreated {
		// Every queue of the creating kind when the order does not say
		// which order it replaced.
		if o != nil && o.ExchangedFrom != "" {
			add(r.cfg.Shards.Placements(c, o.ExchangedFrom))
		} else {
			add(r.cfg.Shards.Queues(c))
		}
	}
	if k := r.cfg.Kinds.Of(e.Type); k != nil {
		add(r.cfg.Shards.Placements(k, orderNo))
	}
	for _, k := range r.cfg.Kinds {
		add(r.cfg.Shards.Placements(k, orderNo))
	}
	return out
}

// position reads a pending record of the sequence whose cursor is done.
func position(p keyorder.Pending, done int64) Position {
	pos := Position{Seq: p.Pos, Next: p.Pos == done+1, Label: p.Label, ReservedAt: p.Reserved, RetryAt: p.RetryAt}
	switch kind, reason, _ := strings.Cut(p.Record, " "); kind {
	case "v":
		pos.State, pos.Reason = PositionVoided, reason
	case "f":
		pos.State, pos.Reason = PositionFinished, reason
	default:
		pos.State = PositionReserved
	}
	return pos
}

// gap returns the head p as a Gap when its task (info, nil when asynq has
// none) will not come, as the workers' gap check judges it; nil when it
// will.
func (r *Reader) gap(now time.Time, p Position, info *asynq.TaskInfo) *Gap {
	var why string
	switch {
	case p.TaskID == "":
		why = fmt.Sprintf("its label %q names no task", p.Label)
	case info == nil:
		why = fmt.Sprintf("task %s is not in queue %s: never enqueued, refused, or deleted", p.TaskID, p.Queue)
	case info.State == asynq.TaskStateArchived:
		why = fmt.Sprintf("task %s was archived without taking its turn: %s", p.TaskID, info.LastErr)
	case info.State == asynq.TaskStateCompleted:
		why = fmt.Sprintf("task %s completed without passing its turn on", p.TaskID)
	default:
		if s := payloadSeq(r.cfg.Kinds, info); s != 0 && s != p.Seq && !strings.HasPrefix(p.Label, "order:create ") {
			why = fmt.Sprintf("task %s holds position %d, not this one", p.TaskID, s)
			break
		}
		return nil
	}
	return r.gapOf(now, p, why)
}

// gapOf is head p as a gap, whose task will not come for why.
func (r *Reader) gapOf(now time.Time, p Position, why string) *Gap {
	age := max(now.Sub(p.ReservedAt), 0)
	return &Gap{Seq: p.Seq, Label: p.Label, TaskID: p.TaskID, Reason: why, ReservedAt: p.ReservedAt,
		AgeMS: age.Milliseconds(), GapWaitMS: r.cfg.GapWait.Milliseconds(), LeftMS: max(r.cfg.GapWait-age, 0).Milliseconds()}
}

// payloadSeq returns the position a task's payload carries, read as a
// kind of kinds; 0 when none, unreadable or of no kind of kinds.
func payloadSeq(kinds tasks.Table, info *asynq.TaskInfo) int64 {
	k := kinds.Of(info.Type)
	if k == nil {
		return 0
	}
	p, err := k.Decode(info.Payload)
	if err != nil {
		return 0
	}
	return p.Header().Seq
}

// task describes a task found through rf, read as a kind of kinds, for a sequence whose head is
// head (0 when there is no sequence) and a lock held by holder.
func task(kinds tasks.Table, info *asynq.TaskInfo, rf ref, head int64, holder keyorder.Holder) Task {
	t := Task{
		TaskID: info.ID, Queue: info.Queue, Type: info.Type, Seq: payloadSeq(kinds, info), State: info.State.String(),
		Source: rf.source, Retried: info.Retried, MaxRetry: tasks.FailureBudget(info.MaxRetry),
		LastError: info.LastErr, LastFailedAt: utc(info.LastFailedAt), CompletedAt: utc(info.CompletedAt),
	}
	if info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry {
		// asynq says "now" for the other states; it means nothing there.
		t.NextProcessAt = utc(info.NextProcessAt)
	}
	t.Note = taskNote(t, rf, head, holder)
	return t
}

// taskNote says what task t means for its order.
func taskNote(t Task, rf ref, head int64, holder keyorder.Holder) string {
	due := ""
	if !t.NextProcessAt.IsZero() {
		due = " at " + t.NextProcessAt.Format(time.RFC3339)
	}
	switch {
	case t.State == "archived" && rf.logKind == LogNote:
		return rf.reason
	case t.State == "archived":
		return "archived: " + t.LastError
	case t.State == "active" && holder.Held && holder.Meta == t.Type+" "+t.TaskID:
		return "running: holds the order's lock"
	case t.State == "active":
		return "running: waits for the order's lock or its turn"
	case rf.source == SourceHistory && rf.entry != nil:
		return fmt.Sprintf("applied: version %d, %s", rf.entry.Version, rf.entry.Detail)
	case rf.source == SourceLog:
		return rf.logKind + ": " + rf.reason
	case t.State == "completed":
		return "completed"
	}
	switch {
	case rf.creates != "":
		return fmt.Sprintf("the exchange of %s that creates %s: it runs in its turn in %s's sequence, and the changes of %s behind this position wait for it",
			rf.from, rf.creates, rf.from, rf.creates)
	case t.Seq == 0:
		return "has no position: applied without order once it gets the lock"
	case head == 0:
		return "its order's sequence expired: it runs without order once it gets the lock"
	case t.Seq < head:
		return "its position was passed without it: it runs without order once it gets the lock"
	case t.Seq == head && t.State == "retry" && t.Retried > 0:
		return fmt.Sprintf("its turn: failed %d of %d allowed times; runs again%s, and the changes behind it wait for it", t.Retried, t.MaxRetry+1, due)
	case t.Seq == head:
		return "its turn: asynq runs it" + cmp.Or(due, " as soon as a worker is free")
	}
	ahead := fmt.Sprintf("%d positions are ahead of it", t.Seq-head)
	if t.Seq-head == 1 {
		ahead = "1 position is ahead of it"
	}
	if t.State == "retry" && t.Retried == 0 {
		return fmt.Sprintf("waits for its turn (%s): parked in asynq's retry set, not failed; back%s at the latest, or as soon as its turn comes", ahead, due)
	}
	return fmt.Sprintf("waits for its turn (%s)", ahead)
}

// utc returns t in UTC, keeping the zero time zero.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// summary says what is happening to the order of st, most important first:
// an operator's hold (who, since when, why, and what resumes it), then a
// failing head (which change, its attempts, its last error, its next
// run), then the order and the rest.
func summary(st *Status, gapWait time.Duration) []string {
	var out []string
	no := st.OrderNo
	sq := st.Sequence
	if h := sq.Hold; h != nil {
		since := "at an unknown time"
		if !h.At.IsZero() {
			since = "since " + h.At.Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("On hold: held by %s %s (%s). Its changes are accepted but not applied until it is resumed; %s wait. Resume it with producer order resume %s -reason \"…\", the intake's POST /v1/orders/%s/actions/resume, or Resume on this page when the dashboard's writes are on: the change whose turn it is then runs at once.",
			cmp.Or(h.By, "an operator"), since, cmp.Or(h.Reason, "no reason given"), Count(max(sq.Last-sq.Done, 0)), no, no))
	}
	for _, t := range st.Tasks {
		if sq.Exists && t.Seq == sq.Done+1 && t.State == "retry" && t.Retried > 0 {
			out = append(out, failingSummary(no, t))
			break
		}
	}
	switch o := st.Order; {
	case o == nil && !st.Sequence.Exists && !st.Lock.Held:
		return []string{fmt.Sprintf("Nothing is known of %s: the order store has no such order, and no change was accepted for it in the last 7 days. (A task enqueued by hand without a position is not in the order's records.)", no)}
	case o == nil:
		out = append(out, fmt.Sprintf("%s is not in the order store yet: it is created by the exchange that holds its first position, or it never was an order.", no))
	case o.Status == orders.StatusExchanged:
		out = append(out, fmt.Sprintf("%s was exchanged to %s (version %d): changes of %s accepted after the exchange are rejected, naming %s.", no, o.ExchangedTo, o.Version, no, o.ExchangedTo))
	case o.Status == orders.StatusCancelled:
		out = append(out, fmt.Sprintf("%s is cancelled (version %d): changes of it are rejected.", no, o.Version))
	default:
		out = append(out, fmt.Sprintf("%s is %s, version %d, last written %s.", no, o.Status, o.Version, o.UpdatedAt.Format(time.RFC3339)))
	}
	if l := st.Lock; l.Held {
		out = append(out, fmt.Sprintf("Locked by %s (fence %d, lease %v left): that task is applying its change now.", l.Holder, l.Fence, (time.Duration(l.LeaseMS)*time.Millisecond).Round(time.Second)))
	}
	waiting := sq.Last - sq.Done
	switch {
	case !sq.Exists:
		out = append(out, "No change was accepted for it in the last 7 days (its sequence expired or never existed).")
	case waiting == 0:
		out = append(out, "Nothing waits: every change accepted for it was applied, rejected, archived or skipped.")
	default:
		out = append(out, fmt.Sprintf("%s accepted change(s) not applied yet; next in line is position %d.", Count(waiting), sq.Done+1))
	}
	if g := sq.Gap; g != nil {
		left := time.Duration(g.LeftMS) * time.Millisecond
		when := fmt.Sprintf("in %v, when the gap wait (%v) ends", left.Round(time.Second), gapWait)
		if left == 0 {
			when = fmt.Sprintf("now that the gap wait (%v) is over, as soon as a task behind it runs", gapWait)
		}
		out = append(out, fmt.Sprintf("Position %d (%s) holds the order up: %s. It is skipped %s.", g.Seq, g.Label, g.Reason, when))
	}
	parked, archived := 0, 0
	for _, t := range st.Tasks {
		switch {
		case t.Seq > sq.Done+1 && t.State == "retry" && t.Retried == 0:
			parked++
		case t.State == "archived":
			archived++
		}
	}
	if parked > 0 {
		out = append(out, fmt.Sprintf("%d task(s) wait for their turn, parked in asynq's retry set (not failures).", parked))
	}
	if archived > 0 {
		out = append(out, fmt.Sprintf("%d of its tasks are archived: their changes were not applied (see each task's reason).", archived))
	}
	return out
}

// failingSummary says that the head of order no, task t, fails: which
// change, its attempts, its last error, when it runs again, and what ends
// it.
func failingSummary(no string, t Task) string {
	last := ""
	if !t.LastFailedAt.IsZero() {
		last = ", last at " + t.LastFailedAt.Format(time.RFC3339)
	}
	next := "again after its backoff"
	if !t.NextProcessAt.IsZero() {
		next = "again at " + t.NextProcessAt.Format(time.RFC3339)
	}
	return fmt.Sprintf("Its next change fails: task %s (%s, position %d) failed %d of %d allowed times%s: %s. It runs %s, and the changes behind it wait for it; past its budget it is archived and the order goes on. Retry it now (producer order retry %s -reason \"…\") once the cause is fixed, or skip it.",
		t.TaskID, t.Type, t.Seq, t.Retried, t.MaxRetry+1, last, t.LastError, next, no)
}

// Count formats n for people, with a comma between groups of three
// digits (2,980), as the views print counts.
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, s = "-", s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return sign + b.String()
}
