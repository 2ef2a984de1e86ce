// Package asynqredis is the engine's read of asynq's queues in Redis, for the
// tools around a program that uses package keyorder: the key names and
// ACL patterns of asynq v0.25.1's queues, the task read that a failover
// does not fool, the dashboards' counts and summaries, and the two moves
// an operator's process makes (bringing a dead worker's tasks back, and a
// task scheduled too far ahead forward).
//
// asynq keeps its Redis layout private (its internal/base and
// internal/rdb); keyorder spells it in one place of its own, checked
// against asynq v0.25.1 (the release go.mod pins; [keyorder.NewClient]
// and [keyorder.NewRunner] refuse a build linked with another one). This
// package is that place's public face: a program reads asynq's data
// through it instead of spelling a key, so that an asynq upgrade is
// checked inside keyorder only. It is not for taking turns or enqueueing
// (package keyorder), nor for what asynq's public Inspector already does
// well.
//
// Every function is safe for concurrent use, starts no goroutine and
// leaves the Redis client to its caller.
package asynqredis

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// AllQueues is "asynq:queues", the Redis set of every queue's name,
// which asynq's Inspector and asynqmon list the queues from.
const AllQueues = asynqwire.AllQueues

// QueueKey returns the prefix of queue's keys, "asynq:{<queue>}:": every
// key of the queue is in the Cluster slot of its hash tag, so a key
// starting with it tells which master holds the queue.
func QueueKey(queue string) string { return asynqwire.QueueKey(queue) }

// TaskKey returns the Redis key of the hash of task id in queue.
func TaskKey(queue, id string) string { return asynqwire.TaskKey(queue, id) }

// PendingKey returns the Redis key of queue's pending list.
func PendingKey(queue string) string { return asynqwire.PendingKey(queue) }

// ActiveKey returns the Redis key of queue's active list.
func ActiveKey(queue string) string { return asynqwire.ActiveKey(queue) }

// LeaseKey returns the Redis key of queue's lease set (active task IDs by
// the Unix time their worker's lease ends).
func LeaseKey(queue string) string { return asynqwire.LeaseKey(queue) }

// RetryKey returns the Redis key of queue's retry set (task IDs by the
// Unix time of their next run), where keyorder parks a task whose turn
// has not come.
func RetryKey(queue string) string { return asynqwire.RetryKey(queue) }

// ScheduledKey returns the Redis key of queue's scheduled set.
func ScheduledKey(queue string) string { return asynqwire.ScheduledKey(queue) }

// PausedKey returns the Redis key that marks queue paused (asynq's
// dequeue skips a queue while it exists).
func PausedKey(queue string) string { return asynqwire.PausedKey(queue) }

// Patterns are Redis glob patterns and keys of asynq's data, for the ACL
// rules of the Redis users that run asynq and keyorder (see [ACL]).
type Patterns struct {
	// All matches every key of asynq's, Queues every queue's keys, Tasks
	// every task hash, Pending every pending list, Scheduled every
	// scheduled set and Retry every retry set.
	All, Queues, Tasks, Pending, Scheduled, Retry string
	// Servers and Workers match the sorted sets of live servers and of
	// active workers with the per-server keys beside them; ServersSet,
	// WorkersSet and SchedulersSet are the three sets alone, whose
	// expired entries asynq's Inspector prunes when it reads them.
	Servers, Workers                      string
	ServersSet, WorkersSet, SchedulersSet string
	// Cancel is the channel on which asynq's Inspector asks servers to
	// cancel an active task.
	Cancel string
}

// ACL returns the patterns of asynq's keys and channel for ACL rules;
// [AllQueues] is the set of queues' key.
func ACL() Patterns {
	p := asynqwire.Patterns
	return Patterns{
		All: p.All, Queues: p.Queues, Tasks: p.Tasks, Pending: p.Pending, Scheduled: p.Scheduled, Retry: p.Retry,
		Servers: p.Servers, Workers: p.Workers,
		ServersSet: asynqwire.ServersKey, WorkersSet: asynqwire.WorkersKey, SchedulersSet: asynqwire.SchedulersKey,
		Cancel: asynqwire.CancelChannel,
	}
}

// ErrUnlisted is matched by the error of [LookTaskInfo] for a task that
// exists in a queue missing from [AllQueues]: asynq's Inspector cannot
// read it, yet it is not gone. It is the engine's own layout's sentinel,
// handed out as it is.
var ErrUnlisted = asynqwire.ErrQueueUnlisted

// TaskInfo reads task id of queue with insp, as insp.GetTaskInfo does,
// except that a task that exists is never taken for gone: the Inspector
// answers asynq.ErrQueueNotFound for every task of a queue missing from
// [AllQueues], which a failover can lose while the queue's tasks stay.
// On that answer TaskInfo looks for the task's hash; when it exists, it
// lists the queue again (as an enqueue would: the caller's Redis user
// needs SADD on AllQueues), reports relisted true and reads once more.
// When it does not, it returns the Inspector's ErrQueueNotFound.
//
// It returns what the Inspector returns (asynq.ErrTaskNotFound,
// asynq.ErrQueueNotFound, ...) or, wrapped, a Redis error. It costs one
// Inspector read, plus two round trips and a second read for an unlisted
// queue. The Inspector takes no context: ctx bounds only the look and the
// listing.
func TaskInfo(ctx context.Context, insp *asynq.Inspector, rdb redis.Cmdable, queue, id string) (info *asynq.TaskInfo, relisted bool, err error) {
	return asynqwire.TaskInfo(ctx, insp, rdb, queue, id)
}

