package keyorder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// The operator's actions on a key, and the blocked-keys read. They act on
// the key's sequence and the asynq task at its head, on a Runner's Redis,
// and are safe for concurrent use with the Runners and each other.
//
// Each action by key ([Runner.Retry], [Runner.Skip]) reads the head
// ([Runner.Head]) and acts on exactly what it read ([Runner.RetryHead],
// [Runner.SkipHead]): a program whose actions check more than the
// Runner's, or say why in its own words, reads the head, checks it, and
// acts on the same Head.

// ErrNothingToDo is matched by the error of an action that does not apply
// to the key as it is: nothing waits, the head's task runs right now, the
// key is (or is not) on hold already. The error says why.
var ErrNothingToDo = errors.New("keyorder: the action does not apply")

// Head is the position at the head of a key's sequence, and its task.
type Head struct {
	Key string
	Pos int64
	// Label is the label the position was reserved under (for a
	// [Client]'s, taskLabel).
	Label string
	// TaskID names the head's task, and Queue the queue that holds it
	// or, when none does, the first it may be in (see
	// RunnerConfig.Locate): both "" when the label names no task.
	Queue, TaskID string
	// State is the task's asynq state ("pending", "retry", ...), "missing"
	// when asynq has no such task.
	State string
	// Retried and LastErr are the task's failures so far and its last
	// error, LastFailedAt when it failed last; MaxRetry is the retries
	// asynq allows it.
	Retried, MaxRetry int
	LastErr           string
	LastFailedAt      time.Time
	// NextRunAt is when asynq runs the task next: for a task in the
	// retry or scheduled set, when it leaves it.
	NextRunAt time.Time
	// Type and Payload are the task's type and payload: "" and nil when
	// State is StateMissing.
	Type    string
	Payload []byte
	// Since is when the position was handed out, and RetryAt, when its
	// task said so after a failure, when it runs again.
	Since, RetryAt time.Time
	// Held is the key's hold, nil when it is not on hold.
	Held *Pause
	// Waiting counts the positions waiting, the head included.
	Waiting int64

	record string // the position's record, which a skip checks
}

// StateMissing is [Head].State for a head whose task asynq does not have.
const StateMissing = "missing"

// Head reads the head of key's sequence and its task. It returns an error
// matching [ErrNothingToDo] when nothing of key waits.
func (r *Runner) Head(ctx context.Context, key string) (Head, error) {
	st, err := r.headSeq.Status(ctx, key)
	if err != nil {
		return Head{}, err
	}
	h := Head{Key: key, Held: st.Paused, Waiting: st.Waiting}
	if !headOf(st, &h) {
		return h, fmt.Errorf("%w: nothing of %s waits", ErrNothingToDo, key)
	}
	switch _, err := r.tasks.look(ctx, &h, true); {
	case errors.Is(err, errNoTask):
		h.State = StateMissing
	case err != nil:
		return h, fmt.Errorf("keyorder: %s's head: %w", key, err)
	}
	return h, nil
}

// Hold puts key on hold: tasks of key are still accepted, and none runs
// until [Runner.Resume]. by and reason are recorded. A held key's sequence
// does not expire. It returns an error matching [ErrNothingToDo] when key
// is on hold already.
//
// by and reason are at most maxReasonLen bytes each, without control or
// format characters: they stay in the key's sequence while it is held.
func (r *Runner) Hold(ctx context.Context, key, by, reason string) error {
	_, err := r.l.Sequencer().Pause(ctx, key, by, reason)
	if errors.Is(err, ErrPaused) {
		return fmt.Errorf("%w: %w", ErrNothingToDo, err)
	}
	return err
}

// Resume ends key's hold and calls its head's task back. It returns an
// error matching [ErrNothingToDo] when key is not on hold, and when it is
// halted ([FailureHalt]) with its head's task archived: resuming would
// only halt it again; retry the head ([Runner.Retry]) or skip it
// ([Runner.Skip]). A halted key whose head's task runs again (moved by
// hand out of the archive) resumes.
func (r *Runner) Resume(ctx context.Context, key string) error {
	if h, err := r.Head(ctx, key); err == nil && h.Held != nil && h.Held.Halted != "" && h.State == asynq.TaskStateArchived.String() {
		return fmt.Errorf("%w: %s is halted by its head's failure (%s): retry the head or skip it", ErrNothingToDo, key, h.Held.Reason)
	}
	_, st, err := r.l.Sequencer().Resume(ctx, key)
	if errors.Is(err, ErrNotPaused) {
		return fmt.Errorf("%w: %w", ErrNothingToDo, err)
	}
	if err != nil {
		return err
	}
	return r.Wake(ctx, key, st.Wake)
}

