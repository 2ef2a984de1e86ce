package worker

import (
	"context"
	"errors"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
)

// The worker's own reasons to archive a task, matched with errors.Is by
// archiveReason. They are attached with tag, so they add nothing to the
// error's text (the text is what asynq keeps as the task's last error).
var (
	errUnknownType    = errors.New("worker: unknown task type")
	errMisplaced      = errors.New("worker: task on a queue outside its placements")
	errTaskIDMismatch = errors.New("worker: task ID is not the event ID")
)

// tagged is an error that also matches a sentinel which classifies it;
// its text is the error's alone.
type tagged struct {
	error
	sentinel error
}

func (e *tagged) Unwrap() []error { return []error{e.error, e.sentinel} }

// tag returns err, also matching sentinel with errors.Is.
func tag(err, sentinel error) error { return &tagged{error: err, sentinel: sentinel} }

// The reason label of orderworker_changes_archived_total: a fixed set.
const (
	reasonInvalidPayload   = "invalid_payload"   // the payload breaks the contract (tasks.ErrInvalid)
	reasonUnknownType      = "unknown_type"      // a type outside the Worker's kinds
	reasonMisplaced        = "misplaced"         // on a queue that is none of its placements (another kind's, another shard's)
	reasonTaskIDMismatch   = "task_id_mismatch"  // its task ID is not its event ID
	reasonBadPosition      = "bad_position"      // a seq its order's sequence never handed out to it (keyorder.ErrBadPosition)
	reasonOutOfBudget      = "out_of_budget"     // it failed more times than its failure budget
	reasonRetriesExhausted = "retries_exhausted" // asynq's MaxRetry reached on an error that is not a rejection (a task enqueued against tasks.MaxRetry's rule, a deadline)
	reasonNotFound         = "not_found"         // the store: no such order (orders.ErrNotFound)
	reasonClosed           = "closed"            // the store: the order is exchanged or cancelled (orders.ErrClosed)
	reasonPassed           = "passed"            // the store: the order is past this position (orders.ErrPassed)
	reasonConflict         = "conflict"          // the store: the write contradicts what it holds (orders.ErrConflict)
	reasonStoreRefused     = "store_refused"     // the store: any other permanent refusal (orders.ErrInvalid, orders.ErrNoFence)
	reasonOther            = "other"             // any other rejection (asynq.SkipRetry from a kind's own Apply)
)

// archiveReasons lists every reason label, for the tests.
var archiveReasons = []string{
	reasonInvalidPayload, reasonUnknownType, reasonMisplaced, reasonTaskIDMismatch, reasonBadPosition,
	reasonOutOfBudget, reasonRetriesExhausted, reasonNotFound, reasonClosed, reasonPassed, reasonConflict,
	reasonStoreRefused, reasonOther,
}

// archiveReason classifies the error of an archived task into one of the
// reason labels. The worker's tags come first: out_of_budget wraps the
// last failure, whatever it was.
func archiveReason(err error) string {
	switch {
	case errors.Is(err, keyorder.ErrOutOfBudget):
		return reasonOutOfBudget
	case errors.Is(err, errUnknownType):
		return reasonUnknownType
	case errors.Is(err, errMisplaced):
		return reasonMisplaced
	case errors.Is(err, errTaskIDMismatch):
		return reasonTaskIDMismatch
	case errors.Is(err, tasks.ErrInvalid):
		return reasonInvalidPayload
	case errors.Is(err, keyorder.ErrBadPosition):
		return reasonBadPosition
	case errors.Is(err, orders.ErrNotFound):
		return reasonNotFound
	case errors.Is(err, orders.ErrClosed):
		return reasonClosed
	case errors.Is(err, orders.ErrPassed):
		return reasonPassed
	case errors.Is(err, orders.ErrConflict):
		return reasonConflict
	case errors.Is(err, orders.ErrInvalid), errors.Is(err, orders.ErrNoFence):
		return reasonStoreRefused
	case !errors.Is(err, asynq.SkipRetry):
		return reasonRetriesExhausted
	}
	return reasonOther
}

// countArchived is asynq's ErrorHandler: asynq calls it with the error of
// every failed run, just before it retries or archives the task (errors
// of the handler, and asynq's own: the run's deadline, its lease), with
// the task's metadata in ctx. It counts the changes archived.
func (w *Worker) countArchived(ctx context.Context, t *asynq.Task, err error) {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if !keyorder.Archives(err, retried, maxRetry) {
		return
	}
	w.cfg.Metrics.observeArchived(w.taskTypeLabel(t.Type()), archiveReason(err))
}
