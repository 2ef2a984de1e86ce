// Package asynqwire is the one home of asynq's private Redis layout: every
// key name, script and raw read or write of asynq's data that orderworker
// makes lives here. No other package spells an asynq key, builds one, runs
// a Redis command on one or writes Lua that touches asynq's data
// (TestOnlyThisPackageSpellsAsynqKeys walks the module's non-test files).
// It is the engine's (package keyorder's): sitting under worker/keyorder,
// no package outside the engine may import it. Everything else goes
// through asynq's public Client, Inspector and Server, through the
// engine's API, or through the engine's public face of this package,
// worker/keyorder/asynqredis, which hands out the few of its names the
// tools around the engine need (key names and ACL patterns, the task
// reads, the dashboards' counts, Recover and Forward). It is not for
// policy (which queue a task is in, when to wake it: packages keyorder,
// tasks and worker), so an asynq upgrade reads this package and nothing
// else.
//
// What it provides:
//   - key names: [AllQueues], [QueueKey], [TaskKey], [PendingKey],
//     [ActiveKey], [LeaseKey], [RetryKey], [ScheduledKey], [CompletedKey],
//     [ArchivedKey], [PausedKey], the process keys ([ServersKey], ...), the
//     ACL [Patterns] and the task state [StateActive];
//   - enqueueing from a script, in the same atomic step as other writes
//     (the producer takes a change's position and enqueues its task in one
//     script, one round trip): [Message] and [EnqueueLua];
//   - moving tasks as asynq's forwarder and recoverer do: [Front] brings a
//     parked task to the front of its queue, [Forward] a scheduled one
//     whose schedule is not to be kept, [Recover] a dead worker's tasks
//     back; and as its Inspector does: [Archive] archives a task with a
//     reason as its last error (an operator's skip);
//   - reads: [TaskInfo] (the Inspector, minus its unlisted-queue quirk),
//     [Finished], [QueuesListed] and [ScanQueues]; bounded pages of the
//     retry and scheduled sets and of the expired leases with their task
//     messages ([SetTasks], [ExpiredLeases], [LeaseEnd]), which the
//     engine's blocked read (keyorder.Runner.Blocked) finds its
//     candidates in.
//
// # What orderworker relies on
//
// All of it is asynq v0.25.1's, the version go.mod pins, and none of it is
// a public API:
//
//   - Key names and shapes. The set "asynq:queues" of every queue's name;
//     per queue, under the hash tag "{<queue>}" (one Cluster slot per
//     queue, so a queue's keys and scripts stay on one master), the task
//     hash "t:<id>", the lists "pending" and "active", the sorted sets
//     "scheduled", "retry", "lease", "completed" and "archived" (the
//     archive trimmed by asynq to 10,000 tasks and 90 days), and the
//     string "paused"; outside the queues, "asynq:servers",
//     "asynq:workers" and "asynq:schedulers" with per-process keys beside
//     them, and the channel "asynq:cancel".
//   - The task hash. Its fields "msg" (the protobuf TaskMessage of asynq's
//     internal/proto: type 1, payload 2, id 3, queue 4, retry 5 as an int32
//     varint, retried 6, error_msg 7, timeout 8 in seconds, last_failed_at
//     11 in Unix seconds, retention 12 in seconds; zero fields
//     left out; a Client task with neither timeout nor deadline gets 30
//     minutes), "state" ("pending", "active", "scheduled", "retry",
//     "archived", "completed", "aggregating"), "pending_since" (Unix ns)
//     and "group".
//   - The enqueue. asynq's Client writes the hash, LPUSHes the ID on
//     "pending", SADDs the queue to "asynq:queues" once per process and
//     queue, and refuses an ID whose hash exists (ErrTaskIDConflict).
//     [EnqueueLua] does the same, and lists the queue every time.
//   - The moves. Dequeue RPOPLPUSHes "pending" to "active" and skips a
//     queue whose "paused" key exists (so RPUSH puts a task first in
//     line); the forwarder moves due "retry" and "scheduled" entries to
//     "pending"; a task that returns an error goes to "retry" (or
//     "archived") with state "retry", which [Front] moves back. An error
//     that IsFailure calls no failure goes to "retry" too, scored with
//     RetryDelayFunc's delay and with its message as the last error, but
//     without counting a retry (processor.retry, rdb.Retry). The
//     Inspector's ArchiveTask moves a pending, scheduled or retry task to
//     "archived" (scored by Unix seconds, trimmed to 90 days and 10,000
//     tasks) and refuses an active one in the same script; [Archive] does
//     the same and writes error_msg and last_failed_at as a failure does.
//   - The lease. A server leases each active task in "lease" (its score the
//     lease's end, renewed by the server's heartbeat); asynq's recoverer
//     takes a task whose lease ended 30 s ago back as a failure, once a
//     minute; the processor never writes for a task whose lease it found
//     expired, so [Recover] moving it cannot be undone by the old run.
//   - Inspector quirks. GetTaskInfo answers ErrQueueNotFound for every
//     task of a queue missing from "asynq:queues", even a task that exists
//     ([TaskInfo] works around it by listing the queue again, and
//     [LookTaskInfo], for a reader, by telling [ErrQueueUnlisted] from no
//     task; bugs came from it); its methods take
//     no context; its queue summary samples memory usage, too heavy to poll
//     ([Finished] reads the sets instead); it prunes expired entries of the
//     process sets when it reads them.
//   - Our own contract with the script. The producer's acceptance script
//     appends the position to the payload's JSON (`,"seq":<pos>` before
//     the closing brace), which needs "seq" to be the last field every
//     payload encodes; producer's TestSeqSpliceMatchesTheEncoding fails
//     when a field, even an optional one, comes after Seq.
//
// # Checklist for an asynq upgrade
//
//  1. Diff asynq's internal/base (key functions, TaskMessage), internal/rdb
//     (its Lua: enqueue, dequeue, done, retry, archive, forward, recover,
//     lease extension) and internal/proto against the list above.
//  2. Run this package's tests against the new version: they compare what
//     [EnqueueLua] writes with what the Client writes field by field, read
//     it with the Inspector and run it on a real Server; run a task [Front]
//     moved, and tasks [Forward] brought forward; archive tasks with
//     [Archive] and read the reason back with the Inspector; bring a dead
//     worker's task back with [Recover]; check [Finished] and [PausedKey]
//     against the Inspector and Server, and the Inspector's
//     ErrQueueNotFound quirk ([TaskInfo]). A test that fails
//     there is the layout that moved.
//  3. Check the lease: its length and renewal, asynq's recoverer's
//     timing, and that the processor still drops every write of a run
//     whose lease it found expired ([Recover] and worker.Config.RecoverAfter,
//     counted past the lease's end, rely on it). Check too that asynq still
//     archives when Retried >= MaxRetry before it consults IsFailure
//     (package worker's failure budget relies on it).
//  4. If the Inspector stops answering ErrQueueNotFound for an unlisted
//     queue's task, or asynq gains task headers, revisit [TaskInfo] and the
//     producer's relisting, and the payload's trace field.
//  5. Run TestOnlyThisPackageSpellsAsynqKeys and producer's
//     TestSeqSpliceMatchesTheEncoding, then the worker's and producer's
//     suites, which run real asynq servers.
package asynqwire

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// AllQueues is the Redis set of every queue's name, which asynq's
// Inspector and asynqmon list the queues from.
const AllQueues = "asynq:queues"