// Retry runs the head's task of key now, when it backs off after a
// failure (or runs only later), or, for a key halted by its head's failure
// ([FailureHalt]), runs the archived task again in its place and ends the
// halt. It returns an error matching [ErrNothingToDo] when the key is on
// hold, the task is due or running already, or will never run again
// (skip it instead).
func (r *Runner) Retry(ctx context.Context, key string) error {
	h, err := r.Head(ctx, key)
	if err != nil {
		return err
	}
	err = r.RetryHead(ctx, h)
	if err != nil && !errors.Is(err, ErrNothingToDo) && ctx.Err() == nil {
		return fmt.Errorf("%w: the head's task %s could not be run now (it may have started meanwhile): %w", ErrNothingToDo, h.TaskID, err)
	}
	return err
}

// RetryHead runs the task of h, a head as [Runner.Head] read it, now, with
// asynq's Inspector.RunTask (which moves a task of the retry or scheduled
// set to pending, and refuses any other atomically). It is [Runner.Retry]
// for a caller that read and checked the head itself: it runs h's task,
// whatever the head is now.
//
// A halted key's head ([Pause].Halted: h.Held names h's position) is run
// again in its place: its archived task is moved to pending first, then
// the halt ends (the task, parked meanwhile by the halt, is called back);
// a crash between the two leaves the key halted, its task waiting, and
// the action can be repeated. The task runs with the failures it had: one
// more failure past its budget halts the key again.
//
// It returns an error matching [ErrNothingToDo], and runs nothing, when h
// is on hold or its task neither backs off nor is scheduled (nor, halted,
// archived) (as h says), and ctx's error when ctx is done. Otherwise it
// returns RunTask's error as it is: asynq refuses a task that started or
// came due since h was read, and returns an error matching
// asynq.ErrTaskNotFound for one that is gone.
func (r *Runner) RetryHead(ctx context.Context, h Head) error {
	halted := h.Held != nil && h.Held.Halted != "" && h.Held.Halted == h.Label
	switch {
	case h.Held != nil && !halted:
		return fmt.Errorf("%w: %s is on hold: resume it, and its head runs at once", ErrNothingToDo, h.Key)
	case h.State != asynq.TaskStateRetry.String() && h.State != asynq.TaskStateScheduled.String() &&
		(!halted || h.State != asynq.TaskStateArchived.String()):
		return fmt.Errorf("%w: the head's task of %s is %s", ErrNothingToDo, h.Key, h.State)
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	if err := r.insp.RunTask(h.Queue, h.TaskID); err != nil || !halted {
		return err
	}
	return r.endHalt(ctx, h.Key, nil)
}

// endHalt ends key's halt and brings back the parked holders its end
// called, and those of wake.
func (r *Runner) endHalt(ctx context.Context, key string, wake []string) error {
	_, st, err := r.l.Sequencer().Resume(ctx, key)
	if errors.Is(err, ErrNotPaused) || errors.Is(err, ErrPauseIndex) {
		err = nil // ended meanwhile, or ended with the index stale
	}
	if werr := r.Wake(ctx, key, append(wake, st.Wake...)); err == nil {
		err = werr
	}
	return err
}

// Skip gives up the head of key: it archives the head's task with reason
// (unless it is archived, completed or missing already) and passes the
// turn on, so the next task runs; a halt of key by that head ends with it. It refuses, with an error matching
// [ErrNothingToDo] (a *[StateError]), a head whose task runs right now: a
// task is never both run and skipped.
func (r *Runner) Skip(ctx context.Context, key, reason string) error {
	h, err := r.Head(ctx, key)
	if err != nil {
		return err
	}
	sk, err := r.SkipHead(ctx, h, "skipped: "+reason)
	if err != nil {
		return err
	}
	return r.Wake(ctx, key, sk.Wake)
}

// Skipped is what [Runner.SkipHead] did.
type Skipped struct {
	// Archived is true when the skip archived the head's task (it was not
	// missing, archived or completed already).
	Archived bool
	// Done is false when the head had moved on since it was read (someone
	// else settled it, or its task passed its turn on): nothing was
	// skipped then, and a task archived by the skip stays archived.
	Done bool
	// Wake are the labels of the positions whose parked holders the skip
	// called: bring them back with [Runner.Wake].
	Wake []string
}

// SkipHead gives up h, a head as [Runner.Head] read it, with reason as it
// is: the last error of the archived task and the reason of the skip in
// the sequence's log (see [Status].Log). It is [Runner.Skip] for a caller
// that read and checked the head itself, and words the reason itself.
//
// It archives h's task unless h has it missing, archived or completed
// (the archive refuses, atomically, a task that runs: a task is never both
// run and skipped), then skips h's position if it is still the head with
// the same record (see [Sequencer.Skip]). It does not bring the parked
// holders back: pass Skipped.Wake to [Runner.Wake].
//
// It returns a *[StateError] (matching [ErrNothingToDo]), and changes
// nothing, when h has its task active, and when asynq refuses to archive
// the task: it runs (it started since h was read) or waits in a group.
// Other errors are Redis' and asynq's, wrapped.
func (r *Runner) SkipHead(ctx context.Context, h Head, reason string) (Skipped, error) {
	var sk Skipped
	if err := checkReason("the reason", reason); err != nil {
		return sk, err
	}
	switch h.State {
	case StateMissing, asynq.TaskStateArchived.String(), asynq.TaskStateCompleted.String():
	case asynq.TaskStateActive.String():
		return sk, &StateError{Key: h.Key, TaskID: h.TaskID, State: h.State}
	default:
		ok, state, err := asynqwire.Archive(ctx, r.rdb, h.Queue, h.TaskID, reason)
		switch {
		case err != nil:
			return sk, fmt.Errorf("keyorder: archive the head's task %s of %s: %w", h.TaskID, h.Key, err)
		case ok:
			sk.Archived = true
		case state == asynqwire.StateGone, state == asynq.TaskStateArchived.String(), state == asynq.TaskStateCompleted.String():
			// Gone or ended meanwhile: the position is skipped below, or
			// was passed on by the task's run (then nothing is skipped).
		default:
			return sk, &StateError{Key: h.Key, TaskID: h.TaskID, State: state}
		}
	}
	st, err := r.l.Sequencer().Skip(ctx, h.Key, h.Pos, h.record, reason)
	if err != nil {
		return sk, err
	}
	sk.Done, sk.Wake = st.Done, st.Wake
	if sk.Done && h.Held != nil && h.Held.Halted != "" && h.Held.Halted == h.Label {
		// The halt was this head's: it ends with it. A crash before
		// this leaves the key halted with the next task at its head,
		// parked; resuming it goes on.
		_, rs, err := r.l.Sequencer().Resume(ctx, h.Key)
		if err != nil && !errors.Is(err, ErrNotPaused) && !errors.Is(err, ErrPauseIndex) {
			return sk, fmt.Errorf("keyorder: end the halt of %s after its head was skipped: %w", h.Key, err)
		}
		sk.Wake = append(sk.Wake, rs.Wake...)
	}
	return sk, nil
}

// StateError is the error of an action on a key's head that asynq refused
// for the state the head's task was in when the action went to move it,
// which may have changed since the head was read: "active" (it runs right
// now) or "grouped" (it waits in a group to be aggregated). It matches
// [ErrNothingToDo].
type StateError struct {
	Key, TaskID string
	// State is the task's state, as asynq's Redis has it.
	State string
}

func (e *StateError) Error() string {
	if e.State == asynqwire.StateActive {
		return fmt.Sprintf("%v: the head's task %s of %s runs right now", ErrNothingToDo, e.TaskID, e.Key)
	}
	return fmt.Sprintf("%v: the head's task %s of %s is %s: asynq does not let it move", ErrNothingToDo, e.TaskID, e.Key, e.State)
}

// Is reports whether target is ErrNothingToDo.
func (e *StateError) Is(target error) bool { return target == ErrNothingToDo }

// Wake brings the parked tasks of positions of key, given by their labels
// in the order of their positions (a settlement's Wake), to the front of
// their queues, so that they run next rather than after their park delay:
// the first ends up first in line. Each is looked for in the queues
// RunnerConfig.Locate gives; a task still active (on its way to its park)
// is tried again for a moment. A label that names no task, and a task no
// queue holds, are passed over. It returns the first Redis error, after
// trying every label; such a failure only costs the tasks their park
// delay.
func (r *Runner) Wake(ctx context.Context, key string, labels []string) error {
	return r.turns.tasks.Wake(ctx, key, labels)
}

// Sequencer returns the Sequencer of the Runner's keys (its prefix), for
// the reads and records of a program's own actions: [Sequencer.Status],
// [Sequencer.Pause], [Sequencer.Record].
func (r *Runner) Sequencer() *Sequencer { return r.l.Sequencer() }
