// Package asynqwire writes asynq tasks into Redis the way asynq's own Client
// does, for a script that must enqueue a task in the same atomic step as
// other writes: the producer takes a change's position and enqueues its
// task in one script, one round trip (see package producer).
//
// It knows asynq's Redis layout ("asynq:{<queue>}:t:<id>", ":pending", the
// set "asynq:queues") and its task message (the protobuf TaskMessage of
// asynq's internal/proto). That layout is asynq's, not a public API: it is
// checked against asynq v0.25.1, the version go.mod pins, by this package's
// test, which reads what it wrote with asynq's Inspector and runs it on a
// real asynq server.
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
