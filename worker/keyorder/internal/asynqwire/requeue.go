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
// An ID whose task hash has no message names no task (a "ghost": the
// intake's Redis user may LPUSH any member into a pending list, and
// asynq's dequeue takes it to the active list with a lease, finds no
// message and reads the queue as empty for one poll). A ghost is never
// brought back, as asynq's own recoverer never brings one back: the
// script removes it from the lease set and the active list, and deletes
// its hash (which has no message, so it is no task's). It also looks at
// the front of the pending list (its right end, where asynq dequeues), in
// pages of 100 IDs, up to ARGV[5] IDs, and removes the ghosts there the
// same way; a page without a ghost ends the look, so that a queue without
// ghosts costs one LRANGE of 100 and 100 HEXISTS. Ghosts further back
// reach the front (or asynq's dequeue) and go at a later call. The
// pending list's real tasks keep their order.
//
// KEYS[1] asynq:{q}:lease, KEYS[2] asynq:{q}:active, KEYS[3] asynq:{q}:pending
// ARGV[1] margin in seconds, ARGV[2] task key prefix, ARGV[3] now in ns,
// ARGV[4] at most this many expired leases, ARGV[5] at most this many IDs
// of the front of the pending list looked at
//
// Returns {moved, ghosts, sample, more}: the IDs moved, how many ghosts
// were removed, up to 10 of their IDs (each cut to 64 bytes), and 1 when
// the look at the pending list stopped at ARGV[5] with ghosts in its last
// page (there may be more at the front), else 0. The cutoff is Redis TIME
// minus the margin: the lease times are the workers' clocks, and the
// margin covers their skew.
var recoverScript = redis.NewScript(`
local cutoff = tonumber(redis.call('TIME')[1]) - tonumber(ARGV[1])
local ids = {}
if tonumber(ARGV[4]) > 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[4]))
end
local moved, ghosts, sample = {}, 0, {}
-- named says whether id's task hash has a message; a key of another type
-- there (which the intake's user may write) names no task either.
local function named(id)
  return redis.pcall('HEXISTS', ARGV[2] .. id, 'msg') == 1
end
local function ghost(id)
  ghosts = ghosts + 1
  if #sample < 10 then sample[#sample + 1] = string.sub(id, 1, 64) end
  redis.call('DEL', ARGV[2] .. id)
end
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  if not named(id) then
    redis.call('LREM', KEYS[2], 0, id)
    ghost(id)
  elseif redis.call('LREM', KEYS[2], 1, id) == 1 then
    redis.call('RPUSH', KEYS[3], id)
    redis.call('HSET', ARGV[2] .. id, 'state', 'pending', 'pending_since', ARGV[3])
    moved[#moved + 1] = id
  end
end
local cap, examined, kept, more = tonumber(ARGV[5]), 0, 0, 0
while examined < cap do
  local n = math.min(100, cap - examined)
  local page = redis.call('LRANGE', KEYS[3], -(kept + n), -(kept + 1))
  if #page == 0 then break end
  examined = examined + #page
  local found = false
  for i = #page, 1, -1 do
    local id = page[i]
    if not named(id) then
      redis.call('LREM', KEYS[3], -1, id)
      ghost(id)
      found = true
    else
      kept = kept + 1
    end
  end
  if not found or #page < n then break end
  if examined >= cap then more = 1 end
end
return {moved, ghosts, sample, more}
`)

// Recovered is what one [Recover] call did.
type Recovered struct {
	// IDs are the tasks brought back to the front of their queue.
	IDs []string
	// Ghosts is how many IDs that name no task (their task hash has no
	// message) were removed: from the lease set and the active list once
	// their lease had expired for the margin, or from the front of the
	// pending list.
	Ghosts int
	// GhostIDs are up to 10 of those IDs, each cut to 64 bytes, for a log
	// line (whoever wrote them chose them).
	GhostIDs []string
}

// Recover brings the tasks of queue whose asynq lease expired more than
// margin ago back to the front of the queue, at most 100 per call, and
// returns their IDs. asynq's own recoverer does the same for a lease
// expired 30 s ago, once a minute per server, and counts it as a failure
// (the worker's IsFailure does not).
//
// An ID that names no task (its task hash has no message: a ghost, which
// a Redis user that may LPUSH into a pending list can write) is never
// brought back. It is removed, with its hash: from the lease set and the
// active list when its lease has expired for margin, and from the front of
// the pending list, where up to 1,000 IDs are looked at per round trip
// (in pages of 100: a page without a ghost ends the look). While the front
// is still full of ghosts, Recover makes another round trip, up to 10 in
// all, so that at most 10,000 are removed per call and a queue without
// ghosts costs one round trip. Recovered counts them. Real tasks keep
// their order. It is safe for concurrent use, by any number of processes.
func Recover(ctx context.Context, rdb redis.Scripter, queue string, margin time.Duration) (Recovered, error) {
	var out Recovered
	leases := 100
	for range 10 {
		res, err := recoverScript.Run(ctx, rdb, []string{LeaseKey(queue), ActiveKey(queue), PendingKey(queue)},
			int64(margin/time.Second), QueueKey(queue)+"t:", strconv.FormatInt(time.Now().UnixNano(), 10), leases, 1000).Slice()
		if err != nil {
			return out, fmt.Errorf("asynqwire: recover %s: %w", queue, err)
		}
		more, err := out.add(res)
		if err != nil {
			return out, fmt.Errorf("asynqwire: recover %s: %w", queue, err)
		}
		if !more {
			break
		}
		leases = 0 // the expired leases were the first round trip's
	}
	return out, nil
}

// add adds the reply of one recoverScript run to r, and returns its more.
func (r *Recovered) add(res []any) (more bool, err error) {
	if len(res) != 4 {
		return false, fmt.Errorf("recover script: %d values, want 4", len(res))
	}
	moved, _ := res[0].([]any)
	for _, id := range moved {
		s, _ := id.(string)
		r.IDs = append(r.IDs, s)
	}
	n, _ := res[1].(int64)
	r.Ghosts += int(n)
	sample, _ := res[2].([]any)
	for _, id := range sample {
		if s, _ := id.(string); len(r.GhostIDs) < 10 {
			r.GhostIDs = append(r.GhostIDs, s)
		}
	}
	m, _ := res[3].(int64)
	return m == 1, nil
}
