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

// SetTask is a task read from one of a queue's sorted sets by [SetTasks]
// or [ExpiredLeases]: its ID, its score there, and the fields of its task
// message that say whose it is and how it fared.
type SetTask struct {
	Queue string
	ID    string
	// Due is the set's score: when a retry or scheduled task runs next,
	// or when an active task's lease ends.
	Due time.Time
	// Type and Payload are the task's; Payload is nil when asynq no
	// longer has the task (it moved or ended between the two reads).
	Type    string
	Payload []byte
	// Retry is asynq's MaxRetry, Retried the failures counted so far
	// (a wait that is no failure does not count: see the package
	// comment), ErrorMsg the last error (a failure's or a wait's),
	// LastFailedAt when it was recorded.
	Retry, Retried int
	ErrorMsg       string
	LastFailedAt   time.Time
}

// The sorted sets of a queue that [SetTasks] reads.
const (
	// SetRetry is [RetryKey]: the tasks whose run returned an error, a
	// failure or a wait, by when they run again.
	SetRetry = "retry"
	// SetScheduled is [ScheduledKey]: the tasks enqueued to run later, by
	// when.
	SetScheduled = "scheduled"
)

// SetTasks reads the first limit tasks (earliest due first) of the sorted
// set (SetRetry or SetScheduled) of each of queues, with their task
// messages: a ZRANGE per queue, then an HGET of each task's message, each
// step one pipeline (on a Cluster, one per master). A member whose task
// hash has no message (a ghost: the intake's Redis user may ZADD any
// member into these sets; or a task that ended between the two reads) is
// not a task: it is left out, does not count towards limit, and the read
// goes on past it, in more round trips, until limit tasks of the queue
// are found, its set ends, or [SetScanFactor] times limit members of it
// have been looked at. ghosts counts the members left out. more reports
// that some queue's set holds more than limit tasks, or more than that
// many members. It never scans: its cost is that of the members read, at
// most SetScanFactor×limit+1 per queue. It returns a wrapped Redis error.
// It is safe for concurrent use.
func SetTasks(ctx context.Context, rdb redis.Cmdable, set string, queues []string, limit int64) (out []SetTask, more bool, ghosts int, err error) {
	var key func(string) string
	switch set {
	case SetRetry:
		key = RetryKey
	case SetScheduled:
		key = ScheduledKey
	default:
		return nil, false, 0, fmt.Errorf("asynqwire: no sorted set %q to read", set)
	}
	if limit < 1 {
		return nil, false, 0, fmt.Errorf("asynqwire: limit %d, want at least 1", limit)
	}
	// Per queue: the tasks found, the members looked at, and whether its
	// read is done.
	found := make([][]SetTask, len(queues))
	offset := make([]int64, len(queues))
	done := make([]bool, len(queues))
	budget := SetScanFactor*limit + 1 // one more than limit: is there more?
	for {
		ranges := make([]*redis.ZSliceCmd, len(queues))
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, q := range queues {
				if done[i] {
					continue
				}
				need := min(limit+1-int64(len(found[i])), budget-offset[i])
				ranges[i] = p.ZRangeWithScores(ctx, key(q), offset[i], offset[i]+need-1)
			}
			return nil
		}); err != nil {
			return nil, false, 0, fmt.Errorf("asynqwire: read %s sets: %w", set, err)
		}
		var page []SetTask
		var from []int
		for i, r := range ranges {
			if r == nil {
				continue
			}
			need := min(limit+1-int64(len(found[i])), budget-offset[i])
			zs := r.Val()
			offset[i] += int64(len(zs))
			if int64(len(zs)) < need || offset[i] >= budget {
				done[i] = true // the set ended, or its budget is spent
			}
			for _, z := range zs {
				id, _ := z.Member.(string)
				page = append(page, SetTask{Queue: queues[i], ID: id, Due: time.Unix(int64(z.Score), 0).UTC()})
				from = append(from, i)
			}
		}
		if len(page) == 0 {
			break
		}
		if err := readPage(ctx, rdb, page); err != nil {
			return nil, false, 0, err
		}
		for j, t := range page {
			if t.Payload == nil {
				ghosts++
				continue
			}
			i := from[j]
			found[i] = append(found[i], t)
			if int64(len(found[i])) > limit {
				done[i] = true
			}
		}
	}
	for i := range queues {
		zs := found[i]
		if int64(len(zs)) > limit || offset[i] >= budget {
			more = true
		}
		if int64(len(zs)) > limit {
			zs = zs[:limit]
		}
		out = append(out, zs...)
	}
	return out, more, ghosts, nil
}

