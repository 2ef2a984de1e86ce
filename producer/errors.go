package producer

import (
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
)

var (
	// ErrDuplicate is matched by the [*DuplicateError] returned when an event
	// is enqueued while asynq still holds a task with its ID.
	ErrDuplicate = errors.New("producer: duplicate event")

	// ErrPayloadMismatch is matched, besides [ErrDuplicate], by a
	// [*DuplicateError] whose existing task has a different type or payload:
	// the event ID was reused for a different change, which is the caller's
	// bug rather than a harmless retry.
	ErrPayloadMismatch = errors.New("producer: duplicate event with a different payload")

	// ErrInvalidOption is matched by the error returned when an [Option] is
	// misused: an option for exchanges given to a modify, a negative
	// [WithMaxRetry], an empty [WithEventID], or an option that contradicts
	// the payload.
	ErrInvalidOption = errors.New("producer: invalid option")

	// ErrClosed is returned by the enqueue methods after [Producer.Close].
	ErrClosed = errors.New("producer: closed")

	// ErrUnavailable is matched by the error an enqueue returns when Redis
	// failed, or the context ended, before the change was confirmed (a
	// Redis Cluster or Sentinel failover in progress, a node down, a
	// timeout). The change may or may not have been accepted: send it
	// again with the same event ID, which is safe. A change whose task
	// exists is then refused as a duplicate, and one whose task does not
	// is accepted at a new position (the workers skip the old one). The
	// error also matches its cause (context.DeadlineExceeded, a
	// *net.OpError, ...) where the cause's type survived.
	ErrUnavailable = errors.New("producer: Redis unavailable")

	// ErrNotReplicated is matched by the error of an enqueue that the
	// master took but fewer than [Config.WaitReplicas] replicas confirmed
	// in time: a failover could still lose it. The error matches
	// [ErrUnavailable] too; send the change again with the same event ID.
	ErrNotReplicated = errors.New("producer: not confirmed by the replicas")

	// ErrBacklogFull is matched by the error of a change refused because
	// [Config.MaxWaiting] changes of its order wait already. Nothing was
	// written: send it again later, with the same event ID.
	ErrBacklogFull = errors.New("producer: the order's backlog is full")
)

// unavailableError is a Redis or context error of an enqueue: its text is
// the wrapped error's, and it matches [ErrUnavailable] besides that error.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }

// Unwrap returns ErrUnavailable and the wrapped error.
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// DuplicateError reports that an event was not enqueued because asynq still
// holds a task with its task ID in the queue, or because the event ID is
// claimed for another change (see the package documentation for how long).
// It matches [ErrDuplicate] with errors.Is, and also [ErrPayloadMismatch]
// when the existing change is known to differ.
//
// A caller that retries the same event can treat it as success. The HTTP
// intake answers 409 Conflict to a duplicate with the same payload and 422
// Unprocessable Entity to one with a different payload.
type DuplicateError struct {
	// TaskID is the ID of the existing task, equal to EventID.
	TaskID string
	// Queue is the queue that holds it (or held it: with Other set, the
	// task of the other change may be gone).
	Queue string
	// Other, when set, says that the event ID is claimed for another
	// change: which type and order it was first accepted for. Such a
	// duplicate always matches [ErrPayloadMismatch].
	Other *Claim
	// EventID is the duplicated event's ID.
	EventID string
	// Seq is the existing task's position in its order's sequence, when
	// it was read.
	Seq int64
	// SamePayload reports whether the existing task has the same type and
	// the same payload bytes as the refused one (the producer encodes
	// deterministically, so equal payloads have equal bytes). It is
	// meaningful only when LookupErr is nil; otherwise it is false and
	// whether the payloads match is unknown.
	SamePayload bool
	// State is the existing task's state, such as asynq.TaskStatePending or
	// asynq.TaskStateCompleted. It is zero when LookupErr is not nil.
	State asynq.TaskState
	// LookupErr is why the existing task could not be read for comparison,
	// for example because it expired or was deleted in the meantime
	// (asynq.ErrTaskNotFound), Redis failed, or the context was done. It is
	// nil when the comparison was made.
	LookupErr error
}

// Claim says which change an event ID was first accepted for.
type Claim struct {
	// Type is the task type, such as tasks.TypeModify.
	Type string
	// OrderNo is the order.
	OrderNo string
}

// Error describes the duplicate and, when known, whether the payloads differ.
func (e *DuplicateError) Error() string {
	switch {
	case e.Other != nil && e.State != 0:
		return fmt.Sprintf("producer: duplicate event %q for a different change: it was accepted for %s of order %s (task %q in queue %s, %s)",
			e.EventID, e.Other.Type, e.Other.OrderNo, e.TaskID, e.Queue, e.State)
	case e.Other != nil:
		return fmt.Sprintf("producer: duplicate event %q for a different change: it was accepted for %s of order %s",
			e.EventID, e.Other.Type, e.Other.OrderNo)
	case e.LookupErr != nil:
		return fmt.Sprintf("producer: duplicate event %q: task %q already in queue %s (payload not compared: %v)",
			e.EventID, e.TaskID, e.Queue, e.LookupErr)
	case e.SamePayload:
		return fmt.Sprintf("producer: duplicate event %q: task %q already in queue %s (%s)",
			e.EventID, e.TaskID, e.Queue, e.State)
	default:
		return fmt.Sprintf("producer: duplicate event %q with a different payload: task %q already in queue %s (%s)",
			e.EventID, e.TaskID, e.Queue, e.State)
	}
}

// Is reports whether target is [ErrDuplicate], or [ErrPayloadMismatch] when
// the payloads were compared and differ.
func (e *DuplicateError) Is(target error) bool {
	switch target {
	case ErrDuplicate:
		return true
	case ErrPayloadMismatch:
		return e.Other != nil || (e.LookupErr == nil && !e.SamePayload)
	}
	return false
}

// Unwrap returns LookupErr.
func (e *DuplicateError) Unwrap() error { return e.LookupErr }
