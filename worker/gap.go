package worker

import (
	"context"
	"time"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// queueTasks is what the Worker's Turns ask of asynq (keyorder.Tasks): the
// engine's (keyorder.QueueTasks, which finds a position's task in its
// placements with orderkeys.Locate and its order with orderkeys.OrderNo),
// with the one thing the order domain adds to a head's fate: a head
// scheduled further ahead than any producer schedules is brought forward.
type queueTasks struct{ w *Worker }

var _ keyorder.Tasks = queueTasks{}

// Wake brings the parked tasks of order orderNo whose labels a release, a
// skip or a settlement handed back to the front of their queues.
func (q queueTasks) Wake(ctx context.Context, orderNo string, labels []string) error {
	return q.w.tasks.Wake(ctx, orderNo, labels)
}

// HeadFate is the gap check: it looks at the head of an order's sequence,
// which has waited for its task longer than GapWait, and says why it
// should be skipped when its task will never come: asynq has no such task
// (the producer died before enqueueing it, or someone deleted it), the
// task is archived (its work ended without it taking its turn), completed
// (its turn was not passed on: the release that would have done it
// failed), or is a change of the order that holds another position (it
// was refused as a duplicate and the void was lost); an exchange that
// holds a creation's position comes (keyorder.QueueTasks.HeadTask). The
// task is looked for in each of its placements (Config.Shards: its
// order's shard, and its shards under the counts that drain; a creation's
// in the exchanged order's). When the task exists and will run later, it
// says when; one due further ahead than Config.MaxScheduleAhead allows is
// brought forward instead (see Worker.bringForward).
func (q queueTasks) HeadFate(ctx context.Context, orderNo string, te *keyorder.TurnError) (why string, delay time.Duration, err error) {
	why, info, err := q.w.tasks.HeadTask(ctx, orderNo, te)
	if err != nil || why != "" {
		return why, 0, err
	}
	if _, later := keyorder.TaskFate(info); later {
		delay := time.Until(info.NextProcessAt)
		if bound := aheadBound(q.w.cfg, info); delay > bound {
			// No producer schedules this far: bring it forward rather
			// than hold the order until then.
			return "", 0, q.w.bringForward(ctx, orderNo, te, info, bound)
		}
		return "", max(delay, time.Millisecond), nil
	}
	return "", 0, nil // a pending, active or aggregating task: it comes
}
