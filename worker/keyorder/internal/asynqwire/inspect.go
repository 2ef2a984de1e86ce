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

// ErrQueueUnlisted is matched by the error of [LookTaskInfo] for a task
// that exists in a queue missing from [AllQueues]: asynq's Inspector
// cannot read it, yet it is not gone. A worker's gap check ([TaskInfo])
// or the next enqueue into the queue lists it again.
var ErrQueueUnlisted = errors.New("asynqwire: the task's queue is missing from asynq's set of queues")

// LookTaskInfo reads task id of queue with asynq's Inspector, as [TaskInfo]
// does, but only reads, for a Redis user that may not write AllQueues (the
// read-only dashboard's). Where the Inspector answers
// asynq.ErrQueueNotFound, it looks for the task's hash ([TaskKey]): when
// there is none, there is no task, and it returns an error matching
// asynq.ErrTaskNotFound; when there is one, it returns an error matching
// [ErrQueueUnlisted], never "no task". So a caller needs to tell only
// asynq.ErrTaskNotFound ("no such task") from the other errors, which it
// returns as the Inspector does, or wrapped for the look. It costs one
// Inspector read, plus one round trip for an unlisted queue. It is safe
// for concurrent use.
func LookTaskInfo(ctx context.Context, insp *asynq.Inspector, rdb redis.Cmdable, queue, id string) (*asynq.TaskInfo, error) {
	info, err := insp.GetTaskInfo(queue, id)
	if !errors.Is(err, asynq.ErrQueueNotFound) {
		return info, err
	}
	n, xerr := rdb.Exists(ctx, TaskKey(queue, id)).Result()
	switch {
	case xerr != nil:
		return nil, fmt.Errorf("asynqwire: look for task %s of unlisted queue %s: %w", id, queue, xerr)
	case n == 0:
		return nil, fmt.Errorf("asynqwire: task %s of unlisted queue %s: %w", id, queue, asynq.ErrTaskNotFound)
	}
	return nil, fmt.Errorf("asynqwire: task %s exists in queue %s: %w", id, queue, ErrQueueUnlisted)
}

// TaskQueues returns those of queues that hold task id (whose hash
// [TaskKey] exists), in the order given, with one pipelined EXISTS per
// queue: one round trip (on a Cluster, one per master). It only reads. It
// is for a task whose queue is not known, such as the holder of a lock,
// known by its ID. It returns a wrapped Redis error. It is safe for
// concurrent use.
func TaskQueues(ctx context.Context, rdb redis.Cmdable, queues []string, id string) ([]string, error) {
	exists := make([]*redis.IntCmd, len(queues))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			exists[i] = p.Exists(ctx, TaskKey(q, id))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("asynqwire: look for task %s: %w", id, err)
	}
	var out []string
	for i, q := range queues {
		if exists[i].Val() > 0 {
			out = append(out, q)
		}
	}
	return out, nil
}
