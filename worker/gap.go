package worker

import (
	"context"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// headDue is the engine's RunnerConfig.HeadDue, the one thing the order
// domain adds to a head's fate (the engine's gap check: keyorder's
// QueueTasks.HeadTask, which finds a position's task in its placements
// with orderkeys.Locate and its order with orderkeys.OrderNo): the task of an
// order's head, which exists and is due only later (scheduled, or backing
// off), is waited for until it is due, unless it is due further ahead than
// Config.MaxScheduleAhead allows: no producer schedules that far, so it is
// brought forward instead (see Worker.bringForward) rather than hold the
// order until then.
func (w *Worker) headDue(ctx context.Context, orderNo string, te *keyorder.TurnError, info *asynq.TaskInfo) (time.Duration, error) {
	delay := time.Until(info.NextProcessAt)
	if bound := aheadBound(w.cfg, info); delay > bound {
		return 0, w.bringForward(ctx, orderNo, te, info, bound)
	}
	return max(delay, time.Millisecond), nil
}