// QueueKey returns the prefix of queue's keys: "asynq:{<queue>}:".
func QueueKey(queue string) string { return "asynq:{" + queue + "}:" }

// TaskKey returns the Redis key of the hash of task id in queue.
func TaskKey(queue, id string) string { return QueueKey(queue) + "t:" + id }

// PendingKey returns the Redis key of queue's pending list.
func PendingKey(queue string) string { return QueueKey(queue) + "pending" }

// Message is a task as asynq's Client.Enqueue records it, apart from its
// payload, which the script appends (see [EnqueueLua]).
type Message struct {
	Type  string
	ID    string
	Queue string
	// MaxRetry is asynq's MaxRetry option.
	MaxRetry int
	// Timeout is asynq's Timeout option, counted in whole seconds; zero
	// means asynq's default of 30 minutes, as with the Client.
	Timeout time.Duration
	// Retention is asynq's Retention option, counted in whole seconds.
	Retention time.Duration
}

// defaultTimeout is what asynq's Client gives a task with neither a timeout
// nor a deadline.
const defaultTimeout = 30 * time.Minute

// Head encodes m as asynq's task message without the payload field; the
// script appends that field (asynq_message in [EnqueueLua]). Fields may
// come in any order in a protobuf message, and zero fields are left out,
// as asynq's encoder leaves them out.
func (m Message) Head() []byte {
	b := make([]byte, 0, 16+len(m.Type)+len(m.ID)+len(m.Queue))
	str := func(num protowire.Number, s string) {
		if s != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, s)
		}
	}
	vint := func(num protowire.Number, v int64) {
		if v != 0 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	timeout := m.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	// The numbers of asynq's TaskMessage: type 1, payload 2, id 3, queue 4,
	// retry 5, timeout 8, retention 12 (int32 retry as a varint, like
	// protobuf's own encoder).
	str(1, m.Type)
	str(3, m.ID)
	str(4, m.Queue)
	vint(5, int64(int32(m.MaxRetry)))
	vint(8, int64(timeout/time.Second))
	vint(12, int64(m.Retention/time.Second))
	return b
}

