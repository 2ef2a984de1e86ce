package keyorder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/internal/asynqwire"
)

// The operator's actions on a key, and the blocked-keys read. They act on
// the key's sequence and the asynq task at its head, on a Runner's Redis,
// and are safe for concurrent use with the Runners and each other.

// ErrNothingToDo is matched by the error of an action that does not apply
// to the key as it is: nothing waits, the head's task runs right now, the
// key is (or is not) on hold already. The error says why.
var ErrNothingToDo = errors.New("keyorder: the action does not apply")

// Head is the position at the head of a key's sequence, and its task.
type Head struct {
	Key string
	Pos int64
	// TaskID names the head's task, and Queue the queue that holds it
	// (see RunnerConfig.Locate): "" when the label names no task, and
	// Queue "" when no queue holds it.
	Queue, TaskID string
	// State is the task's asynq state ("pending", "retry", ...), "missing"
	// when asynq has no such task.
	State string
	// Retried and LastErr are the task's failures so far and its last
	// error.
	Retried int
	LastErr string
	// Since is when the position was handed out.
	Since time.Time
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
	st, err := r.l.Sequencer().Status(ctx, key)
	if err != nil {
		return Head{}, err
	}
	h := Head{Key: key, Held: st.Paused, Waiting: st.Waiting}
	if !st.Exists || st.Waiting == 0 || len(st.Pending) == 0 || st.Pending[0].Pos != st.Done+1 || st.Pending[0].Label == "" {
		return h, fmt.Errorf("%w: nothing of %s waits", ErrNothingToDo, key)
	}
	p := st.Pending[0]
	h.Pos, h.Since, h.record = p.Pos, p.Reserved, p.Record
	queue, id, info, err := r.find(ctx, key, p.Label)
	h.Queue, h.TaskID = queue, id
	switch {
	case errors.Is(err, errNoTask), errors.Is(err, asynq.ErrTaskNotFound):
		h.State = StateMissing
	case err != nil:
		return h, fmt.Errorf("keyorder: task %s of %s's head: %w", id, key, err)
	default:
		h.State, h.Retried, h.LastErr = info.State.String(), info.Retried, info.LastErr
	}
	return h, nil
}

// Hold puts key on hold: tasks of key are still accepted, and none runs
// until [Runner.Resume]. by and reason are recorded. A held key's sequence
// does not expire. It returns an error matching [ErrNothingToDo] when key
// is on hold already.
func (r *Runner) Hold(ctx context.Context, key, by, reason string) error {
	_, err := r.l.Sequencer().Pause(ctx, key, by, reason)
	if errors.Is(err, ErrPaused) {
		return fmt.Errorf("%w: %w", ErrNothingToDo, err)
	}
	return err
}

// Resume ends key's hold and calls its head's task back. It returns an
// error matching [ErrNothingToDo] when key is not on hold.
func (r *Runner) Resume(ctx context.Context, key string) error {
	_, st, err := r.l.Sequencer().Resume(ctx, key)
	if errors.Is(err, ErrNotPaused) {
		return fmt.Errorf("%w: %w", ErrNothingToDo, err)
	}
	if err != nil {
		return err
	}
	return r.turns.tasks.Wake(ctx, key, st.Wake)
}

// Retry runs the head's task of key now, when it backs off after a
// failure (or runs only later). It returns an error matching
// [ErrNothingToDo] when the key is on hold, the task is due or running
// already, or will never run again (skip it instead).
func (r *Runner) Retry(ctx context.Context, key string) error {
	h, err := r.Head(ctx, key)
	switch {
	case err != nil:
		return err
	case h.Held != nil:
		return fmt.Errorf("%w: %s is on hold: resume it, and its head runs at once", ErrNothingToDo, key)
	case h.State != asynq.TaskStateRetry.String() && h.State != asynq.TaskStateScheduled.String():
		return fmt.Errorf("%w: the head's task of %s is %s", ErrNothingToDo, key, h.State)
	}
	if err := r.insp.RunTask(h.Queue, h.TaskID); err != nil {
		return fmt.Errorf("%w: the head's task %s could not be run now (it may have started meanwhile): %w", ErrNothingToDo, h.TaskID, err)
	}
	return nil
}