// LookTaskInfo is [TaskInfo] that only reads, for a Redis user that may
// not write [AllQueues] (a read-only dashboard's). Where the Inspector
// answers asynq.ErrQueueNotFound, it looks for the task's hash: when there
// is none, it returns an error matching asynq.ErrTaskNotFound; when there
// is one, an error matching [ErrUnlisted], never "no task". It costs one
// Inspector read, plus one round trip for an unlisted queue.
func LookTaskInfo(ctx context.Context, insp *asynq.Inspector, rdb redis.Cmdable, queue, id string) (*asynq.TaskInfo, error) {
	return asynqwire.LookTaskInfo(ctx, insp, rdb, queue, id)
}

// Finished returns how many tasks of queues are completed or archived, as
// their completed and archived sets hold them, with two ZCARDs per queue
// in one pipeline (on a Cluster, one per master). It is for polling
// during a measurement, where the Inspector's queue summary, which also
// samples memory usage, is too heavy. asynq trims the archive (to 10,000
// tasks and 90 days) and drops a completed task at the end of its
// retention, so the counts are of what is still kept. It returns a
// wrapped Redis error.
func Finished(ctx context.Context, rdb redis.UniversalClient, queues []string) (completed, archived int64, err error) {
	return asynqwire.Finished(ctx, rdb, queues)
}

// Scan reads one page of asynq's set of queues ([AllQueues]) with SSCAN
// from cursor (0 to start), asking for about count names; next is 0 when
// the scan is complete. A name may come more than once over a scan. It
// returns a wrapped Redis error.
func Scan(ctx context.Context, rdb redis.Cmdable, cursor uint64, count int64) (names []string, next uint64, err error) {
	return asynqwire.ScanQueues(ctx, rdb, cursor, count)
}

// Listed reads asynq's set of queues ([AllQueues]): how many queues it
// lists in all, and for each of names whether it lists it, in one
// pipeline. It returns a wrapped Redis error.
func Listed(ctx context.Context, rdb redis.UniversalClient, names []string) (total int64, listed []bool, err error) {
	return asynqwire.QueuesListed(ctx, rdb, names)
}

// Stats is one queue's summary, as asynq's Inspector gives it
// (GetQueueInfo), read by [ReadStats] without trusting the members of the
// queue's lists and sets. (It is the engine's own summary, field for
// field: ReadStats converts one to the other, which the compiler checks.)
type Stats struct {
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
	// that of the first of the last IDs of the pending list (its front)
	// that names a task. It is zero when the list is empty or none of
	// those IDs names a task.
	OldestPendingSince time.Time
	// MemoryUsage approximates the bytes of the queue's lists and sets and
	// of their tasks, as asynq's Inspector does, from a sample of each.
	MemoryUsage int64
	// Ghosts is how many of the sampled members name no task (no task
	// hash, or one without a message).
	Ghosts int
}

// Size returns the tasks in the queue in every state, as asynq's
// QueueInfo.Size does (without asynq groups' aggregating tasks).
func (s Stats) Size() int64 { return asynqwire.QueueStats(s).Size() }

// ReadStats reads queue's summary in one script, of a bounded number of
// commands (about 200 whatever the queue holds), that only reads. Unlike
// asynq's Inspector, one member that names no task (a "ghost", which a
// Redis user that may LPUSH or ZADD into a queue can write) fails
// nothing: it is counted in the sizes, left out of the sample and counted
// in Ghosts. It does not look at asynq's set of queues, so an unlisted
// queue reads as its keys are. It returns a wrapped Redis error (a key of
// the wrong type where a list or set is, for one).
func ReadStats(ctx context.Context, rdb redis.Scripter, queue string) (Stats, error) {
	s, err := asynqwire.ReadQueueStats(ctx, rdb, queue)
	return Stats(s), err
}

// Forward moves task id of queue from asynq's scheduled set or retry set
// to the front of its pending list, so that a worker takes it next, as if
// it were due now; it counts no retry. It is for a task whose schedule is
// not to be kept (one scheduled further ahead than any producer
// schedules). A task in any other state is left alone: Forward then
// returns false and that state, as asynq records it in the task's hash
// ("active", "archived", "completed", "grouped" for a task waiting in a
// group, "" for no such task). It costs one round trip and returns a
// wrapped Redis error.
func Forward(ctx context.Context, rdb redis.Scripter, queue, id string) (moved bool, state string, err error) {
	return asynqwire.Forward(ctx, rdb, queue, id)
}

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
// (keyorder.IsFailure does not). asynq's processor never writes for a
// task whose lease it found expired, so the old run cannot undo the move.
//
// An ID that names no task (its task hash has no message: a ghost, which
// a Redis user that may LPUSH into a pending list can write) is never
// brought back. It is removed, with its hash: from the lease set and the
// active list when its lease has expired for margin, and from the front
// of the pending list (up to 10,000 per call). Recovered counts them.
// Real tasks keep their order. It is safe for use by any number of
// processes at once, and returns a wrapped Redis error.
func Recover(ctx context.Context, rdb redis.Scripter, queue string, margin time.Duration) (Recovered, error) {
	r, err := asynqwire.Recover(ctx, rdb, queue, margin)
	return Recovered(r), err
}
