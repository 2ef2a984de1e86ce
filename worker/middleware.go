package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/tasks"
	"go.uber.org/zap"
)

// taskInfo collects what the middleware learns about a task, for its one
// log line (and metrics). It lives in the context for the task's run.
type taskInfo struct {
	orderNo string
	eventID string
	fence   int64
	lock    lock.Stats
	locked  bool
}

type taskInfoKey struct{}

func infoFrom(ctx context.Context) *taskInfo {
	if ti, ok := ctx.Value(taskInfoKey{}).(*taskInfo); ok {
		return ti
	}
	return &taskInfo{} // a handler run outside the Worker's mux
}

// Outcomes of a task run, as logged and counted.
const (
	OutcomeOK       = "ok"       // applied (or replayed: already applied)
	OutcomeBusy     = "busy"     // lock wait deadline; back to the queue, not a failure
	OutcomeRejected = "rejected" // permanent error; the task is archived
	OutcomeLost     = "lost"     // the lease was lost mid-run; retried
	OutcomeError    = "error"    // any other error; retried with backoff
)

// Outcome classifies a handler's error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, lock.ErrBusy):
		return OutcomeBusy
	case errors.Is(err, asynq.SkipRetry):
		return OutcomeRejected
	case errors.Is(err, lock.ErrLost):
		return OutcomeLost
	}
	return OutcomeError
}

// logTasks is the outermost middleware: it writes the one log line of each
// task run, with the order, the event, the fence and the lock wait. Task
// errors are logged here and nowhere else.
func (w *Worker) logTasks(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		w.inflight.Add(1)
		defer w.inflight.Done()
		ti := &taskInfo{}
		ctx = context.WithValue(ctx, taskInfoKey{}, ti)
		start := time.Now()
		err := next.ProcessTask(ctx, t)
		took := time.Since(start)
		w.cfg.Metrics.observeTask(t.Type(), err, took, ti)
		id, _ := asynq.GetTaskID(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		fields := []zap.Field{
			zap.String("task_type", t.Type()),
			zap.String("task_id", id),
			zap.Int("retried", retried),
			zap.String("order_no", ti.orderNo),
			zap.String("event_id", ti.eventID),
			zap.Duration("lock_wait", ti.lock.Waited),
			zap.Int("lock_attempts", ti.lock.Attempts),
			zap.Int("woken_by_notice", ti.lock.WokenByNotice),
			zap.Duration("duration", took),
		}
		if ti.locked {
			fields = append(fields, zap.Int64("fence", ti.fence))
		}
		switch outcome := Outcome(err); outcome {
		case OutcomeOK:
			w.log.Info("task done", fields...)
		case OutcomeBusy:
			w.log.Info("order busy; task back to its queue", append(fields, zap.Error(err))...)
		case OutcomeRejected:
			w.log.Warn("task rejected; archived", append(fields, zap.Error(err))...)
		default:
			w.log.Warn("task failed; will retry", append(fields, zap.String("outcome", outcome), zap.Error(err))...)
		}
		return err
	})
}

// envelope is the part of every order payload the lock needs.
type envelope struct {
	OrderNo string `json:"order_no"`
	EventID string `json:"event_id"`
}

// orderLock runs the handler inside the lock of the task's order, waiting by
// the task type's policy, with the fence in the context for the store. A
// payload without a valid order_no, and a task of an unknown type, are
// archived with the reason (asynq.SkipRetry), never retried.
func (w *Worker) orderLock(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if t.Type() != tasks.TypeModify && t.Type() != tasks.TypeExchange {
			return fmt.Errorf("unknown task type %q: %w", t.Type(), asynq.SkipRetry)
		}
		var env envelope
		if err := json.Unmarshal(t.Payload(), &env); err != nil {
			return fmt.Errorf("%s payload: %v: %w", t.Type(), err, asynq.SkipRetry)
		}
		if !tasks.ValidOrderNo(env.OrderNo) {
			return fmt.Errorf("%s payload: order_no %q: must be 1 to %d of [A-Za-z0-9_-]: %w",
				t.Type(), env.OrderNo, tasks.MaxOrderNoLen, asynq.SkipRetry)
		}
		ti := infoFrom(ctx)
		ti.orderNo, ti.eventID = env.OrderNo, env.EventID
		id, _ := asynq.GetTaskID(ctx)
		meta := t.Type() + " " + id
		if len(meta) > lock.MaxMetaLen { // a hand-enqueued task may have any ID
			meta = meta[:lock.MaxMetaLen]
		}
		return w.lockr.Do(ctx, env.OrderNo, meta, w.policy(t.Type()), func(ctx context.Context, lease *lock.Lease) error {
			ti.locked, ti.fence, ti.lock = true, lease.Fence(), lease.Stats()
			ctx = orders.WithWrite(ctx, orders.Write{
				Fence:        lease.Fence(),
				LockFenceKey: lease.FenceKey(),
				Handoff:      lease.Handoff(), // a Redis store releases with the commit
				Worker:       w.cfg.ID,
				StartedAt:    time.Now(),
			})
			return next.ProcessTask(ctx, t)
		})
	})
}