// Skip gives up the head of key: it archives the head's task with reason
// (unless it is archived, completed or missing already) and passes the
// turn on, so the next task runs. It refuses, with an error matching
// [ErrNothingToDo], a head whose task runs right now: a task is never both
// run and skipped.
func (r *Runner) Skip(ctx context.Context, key, reason string) error {
	h, err := r.Head(ctx, key)
	if err != nil {
		return err
	}
	switch h.State {
	case StateMissing, asynq.TaskStateArchived.String(), asynq.TaskStateCompleted.String():
	case asynq.TaskStateActive.String():
		return fmt.Errorf("%w: the head's task %s of %s runs right now", ErrNothingToDo, h.TaskID, key)
	default:
		ok, state, err := asynqwire.Archive(ctx, r.rdb, h.Queue, h.TaskID, "skipped: "+reason)
		switch {
		case err != nil:
			return fmt.Errorf("keyorder: archive the head's task %s of %s: %w", h.TaskID, key, err)
		case !ok && state == asynqwire.StateActive:
			return fmt.Errorf("%w: the head's task %s of %s started meanwhile", ErrNothingToDo, h.TaskID, key)
		}
	}
	st, err := r.l.Sequencer().Skip(ctx, key, h.Pos, h.record, "skipped: "+reason)
	if err != nil {
		return err
	}
	return r.turns.tasks.Wake(ctx, key, st.Wake)
}

// Blocked is a key whose head has not moved: on hold, failing (its task
// backs off after failures), or waiting for a task that will not come
// (missing, archived: the Runners skip it after their GapWait).
type Blocked struct {
	Head
	// Reason is "held", "failing" or "gap".
	Reason string
}

// Blocked lists the blocked keys found in the retry sets of queues (where
// the tasks behind a head that does not move wait parked, and a failing
// head backs off) and among the keys on hold, at most limit tasks read per
// queue. It never scans the keyspace: its cost is that of the tasks
// waiting in those sets. A key whose head waits for a task that will not
// come, with nothing behind it, is not listed. The keys come oldest head
// first. It returns an error for a limit below 1, and Redis errors,
// wrapped.
func (r *Runner) Blocked(ctx context.Context, queues []string, limit int64) ([]Blocked, error) {
	keys := map[string]bool{}
	var order []string
	add := func(k string) {
		if !keys[k] {
			keys[k] = true
			order = append(order, k)
		}
	}
	held, err := r.l.Sequencer().PausedKeys(ctx, 0, limit)
	if err != nil {
		return nil, err
	}
	for _, p := range held {
		add(p.Key)
	}
	waiting, _, err := asynqwire.SetTasks(ctx, r.rdb, asynqwire.SetRetry, queues, limit)
	if err != nil {
		return nil, err
	}
	for _, t := range waiting {
		if t.Payload == nil {
			continue
		}
		if k, err := r.cfg.Key(asynq.NewTask(t.Type, t.Payload)); err == nil && checkKey(k, "") == nil {
			add(k)
		}
	}
	var out []Blocked
	for _, k := range order {
		h, err := r.Head(ctx, k)
		if errors.Is(err, ErrNothingToDo) {
			continue
		}
		if err != nil {
			return nil, err
		}
		switch {
		case h.Held != nil:
			out = append(out, Blocked{Head: h, Reason: "held"})
		case h.State == asynq.TaskStateRetry.String() && h.Retried > 0:
			out = append(out, Blocked{Head: h, Reason: "failing"})
		case h.State == StateMissing || h.State == asynq.TaskStateArchived.String() || h.State == asynq.TaskStateCompleted.String():
			out = append(out, Blocked{Head: h, Reason: "gap"})
		}
	}
	slices.SortStableFunc(out, func(a, b Blocked) int { return a.Since.Compare(b.Since) })
	return out, nil
}
