package asynqwire

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ProcessedTotalKey returns the Redis key of queue's count of processed
// tasks (a string; asynq's processor INCRs it for every run that ends,
// failed or not).
func ProcessedTotalKey(queue string) string { return QueueKey(queue) + "processed" }

// FailedTotalKey returns the Redis key of queue's count of failed runs.
func FailedTotalKey(queue string) string { return QueueKey(queue) + "failed" }

// QueueStats is one queue's summary, as asynq's Inspector gives it
// (GetQueueInfo), read by [ReadQueueStats] without trusting the members of
// the queue's lists and sets.
type QueueStats struct {
	// Pending, Active, Scheduled, Retry, Archived and Completed are the
	// sizes of the queue's lists and sets, whatever their members are:
	// a member that names no task is counted, as asynq counts it.
	Pending, Active, Scheduled, Retry, Archived, Completed int64
	// ProcessedTotal and FailedTotal are asynq's counters of runs that
	// ended and of runs that failed (0 when unset or not a number).
	ProcessedTotal, FailedTotal int64
	// Paused reports whether the queue is paused ([PausedKey]).
	Paused bool
	// OldestPendingSince is when the oldest pending task became pending:
	// that of the first of the last [latencyLook] IDs of the pending list
	// (its front) that names a task. It is zero when the list is empty or
	// none of those IDs names a task.
	OldestPendingSince time.Time
	// MemoryUsage approximates the bytes of the queue's lists and sets and
	// of their tasks, as asynq's Inspector does: MEMORY USAGE of up to
	// [statsSample] tasks at each list's and set's sampled end, averaged
	// over the tasks that exist and multiplied by the size.
	MemoryUsage int64
	// Ghosts is how many of the sampled members name no task (no task
	// hash, or one without a message).
	Ghosts int
}

// Size returns the tasks in the queue in every state, as asynq's
// QueueInfo.Size does (orderworker uses no asynq groups, whose aggregating
// tasks asynq adds to it).
func (s QueueStats) Size() int64 {
	return s.Pending + s.Active + s.Scheduled + s.Retry + s.Archived + s.Completed
}

// statsSample is how many members of each list and set [ReadQueueStats]
// samples for memory usage, asynq's Inspector's number; latencyLook is
// how many IDs at the front of the pending list it looks at for the oldest
// pending task.
const (
	statsSample = 20
	latencyLook = 16
)

// queueStatsScript reads a queue's summary with a bounded number of
// commands, whatever its lists and sets hold. It does what asynq v0.25.1's
// currentStatsCmd and memoryUsageCmd do, except that a member that names no
// task (which asynq's MEMORY USAGE arithmetic fails on: nil is no number)
// is left out of the sample, and a key of an unexpected type where a task
// hash would be is too. It only reads.
//
// KEYS[1] pending, KEYS[2] active, KEYS[3] scheduled, KEYS[4] retry,
// KEYS[5] archived, KEYS[6] completed, KEYS[7] processed total,
// KEYS[8] failed total, KEYS[9] paused
// ARGV[1] task key prefix, ARGV[2] sample size, ARGV[3] IDs of the front of
// the pending list looked at for the oldest pending task
//
// Returns {pending, active, scheduled, retry, archived, completed,
// processed, failed, paused (0/1), oldest pending_since (Unix ns, as a
// string; "" when unknown), memory usage, ghosts sampled}.
var queueStatsScript = redis.NewScript(`
local prefix, sample, look = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ghosts, memusg = 0, 0
local function named(id)
  return redis.pcall('HEXISTS', prefix .. id, 'msg') == 1
end
local function usage(key)
  local m = redis.pcall('MEMORY', 'USAGE', key)
  if type(m) == 'number' then return m end
  return 0
end
local function add(key, n, ids)
  local total, seen = 0, 0
  for _, id in ipairs(ids) do
    if named(id) then
      total = total + usage(prefix .. id)
      seen = seen + 1
    else
      ghosts = ghosts + 1
    end
  end
  if seen > 0 then memusg = memusg + total / seen * n end
  memusg = memusg + usage(key)
end
local res = {}
for i = 1, 2 do
  local n = redis.call('LLEN', KEYS[i])
  res[i] = n
  if n > 0 then add(KEYS[i], n, redis.call('LRANGE', KEYS[i], 0, sample - 1)) end
end
for i = 3, 6 do
  local n = redis.call('ZCARD', KEYS[i])
  res[i] = n
  if n > 0 then add(KEYS[i], n, redis.call('ZRANGE', KEYS[i], 0, sample - 1)) end
end
for i = 7, 8 do
  local v = redis.pcall('GET', KEYS[i])
  res[i] = math.floor(tonumber(v) or 0)
end
res[9] = redis.call('EXISTS', KEYS[9])
res[10] = ''
if res[1] > 0 then
  local front = redis.call('LRANGE', KEYS[1], -look, -1)
  for i = #front, 1, -1 do
    local since = redis.pcall('HGET', prefix .. front[i], 'pending_since')
    if named(front[i]) and type(since) == 'string' and tonumber(since) then
      res[10] = since
      break
    end
  end
end
res[11] = math.floor(memusg)
res[12] = ghosts
return res
`)

// ReadQueueStats reads queue's summary in one script, of a bounded number
// of commands (about 200 whatever the queue holds), that only reads. Unlike
// asynq's Inspector, one member that names no task (a "ghost", which a
// Redis user that may LPUSH or ZADD into a queue can write) fails nothing:
// it is counted in the sizes, left out of the sample and counted in
// Ghosts. It does not look at asynq's set of queues, so an unlisted queue
// reads as its keys are. It returns a wrapped Redis error (a key of the
// wrong type where a list or set is, for one). It is safe for concurrent
// use.
func ReadQueueStats(ctx context.Context, rdb redis.Scripter, queue string) (QueueStats, error) {
	keys := []string{PendingKey(queue), ActiveKey(queue), ScheduledKey(queue), RetryKey(queue), ArchivedKey(queue),
		CompletedKey(queue), ProcessedTotalKey(queue), FailedTotalKey(queue), PausedKey(queue)}
	res, err := queueStatsScript.Run(ctx, rdb, keys, QueueKey(queue)+"t:", statsSample, latencyLook).Slice()
	if err != nil {
		return QueueStats{}, fmt.Errorf("asynqwire: read the stats of queue %s: %w", queue, err)
	}
	if len(res) != 12 {
		return QueueStats{}, fmt.Errorf("asynqwire: read the stats of queue %s: %d values, want 12", queue, len(res))
	}
	n := func(i int) int64 { v, _ := res[i].(int64); return v }
	s := QueueStats{
		Pending: n(0), Active: n(1), Scheduled: n(2), Retry: n(3), Archived: n(4), Completed: n(5),
		ProcessedTotal: n(6), FailedTotal: n(7), Paused: n(8) == 1, MemoryUsage: n(10), Ghosts: int(n(11)),
	}
	if since, _ := res[9].(string); since != "" {
		if ns, err := strconv.ParseInt(since, 10, 64); err == nil {
			s.OldestPendingSince = time.Unix(0, ns)
		}
	}
	return s, nil
}
