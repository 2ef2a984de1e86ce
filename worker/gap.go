package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/asynqwire"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/worker/keyorder"
	"go.uber.org/zap"
)

// queueTasks is what the Worker's Turns ask of asynq (keyorder.Tasks): the
// fate of a head that waits for its task, and bringing parked tasks back.
type queueTasks struct{ w *Worker }

var _ keyorder.Tasks = queueTasks{}

// Wake brings the parked tasks of order orderNo whose labels a release, a
// skip or a settlement handed back to the front of their queues.
func (q queueTasks) Wake(ctx context.Context, orderNo string, labels []string) error {
	return keyorder.Wake(ctx, q.w.rdb, q.w.locate, orderNo, labels)
}

// HeadFate is the gap check: it looks at the head of an order's sequence,
// which has waited for its task longer than GapWait, and says why it
// should be skipped when its task will never come: asynq has no such task
// (the producer died before enqueueing it, or someone deleted it), the
// task is archived (its work ended without it taking its turn), completed
// (its turn was not passed on: the release that would have done it
// failed), or holds another position (it was refused as a duplicate and
// the void was lost). The task is looked for in each of its placements
// (Config.Shards: its order's shard, and its shards under the counts that
// drain). When the task exists and will run later, it says when; one due
// further ahead than Config.MaxScheduleAhead allows is brought forward
// instead (see Worker.bringForward).
func (q queueTasks) HeadFate(ctx context.Context, orderNo string, te *keyorder.TurnError) (why string, delay time.Duration, err error) {
	return q.w.headFate(ctx, orderNo, te)
}

// taskInfo reads task id of queue with asynqwire.TaskInfo, which never
// takes a task that exists for gone when its queue is missing from asynq's
// set of queues: it lists the queue again, which taskInfo logs.
func (w *Worker) taskInfo(ctx context.Context, queue, id string) (*asynq.TaskInfo, error) {
	info, relisted, err := asynqwire.TaskInfo(ctx, w.insp, w.rdb, queue, id)
	if relisted {
		tracing.Log(ctx, w.log).Warn("queue was missing from asynq's set of queues while its tasks exist; listed it again",
			zap.String("queue", queue), zap.String("task_id", id))
	}
	return info, err
}

// headFate says why the head of te, in order orderNo's sequence, should be
// skipped ("" when it should not), or, when its task exists, how long
// before it runs.
func (w *Worker) headFate(ctx context.Context, orderNo string, te *keyorder.TurnError) (why string, delay time.Duration, err error) {
	typ, eventID, from, ok := w.kinds.ParseLabel(te.Label)
	if !ok {
		return fmt.Sprintf("its label %q names no task", clip(te.Label)), 0, nil
	}
	// A creation's position is held by the exchange, in the queue of the
	// exchanged order.
	creation := from != ""
	queues := w.cfg.Shards.Placements(w.kinds.Of(typ), cmp.Or(from, orderNo))
	var info *asynq.TaskInfo
	for _, q := range queues {
		found, err := w.taskInfo(ctx, q, eventID)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		if err != nil {
			return "", 0, fmt.Errorf("read task %s of position %d in %s: %w", eventID, te.Head, q, err)
		}
		info = found
		break
	}
	if info == nil {
		return fmt.Sprintf("task %s is not in queue %s: never enqueued, refused, or deleted", eventID, strings.Join(queues, " or ")), 0, nil
	}
	if !creation {
		if k := w.kinds.Of(info.Type); k != nil {
			if p, err := k.Parse(info.Payload); err == nil && p.Header().Seq != te.Head {
				return fmt.Sprintf("task %s holds position %d, not this one (this one was refused as a duplicate)", eventID, p.Header().Seq), 0, nil
			}
		}
	}
	why, later := keyorder.TaskFate(info)
	if later {
		delay := time.Until(info.NextProcessAt)
		if bound := aheadBound(w.cfg, info); delay > bound {
			// No producer schedules this far: bring it forward rather
			// than hold the order until then.
			return "", 0, w.bringForward(ctx, orderNo, te, info, bound)
		}
		return "", max(delay, time.Millisecond), nil
	}
	return why, 0, nil // "" for a pending, active or aggregating task: it comes
}
