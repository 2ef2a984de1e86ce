package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// queueTasksConfig tunes a queueTasks. Key is required; the rest
// defaults.
type queueTasksConfig struct {
	// Key returns the key of a task (see [RunnerConfig].Key). The fate of a
	// head reads it to tell a task of the key that holds another position
	// (a duplicate whose void was lost: the position is a gap) from a task
	// of another key that linked the position ([AtOnce].Link: it comes).
	Key func(*asynq.Task) (string, error)
	// Locate returns where the task of a position waits, given its label
	// (see [RunnerConfig].Locate). Defaults to reading a [Client]'s label.
	Locate Locate
	// Logger receives a warning for each queue that asynq's set of queues
	// had lost while a head's task in it existed (a failover), which a
	// read of the head lists again (queueTasks.HeadTask, and a Runner's
	// [Runner.Head]). Defaults to discarding.
	Logger *slog.Logger
	// KeyField names the key in those log lines. Defaults to "key".
	KeyField string
}

// queueTasks is the engine's taskSource for tasks that wait in asynq's
// queues, where their positions' labels say (Locate): it brings parked
// tasks back to the front of their queues, and tells the fate of a head
// that waited for its task longer than the GapWait. A [Runner]'s Turns
// ask the Runner's; a program that takes turns with turns itself (the
// order domain's worker does) builds one, and wraps its HeadFate when it
// has more to do with a head's task (queueTasks.HeadTask).
//
// A queueTasks is safe for concurrent use. It starts no goroutine and
// owns no connection: rdb stays the caller's to close.
type queueTasks struct {
	rdb  redis.UniversalClient
	insp *asynq.Inspector
	cfg  queueTasksConfig
}

var _ taskSource = (*queueTasks)(nil)

// newQueueTasks returns the queueTasks of the tasks on rdb. It returns an
// error when rdb or cfg.Key is nil.
func newQueueTasks(rdb redis.UniversalClient, cfg queueTasksConfig) (*queueTasks, error) {
	if rdb == nil || cfg.Key == nil {
		return nil, errors.New("keyorder: NewQueueTasks needs a Redis client and QueueTasksConfig.Key")
	}
	if cfg.Locate == nil {
		cfg.Locate = clientLabel
	}
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	cfg.KeyField = cmp.Or(cfg.KeyField, "key")
	return &queueTasks{rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), cfg: cfg}, nil
}

// Wake brings the parked tasks of labels (positions of key, in the order
// of their positions) to the front of their queues, as [Wake] does.
func (q *queueTasks) Wake(ctx context.Context, key string, labels []string) error {
	return moveLabels(ctx, q.rdb, q.cfg.Locate, key, labels, asynqwire.FrontInTransit)
}

// HeadFate says why te's head of key's sequence, which waited for its
// task longer than the GapWait, will never take its turn (see
// queueTasks.HeadTask); "" when it will, with the delay until it runs
// when it runs only later (scheduled, or backing off).
func (q *queueTasks) HeadFate(ctx context.Context, key string, te *TurnError) (why string, delay time.Duration, err error) {
	why, info, err := q.HeadTask(ctx, key, te)
	if err != nil || why != "" {
		return why, 0, err
	}
	if _, later := taskFate(info); later {
		return "", max(time.Until(info.NextProcessAt), time.Millisecond), nil
	}
	return "", 0, nil
}

// HeadTask reads the task that holds te's head of key's sequence, in the
// queues te.Label's Locate gives, and says why the position will never
// take its turn: its label names no task; no queue holds the task (never
// enqueued, refused, or deleted); the task is a task of key that holds
// another position (refused as a duplicate, and the void was lost); it
// was archived; it completed without passing its turn on. why is "" when
// it will come, and info is then the task as read. A task of a queue that
// asynq's set of queues lost (a failover) lists its queue again, with a
// warning. It returns an error, wrapped, when a task cannot be read.
func (q *queueTasks) HeadTask(ctx context.Context, key string, te *TurnError) (why string, info *asynq.TaskInfo, err error) {
	h := Head{Key: key, Label: te.Label}
	info, err = q.look(ctx, &h, true)
	switch {
	case errors.Is(err, errNoTask):
		return namesNoTask(te.Label), nil, nil
	case err != nil:
		return "", nil, fmt.Errorf("read the task of position %d: %w", te.Head, err)
	}
	return q.fate(key, te.Head, te.Label, info), info, nil
}

