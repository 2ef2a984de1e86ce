// Package asynqwire is the one home of asynq's private Redis layout: every
// key name, script and raw write of asynq's data that orderworker makes
// lives here, and no other package spells an asynq key (a test checks the
// module's string literals). Everything else goes through asynq's public
// Client, Inspector and Server, or through this package.
//
// It writes asynq tasks into Redis the way asynq's own Client does, for a
// script that must enqueue a task in the same atomic step as other writes
// (the producer takes a change's position and enqueues its task in one
// script, one round trip: [EnqueueLua]); it brings a parked task to the
// front of its queue ([Front]) and a dead worker's tasks back ([Recover]),
// as asynq's forwarder and recoverer do.
//
// # What orderworker relies on
//
// All of it is asynq v0.25.1's, the version go.mod pins, and none of it is
// a public API:
//
//   - the key names: the set "asynq:queues" of every queue's name (the
//     Inspector and asynqmon list queues from it, and the Inspector says
//     "queue not found" for every task of a queue missing from it), and per
//     queue, under the hash tag "{<queue>}" (one Cluster slot per queue),
//     the task hash "t:<id>", the lists "pending" and "active", the sorted
//     sets "retry", "lease", "completed" and "archived" (trimmed by asynq to
//     10,000 tasks and 90 days), and "paused";
//   - the task hash's fields "msg" (the protobuf TaskMessage of asynq's
//     internal/proto: type 1, payload 2, id 3, queue 4, retry 5, timeout 8,
//     retention 12), "state" ("pending", "active", "retry", ...),
//     "pending_since" (Unix ns) and "group";
//   - how asynq's scripts move a task: dequeue RPOPLPUSHes pending to active
//     (so RPUSH puts a task first in line), the forwarder moves due retry
//     entries to pending, the processor never writes for a task whose lease
//     it found expired, and the Client refuses a task ID whose hash exists.
//
// An asynq upgrade must check all of the above again. This package's tests
// do most of it against the pinned asynq: they read what [EnqueueLua] wrote
// with asynq's Inspector and run it on a real asynq Server, run a task that
// [Front] moved next on a real Server, and bring back a dead worker's task
// with [Recover]. Read asynq's internal/rdb and internal/base for the rest.
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
// Redis (or a Sentinel's master), not on a Cluster.
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
// Pending every pending list, Scheduled every scheduled set, Servers and
// Workers the process sets with the per-server keys beside them.
var Patterns = struct {
	All, Queues, Tasks, Pending, Scheduled, Servers, Workers string
}{
	All:       "asynq:*",
	Queues:    "asynq:{*",
	Tasks:     TaskKey("*", "*"),
	Pending:   PendingKey("*"),
	Scheduled: ScheduledKey("*"),
	Servers:   ServersKey + "*",
	Workers:   WorkersKey + "*",
}

// PausedKey returns the Redis key that marks queue paused (asynq's dequeue
// script skips a queue while it exists).
func PausedKey(queue string) string { return QueueKey(queue) + "paused" }