// SetScanFactor bounds the members of one queue's set that [SetTasks]
// looks at: SetScanFactor times its limit, ghosts included.
const SetScanFactor = 10

// ExpiredLeases reads the first limit tasks of each of queues whose lease
// ([LeaseKey]) ended before now: tasks active on a worker that stopped
// renewing them (it died or lost Redis), which asynq's recoverer (or
// [Recover]) takes back later. A ZRANGEBYSCORE per queue, then an HGET of
// each task's message, each step one pipeline. more reports that some
// queue has more than limit. It returns a wrapped Redis error. It is safe
// for concurrent use.
func ExpiredLeases(ctx context.Context, rdb redis.Cmdable, queues []string, now time.Time, limit int64) (out []SetTask, more bool, err error) {
	if limit < 1 {
		return nil, false, fmt.Errorf("asynqwire: limit %d, want at least 1", limit)
	}
	ranges := make([]*redis.ZSliceCmd, len(queues))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			ranges[i] = p.ZRangeByScoreWithScores(ctx, LeaseKey(q), &redis.ZRangeBy{
				Min: "-inf", Max: "(" + strconv.FormatInt(now.Unix(), 10), Count: limit + 1})
		}
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("asynqwire: read lease sets: %w", err)
	}
	return readMessages(ctx, rdb, queues, ranges, limit)
}

// LeaseEnd returns when the lease of active task id of queue ends, and
// false when the task holds no lease (it is not active).
func LeaseEnd(ctx context.Context, rdb redis.Cmdable, queue, id string) (time.Time, bool, error) {
	s, err := rdb.ZScore(ctx, LeaseKey(queue), id).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("asynqwire: lease of %s in %s: %w", id, queue, err)
	}
	return time.Unix(int64(s), 0).UTC(), true, nil
}

// readMessages reads the message of each task of ranges (one per queue,
// each up to limit+1 long) in one pipeline.
func readMessages(ctx context.Context, rdb redis.Cmdable, queues []string, ranges []*redis.ZSliceCmd, limit int64) ([]SetTask, bool, error) {
	var out []SetTask
	more := false
	for i, r := range ranges {
		zs := r.Val()
		if int64(len(zs)) > limit {
			more, zs = true, zs[:limit]
		}
		for _, z := range zs {
			id, _ := z.Member.(string)
			out = append(out, SetTask{Queue: queues[i], ID: id, Due: time.Unix(int64(z.Score), 0).UTC()})
		}
	}
	if len(out) == 0 {
		return nil, more, nil
	}
	if err := readPage(ctx, rdb, out); err != nil {
		return nil, false, err
	}
	return out, more, nil
}

// readPage reads the message of each task of out in one pipeline; a task
// whose hash has no message keeps a nil Payload.
func readPage(ctx context.Context, rdb redis.Cmdable, out []SetTask) error {
	msgs := make([]*redis.StringCmd, len(out))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range out {
			msgs[i] = p.HGet(ctx, TaskKey(t.Queue, t.ID), "msg")
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("asynqwire: read task messages: %w", err)
	}
	for i, m := range msgs {
		b, err := m.Bytes()
		if err != nil {
			continue // no message (a ghost, or gone meanwhile): Payload stays nil
		}
		decodeMessage(b, &out[i])
	}
	return nil
}

// decodeMessage reads the fields of asynq's TaskMessage (internal/proto)
// that SetTask carries: type 1, payload 2, retry 5, retried 6, error_msg
// 7, last_failed_at 11 (Unix seconds). A malformed message leaves the
// rest of t as it is.
func decodeMessage(b []byte, t *SetTask) {
	eachField(b, func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			t.Type = string(v)
		case 2:
			t.Payload = append([]byte{}, v...)
		case 7:
			t.ErrorMsg = string(v)
		}
	}, func(num protowire.Number, v uint64) {
		switch num {
		case 5:
			t.Retry = int(int32(v))
		case 6:
			t.Retried = int(int32(v))
		case 11:
			if v != 0 {
				t.LastFailedAt = time.Unix(int64(v), 0).UTC()
			}
		}
	})
	if t.Payload == nil {
		t.Payload = []byte{}
	}
}

// eachField calls onBytes with each length-delimited field of the
// protobuf message msg and onVarint with each varint field, in order,
// skipping fields of other wire types; it stops at a malformed field,
// keeping what came before it.
func eachField(msg []byte, onBytes func(protowire.Number, []byte), onVarint func(protowire.Number, uint64)) {
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return
			}
			onBytes(num, v)
			b = b[n:]
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return
			}
			onVarint(num, v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return
			}
			b = b[n:]
		}
	}
}
