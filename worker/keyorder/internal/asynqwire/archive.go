package asynqwire

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

// An operator who skips a change archives its task with a reason, which
// asynq's Inspector.ArchiveTask cannot record: [Archive] archives as it
// does and writes the reason where asynq writes a failed task's last error.
// A head that a Redis user rescheduled far out is brought forward by
// [Forward].

// Archive results, as [Archive] returns them in state when it did not
// archive the task (else the task's state as asynq records it).
const (
	// StateGone is a task that does not exist (never did, deleted, or its
	// retention ended).
	StateGone = ""
	// StateGrouped is a task of an asynq group (aggregating), which
	// [Archive] and [Front] leave alone.
	StateGrouped = "grouped"
)

// archive limits of asynq v0.25.1 (internal/rdb: archivedExpirationInDays,
// maxArchiveSize): what its archive scripts trim the archived set to.
const (
	archiveKeepFor = 90 * 24 * time.Hour
	archiveMaxSize = 10000
)

// archiveScript archives a pending, scheduled or retry task as asynq's
// Inspector.ArchiveTask does (rdb.ArchiveTask's archiveTaskCmd), and also
// replaces its message with one that carries the archive's reason, only if
// the message is still the one the caller read (the reason was written
// into that one): a run that ended meanwhile rewrote it.
//
// KEYS[1] asynq:{q}:t:<id>, KEYS[2] asynq:{q}:archived, KEYS[3]
// asynq:{q}:pending, KEYS[4] asynq:{q}:scheduled, KEYS[5] asynq:{q}:retry
// ARGV[1] task ID, ARGV[2] the message as read, ARGV[3] the message with
// the reason, ARGV[4] now in Unix seconds, ARGV[5] the cutoff (Unix
// seconds) and ARGV[6] the size asynq trims the archive to
//
// Returns "ok" when it archived the task; "changed" when the message is not ARGV[2]; or the
// state of a task left alone ("" for none, "grouped", "active",
// "archived", "completed", or a state whose set did not hold the task).
var archiveScript = redis.NewScript(`
local st, g, msg = unpack(redis.call('HMGET', KEYS[1], 'state', 'group', 'msg'))
if not st then return '' end
if g and g ~= '' then return 'grouped' end
local from
if st == 'pending' then from = KEYS[3]
elseif st == 'scheduled' then from = KEYS[4]
elseif st == 'retry' then from = KEYS[5]
else return st end
if msg ~= ARGV[2] then return 'changed' end
local n
if st == 'pending' then n = redis.call('LREM', from, 1, ARGV[1]) else n = redis.call('ZREM', from, ARGV[1]) end
if n == 0 then return st end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'archived', 'msg', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[6]))
return 'ok'
`)

// archiveAttempts bounds the reads and archives of [Archive] when the
// task's message changes in between (a run ended): each change needs a
// run, so a few attempts are plenty.
const archiveAttempts = 5

// ErrArchiveRaced is returned by [Archive] when the task's message changed
// between each read and its archive archiveAttempts times in a row.
var ErrArchiveRaced = errors.New("asynqwire: the task changed during each attempt to archive it")

// Archive archives task id of queue when it is pending, scheduled or in
// the retry set, as asynq v0.25.1's Inspector.ArchiveTask does (atomically:
// an active task is never archived), with reason as its last error
// (error_msg, which the Inspector reports as TaskInfo.LastErr and asynqmon
// shows) and now as its last failure (last_failed_at); the rest of its
// message, its retry count included, is kept. A task in any other state is
// left alone: Archive then returns false and that state ("active",
// "archived", "completed", [StateGrouped], or [StateGone] for no task).
// Unlike the Inspector it does not ask asynq's set of queues first.
//
// It costs two round trips (a read of the message, then the script), more
// when a run of the task ends in between; it returns [ErrArchiveRaced]
// when that happens every time, or a wrapped Redis error. It is safe for
// concurrent use.
func Archive(ctx context.Context, rdb redis.Cmdable, queue, id, reason string) (archived bool, state string, err error) {
	keys := []string{TaskKey(queue, id), ArchivedKey(queue), PendingKey(queue), ScheduledKey(queue), RetryKey(queue)}
	for range archiveAttempts {
		msg, err := rdb.HGet(ctx, TaskKey(queue, id), "msg").Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			return false, StateGone, nil
		case err != nil:
			return false, "", fmt.Errorf("asynqwire: archive %s in %s: read its message: %w", id, queue, err)
		}
		now := time.Now()
		res, err := archiveScript.Run(ctx, rdb, keys, id, msg, withLastError(msg, reason, now),
			now.Unix(), now.Add(-archiveKeepFor).Unix(), archiveMaxSize).Text()
		if err != nil {
			return false, "", fmt.Errorf("asynqwire: archive %s in %s: %w", id, queue, err)
		}
		switch res {
		case "ok":
			return true, "archived", nil
		case "changed":
			continue
		}
		return false, res, nil
	}
	return false, "", fmt.Errorf("%w: %s in %s", ErrArchiveRaced, id, queue)
}

// withLastError returns asynq's task message b with error_msg (field 7)
// set to reason and last_failed_at (field 11) to at, in Unix seconds, as
// asynq's processor records a failure: every other field is copied as it
// is (see rewrite).
func withLastError(b []byte, reason string, at time.Time) []byte {
	return rewrite(b, map[protowire.Number]any{7: reason, 11: at.Unix()})
}

// forwardScript moves a task from the scheduled or the retry set to the
// front of the pending list, as asynq's forwarder moves a due one (but
// first in line: RPUSH).
//
// KEYS[1] asynq:{q}:t:<id>, KEYS[2] asynq:{q}:pending, KEYS[3]
// asynq:{q}:scheduled, KEYS[4] asynq:{q}:retry
// ARGV[1] task ID, ARGV[2] now in ns
//
// Returns "moved", or the state of a task left alone ("" for none,
// "grouped", or any state but scheduled and retry).
var forwardScript = redis.NewScript(`
local st, g = unpack(redis.call('HMGET', KEYS[1], 'state', 'group'))
if not st then return '' end
if g and g ~= '' then return 'grouped' end
local from
if st == 'scheduled' then from = KEYS[3] elseif st == 'retry' then from = KEYS[4] else return st end
if redis.call('ZREM', from, ARGV[1]) == 0 then return st end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[2])
return 'moved'
`)

// Forward moves task id of queue from asynq's scheduled set or retry set
// to the front of its pending list, so that a worker takes it next, as if
// it were due now; it counts no retry. [Front] leaves a scheduled task
// alone (its schedule is meant); Forward is for one whose schedule is not
// to be kept. A task in any other state is left alone: Forward then
// returns false and that state (as [Front] reports it). It costs one round
// trip and is safe for concurrent use.
func Forward(ctx context.Context, rdb redis.Scripter, queue, id string) (moved bool, state string, err error) {
	res, err := forwardScript.Run(ctx, rdb, []string{TaskKey(queue, id), PendingKey(queue), ScheduledKey(queue), RetryKey(queue)},
		id, strconv.FormatInt(time.Now().UnixNano(), 10)).Text()
	if err != nil {
		return false, "", fmt.Errorf("asynqwire: forward %s in %s: %w", id, queue, err)
	}
	return res == "moved", res, nil
}