// EnqueueLua defines three Lua functions for a script that enqueues a task:
//
//	asynq_message(head, payload)
//
// returns the task message of head ([Message.Head]) carrying payload (an
// empty payload is left out, as protobuf leaves out empty fields);
//
//	asynq_exists(task)
//
// reports whether the task hash task exists: whether its queue holds a
// task with its ID (asynq's Client refuses such an ID with
// ErrTaskIDConflict);
//
//	asynq_enqueue(task, pending, all, queue, id, msg, now)
//
// enqueues task id with message msg to queue as asynq v0.25.1's Client
// does, once asynq_exists(task) said false in the same script (asynq's
// enqueue script, and the SADD of the queue's name to the set all, which
// the Client makes once per process and queue, and this every time), with
// now the time in Unix nanoseconds, as decimal. task, pending and all are
// the keys [TaskKey](queue, id), [PendingKey](queue) and [AllQueues],
// which the script must have among its KEYS; the first two are in queue's
// Cluster slot and the third in another, so such a script runs on one
// Redis (or a Sentinel's master), not on a Cluster; and
//
//	asynq_park(task, retry, all, queue, id, msg, at)
//
// which enqueues the task parked instead: in queue's retry set (the key
// [RetryKey](queue)), scored at, a time in Unix seconds as decimal, with
// state "retry", as the worker parks a task whose turn has not come. The
// forwarder moves it to the pending list at that time, unless [Claim] or
// [Front] takes it first.
const EnqueueLua = `
local function asynq_message(head, payload)
  local n, len = #payload, ''
  if n == 0 then return head end
  while n >= 128 do
    len = len .. string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  return head .. '\18' .. len .. string.char(n) .. payload
end

local function asynq_exists(task)
  return redis.call('EXISTS', task) == 1
end

local function asynq_enqueue(task, pending, all, queue, id, msg, now)
  redis.call('HSET', task, 'msg', msg, 'state', 'pending', 'pending_since', now)
  redis.call('LPUSH', pending, id)
  redis.call('SADD', all, queue)
end

local function asynq_park(task, retry, all, queue, id, msg, at)
  redis.call('HSET', task, 'msg', msg, 'state', 'retry')
  redis.call('ZADD', retry, at, id)
  redis.call('SADD', all, queue)
end
`

// RetryKey returns the Redis key of queue's retry set (a sorted set of task
// IDs by the Unix time of their next run).
func RetryKey(queue string) string { return QueueKey(queue) + "retry" }

// ActiveKey returns the Redis key of queue's active list.
func ActiveKey(queue string) string { return QueueKey(queue) + "active" }

// LeaseKey returns the Redis key of queue's lease set (active task IDs by
// the Unix time their worker's lease ends).
func LeaseKey(queue string) string { return QueueKey(queue) + "lease" }

// CompletedKey returns the Redis key of queue's completed set.
func CompletedKey(queue string) string { return QueueKey(queue) + "completed" }

// ArchivedKey returns the Redis key of queue's archive (a sorted set, which
// asynq trims to its newest 10,000 tasks and to 90 days).
func ArchivedKey(queue string) string { return QueueKey(queue) + "archived" }

// ScheduledKey returns the Redis key of queue's scheduled set.
func ScheduledKey(queue string) string { return QueueKey(queue) + "scheduled" }

// StateActive is the state asynq records in the hash of a task that a
// worker is running (field "state"), as [Front] reports it. A task the
// worker parks is active until its run returns and asynq moves it to the
// retry set.
const StateActive = "active"

// The keys and channel of asynq's processes, outside any queue.
const (
	// ServersKey and WorkersKey are the sorted sets of live servers and
	// of active workers (each with one key per server beside it:
	// "asynq:servers:{<host:pid:id>}"), SchedulersKey that of schedulers.
	// The Inspector prunes their expired entries when it reads them.
	ServersKey    = "asynq:servers"
	WorkersKey    = "asynq:workers"
	SchedulersKey = "asynq:schedulers"
	// CancelChannel is the channel on which the Inspector asks servers to
	// cancel an active task.
	CancelChannel = "asynq:cancel"
)

// Patterns are Redis glob patterns of asynq's keys, for ACL rules (package
// acl): All every key, Queues every queue's keys, Tasks every task hash,
// Pending every pending list, Scheduled every scheduled set, Retry every
// retry set, Servers and Workers the process sets with the per-server keys
// beside them.
var Patterns = struct {
	All, Queues, Tasks, Pending, Scheduled, Retry, Servers, Workers string
}{
	All:       "asynq:*",
	Queues:    "asynq:{*",
	Tasks:     TaskKey("*", "*"),
	Pending:   PendingKey("*"),
	Scheduled: ScheduledKey("*"),
	Retry:     RetryKey("*"),
	Servers:   ServersKey + "*",
	Workers:   WorkersKey + "*",
}

// PausedKey returns the Redis key that marks queue paused (asynq's dequeue
// script skips a queue while it exists).
func PausedKey(queue string) string { return QueueKey(queue) + "paused" }
