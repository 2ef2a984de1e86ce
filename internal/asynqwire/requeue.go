package asynqwire

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The worker parks a task whose turn has not come in asynq's retry set
// with a long delay; when the turn comes, [Front] brings it to the front
// of its queue. [Recover] brings back the tasks of a worker that died,
// sooner than asynq's own recoverer. Both write asynq's keys as asynq's
// forwarder and recoverer do.

// frontScript moves a task from the retry set, or from anywhere in the
// pending list, to the front of the pending list (asynq dequeues from the
// right: RPUSH puts it first in line).
//
// KEYS[1] asynq:{q}:t:<id>, KEYS[2] asynq:{q}:pending, KEYS[3] asynq:{q}:retry
// ARGV[1] task ID, ARGV[2] now in ns, ARGV[3] "back" to move it to the back
// of the pending list instead (LPUSH: last in line)
//
// Returns "moved", or the task's state ("active", "scheduled", ...; ""
// when there is no such task; "grouped" for a task of a group) when it was
// left alone.
var frontScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
local g = redis.call('HGET', KEYS[1], 'group')
if g and g ~= '' then return 'grouped' end
if st == 'retry' then
  if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return st end
elseif st == 'pending' then
  if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then return st end
else
  return st or ''
end
if ARGV[3] == 'back' then
  redis.call('LPUSH', KEYS[2], ARGV[1])
else
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[2])
return 'moved'
`)

// Front moves task id of queue from asynq's retry set (or from further back
// in its pending list) to the front of the queue, so that a worker takes it
// next. A task in any other state (active, scheduled on purpose, archived,
// completed, gone) is left alone: Front then returns false and that state
// (as asynq records it in the task's hash: [StateActive] for a task being
// run, "" for no such task, "grouped" for a task waiting in a group). It costs one round trip and is safe for concurrent
// use.
func Front(ctx context.Context, rdb redis.Scripter, queue, id string) (moved bool, state string, err error) {
	return move(ctx, rdb, queue, id, "front")
}

// Back is [Front], but it moves the task to the back of its queue: last
// in line, as a new task is. A worker whose hold of a key has used its
// quantum sends the key's next task there, so that the other keys' tasks
// go first.
func Back(ctx context.Context, rdb redis.Scripter, queue, id string) (moved bool, state string, err error) {
	return move(ctx, rdb, queue, id, "back")
}

// InTransit is how long [FrontInTransit] and [BackInTransit] keep trying
// to move a task that is still active: a task is parked by returning from
// its run, and asynq moves it to the retry set just after; the call that
// wakes it may come first.
const InTransit = 250 * time.Millisecond

// FrontInTransit is [Front], tried again with short pauses for up to
// [InTransit] while the task is active. It returns the task's state:
// "moved" when it was moved, "" when the queue has no such task.
func FrontInTransit(ctx context.Context, rdb redis.Scripter, queue, id string) (string, error) {
	return whileActive(ctx, rdb, queue, id, "front")
}

// BackInTransit is [FrontInTransit] with [Back].
func BackInTransit(ctx context.Context, rdb redis.Scripter, queue, id string) (string, error) {
	return whileActive(ctx, rdb, queue, id, "back")
}

func whileActive(ctx context.Context, rdb redis.Scripter, queue, id, where string) (string, error) {
	pause := 5 * time.Millisecond
	deadline := time.Now().Add(InTransit)
	for {
		_, state, err := move(ctx, rdb, queue, id, where)
		if err != nil || state != StateActive || time.Now().After(deadline) {
			return state, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return state, context.Cause(ctx)
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

func move(ctx context.Context, rdb redis.Scripter, queue, id, where string) (moved bool, state string, err error) {
	res, err := frontScript.Run(ctx, rdb, []string{TaskKey(queue, id), PendingKey(queue), RetryKey(queue)},
		id, strconv.FormatInt(time.Now().UnixNano(), 10), where).Text()
	if err != nil {
		return false, "", fmt.Errorf("asynqwire: move %s to the %s of %s: %w", id, where, queue, err)
	}
	return res == "moved", res, nil
}

// recoverScript moves the tasks whose asynq lease expired more than a margin
// ago from the active list to the front of the pending list, without
// counting a failure: their worker died or lost Redis for longer than its
// lease (asynq's processor never writes for a task whose lease it found
// expired, so no late write of the old run can undo this).
//
// KEYS[1] asynq:{q}:lease, KEYS[2] asynq:{q}:active, KEYS[3] asynq:{q}:pending
// ARGV[1] margin in seconds, ARGV[2] task key prefix, ARGV[3] now in ns,
// ARGV[4] at most this many tasks
//
// Returns the IDs moved. The cutoff is Redis TIME minus the margin: the
// lease times are the workers' clocks, and the margin covers their skew.
var recoverScript = redis.NewScript(`
local cutoff = tonumber(redis.call('TIME')[1]) - tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[4]))
local moved = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  if redis.call('LREM', KEYS[2], 1, id) == 1 then
    redis.call('RPUSH', KEYS[3], id)
    redis.call('HSET', ARGV[2] .. id, 'state', 'pending', 'pending_since', ARGV[3])
    moved[#moved + 1] = id
  end
end
return moved
`)

// Recover brings the tasks of queue whose asynq lease expired more than
// margin ago back to the front of the queue, at most 100 per call, and
// returns their IDs. asynq's own recoverer does the same for a lease
// expired 30 s ago, once a minute per server, and counts it as a failure
// (the worker's IsFailure does not). It costs one round trip and is safe
// for concurrent use, by any number of processes.
func Recover(ctx context.Context, rdb redis.Scripter, queue string, margin time.Duration) ([]string, error) {
	ids, err := recoverScript.Run(ctx, rdb, []string{LeaseKey(queue), ActiveKey(queue), PendingKey(queue)},
		int64(margin/time.Second), QueueKey(queue)+"t:", strconv.FormatInt(time.Now().UnixNano(), 10), 100).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("asynqwire: recover %s: %w", queue, err)
	}
	return ids, nil
}