// headEnded says why te's head of key will never take its turn when its
// task has ended (completed, archived, or holding another position of
// key); "" when it has not, and when no queue holds it. It only reads
// (see look). Turns.Take asks it, with no GapWait, to skip a head whose
// turn's end a failover lost.
func (q *queueTasks) headEnded(ctx context.Context, key string, te *TurnError) (string, error) {
	h := Head{Key: key, Label: te.Label}
	info, err := q.look(ctx, &h, false)
	switch {
	case errors.Is(err, errNoTask) || (err == nil && info == nil):
		return "", nil // HeadFate's after GapWait
	case err != nil:
		return "", fmt.Errorf("read the task of position %d: %w", te.Head, err)
	}
	return q.fate(key, te.Head, te.Label, info), nil
}

// errNoTask is look's error for a label that names no task.
var errNoTask = errors.New("keyorder: the label names no task")

// namesNoTask is the fate of a position whose label names no task.
func namesNoTask(label string) string { return fmt.Sprintf("its label %q names no task", clip(label)) }

// look reads the task of h's position and fills h with it; it returns nil
// info when no queue holds it (h.State is then [StateMissing]), errNoTask
// when the label names no task, and an error for a task it cannot read.
// With relist, a task of a queue that asynq's set of queues lost (a
// failover) lists its queue again (asynqwire.TaskInfo), with a warning;
// without, it only reads, and such a task is an error
// (asynqwire.LookTaskInfo).
func (q *queueTasks) look(ctx context.Context, h *Head, relist bool) (*asynq.TaskInfo, error) {
	queues, id, ok := q.cfg.Locate(h.Key, h.Label)
	if !ok || len(queues) == 0 {
		return nil, errNoTask
	}
	h.TaskID, h.Queue, h.State = id, queues[0], StateMissing
	for _, queue := range queues {
		var info *asynq.TaskInfo
		var err error
		if relist {
			var relisted bool
			info, relisted, err = asynqwire.TaskInfo(ctx, q.insp, q.rdb, queue, id)
			if relisted {
				tracing.Slog(ctx, q.cfg.Logger).Warn("queue was missing from asynq's set of queues while its tasks exist; listed it again",
					slog.String(q.cfg.KeyField, h.Key), slog.String("queue", queue), slog.String("task_id", id))
			}
		} else {
			info, err = asynqwire.LookTaskInfo(ctx, q.insp, q.rdb, queue, id)
		}
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("task %s in %s: %w", id, queue, err)
		}
		h.fill(info)
		return info, nil
	}
	return nil, nil
}

// fate says why the task of key's position pos, reserved under label and
// read as info (nil when no queue holds it), will never take its turn; ""
// when it will. A task whose payload holds another position of key will
// not; one that holds a position of another key (key was its
// [AtOnce].Link) settles key's position from there, and comes.
func (q *queueTasks) fate(key string, pos int64, label string, info *asynq.TaskInfo) string {
	queues, id, _ := q.cfg.Locate(key, label)
	if info == nil {
		return fmt.Sprintf("task %s is not in queue %s: never enqueued, refused, or deleted", id, strings.Join(queues, " or "))
	}
	if p, err := payloadPos(info.Payload); err == nil && p != pos {
		if own, err := q.cfg.Key(asynq.NewTask(info.Type, info.Payload)); err == nil && own == key {
			return fmt.Sprintf("task %s holds position %d, not this one", id, p)
		}
	}
	why, _ := taskFate(info)
	return why
}
