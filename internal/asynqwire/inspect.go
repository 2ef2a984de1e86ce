package asynqwire

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// TaskInfo reads task id of queue with asynq's Inspector, as
// insp.GetTaskInfo does, except that a task that exists is never taken for
// gone. The Inspector answers asynq.ErrQueueNotFound for every task of a
// queue missing from [AllQueues], which a failover can lose while the
// queue's tasks stay (asynq's Client adds a queue to it once per process).
// On that answer TaskInfo looks for the task's hash ([TaskKey]); when it
// exists, TaskInfo lists the queue again, as an enqueue would, reports
// relisted true and reads once more. When it does not, it returns the
// Inspector's ErrQueueNotFound.
//
// It returns what the Inspector returns (asynq.ErrTaskNotFound,
// asynq.ErrQueueNotFound, ...) or, wrapped, a Redis error of the look or
// the listing. It costs one Inspector read, plus two round trips and a
// second read for an unlisted queue. It is safe for concurrent use.
func TaskInfo(ctx context.Context, insp *asynq.Inspector, rdb redis.Cmdable, queue, id string) (info *asynq.TaskInfo, relisted bool, err error) {
	info, err = insp.GetTaskInfo(queue, id)
	if !errors.Is(err, asynq.ErrQueueNotFound) {
		return info, false, err
	}
	n, xerr := rdb.Exists(ctx, TaskKey(queue, id)).Result()
	switch {
	case xerr != nil:
		return nil, false, fmt.Errorf("asynqwire: look for task %s of unlisted queue %s: %w", id, queue, xerr)
	case n == 0:
		return nil, false, err
	}
	if xerr := rdb.SAdd(ctx, AllQueues, queue).Err(); xerr != nil {
		return nil, false, fmt.Errorf("asynqwire: list queue %s again for its task %s: %w", queue, id, xerr)
	}
	info, err = insp.GetTaskInfo(queue, id)
	return info, true, err
}
