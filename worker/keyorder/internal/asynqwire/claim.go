package asynqwire

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

// A worker that holds a key's lock and goes on with the key's next task in
// the same hold (the drain) takes that task out of its queue itself, runs
// it outside asynq's processor, and records its end as the processor
// would: [Step] does both, in one round trip when both tasks are in one
// queue. The writes are asynq v0.25.1's dequeue, MarkAsComplete, Done,
// Retry, Archive and Requeue (internal/rdb), key for key, so that asynqmon,
// the Inspector, the recoverer and the dedupe by task ID see a drained task
// as they see any other.

// LeaseDuration is the lease that [Step] gives a task it claims, as
// asynq's dequeue does (rdb.LeaseDuration): past it, the task of a worker
// that died is brought back ([Recover], and asynq's own recoverer). A
// caller whose run lasts longer extends it with [ExtendLease].
const LeaseDuration = 30 * time.Second

// archive bounds, as asynq's (rdb.maxArchiveSize, archivedExpirationInDays),
// and the life of the daily counters (statsTTL).
const (
	maxArchiveSize = 10000
	archiveDays    = 90
	statsTTL       = 90 * 24 * time.Hour
)

// Claimed is a task that [Step] took out of its queue for its caller to run.
type Claimed struct {
	Queue, ID, Type string
	Payload         []byte
	// MaxRetry and Retried are asynq's (its Retry and Retried).
	MaxRetry, Retried int
	// Timeout is the task's timeout (0: none) and Deadline its deadline
	// (zero: none), as asynq bounds a run by them.
	Timeout  time.Duration
	Deadline time.Time
	// Retention is how long the task is kept once completed (0: deleted).
	Retention time.Duration
	// Peek is what a step with [StepOptions.PeekFields] read, field for
	// field (nil for a missing field).
	Peek []*string
	msg  []byte // the message as claimed
}

// Outcome is how a claimed task's run ended, for [Step].
type Outcome struct {
	// Task is the task that ran.
	Task *Claimed
	// Err is nil when it succeeded: the task is completed (kept for its
	// Retention, or deleted without one).
	Err error
	// Archive archives the task with Err as its last error; otherwise a
	// task with Err goes to the retry set, to run again at RetryAt, with
	// Retried counted up when Failure is set. Requeue instead puts it back
	// at the front of its queue, as asynq does with a run cancelled by a
	// shutdown.
	Archive, Failure, Requeue bool
	RetryAt                   time.Time
}

// ErrNotClaimed is matched by the error of [Step] when the task to claim
// was not waiting in its queue (active elsewhere, scheduled on purpose,
// gone, ...): its state is in the error, see [NotClaimedError].
var ErrNotClaimed = errors.New("asynqwire: task not claimed")

// NotClaimedError is [Step]'s error for a task that was not claimed.
type NotClaimedError struct {
	Queue, ID string
	// State is the task's state as asynq records it ("" when there is no
	// such task; "grouped" for a task of a group; "paused" when its queue
	// is paused).
	State string
}

func (e *NotClaimedError) Error() string {
	return fmt.Sprintf("asynqwire: task %s of %s not claimed: state %q", e.ID, e.Queue, e.State)
}

// Is makes the error match ErrNotClaimed.
func (e *NotClaimedError) Is(target error) bool { return target == ErrNotClaimed }

// stepScript ends a claimed task's run (ARGV[1] not "") and claims another
// task of the same queue (ARGV[10] not ""), in that order.
//
// KEYS[1] the ended task's hash (or any key of the queue), KEYS[2] pending,
// KEYS[3] retry, KEYS[4] active, KEYS[5] lease, KEYS[6] completed,
// KEYS[7] archived, KEYS[8] processed:<day>, KEYS[9] failed:<day>,
// KEYS[10] processed, KEYS[11] failed, KEYS[12] paused, KEYS[13] the task
// to claim's hash (or any key of the queue), KEYS[14..13+g] the hashes of
// the guards (see ARGV[12]), KEYS[14+g] (optional) the hash to peek at
// ARGV[1] how the run ended: "complete", "done", "retry", "fail" (a retry
// that counts as a failure), "archive", "requeue", or "" for no run; ARGV[2]
// the ended task's ID, ARGV[3] its new message (complete, retry, archive),
// ARGV[4] the score: completed's expiry, the retry time, or now (Unix
// seconds), ARGV[5] the stats' expiry (Unix seconds), ARGV[6] the archive's
// cutoff (Unix seconds), ARGV[7] the archive's size bound, ARGV[8] the
// task key prefix, ARGV[9] max int64, ARGV[10] the ID to claim ("" for
// none), ARGV[11] its lease end (Unix seconds), ARGV[12] (optional) g, the
// number of guards, then for each guard i, ARGV[11+2i] a field of
// KEYS[13+i] and ARGV[12+2i] the value it must hold, then (with KEYS[14+g])
// the fields to peek at
//
// Returns {"unguarded"} when a guard does not hold (nothing is written), or
// {ended, claim...}: ended is "ok", or "gone" when the ended task was no
// longer active (its lease expired and it was recovered: nothing is written
// for it, as asynq's processor writes nothing then); claim is {"claimed",
// msg, peeked...} (the peeked fields' values, false for a missing one) or
// {state} for a task left alone.
var stepScript = redis.NewScript(`
local function count(day, total, failed_day, failed_total, failed)
  local n = redis.call('INCR', day)
  if tonumber(n) == 1 then redis.call('EXPIREAT', day, ARGV[5]) end
  if failed then
    local m = redis.call('INCR', failed_day)
    if tonumber(m) == 1 then redis.call('EXPIREAT', failed_day, ARGV[5]) end
  end
  local t = redis.call('GET', total)
  if tonumber(t) == tonumber(ARGV[9]) then
    redis.call('SET', total, 1)
    if failed then redis.call('SET', failed_total, 1) end
  else
    redis.call('INCR', total)
    if failed then redis.call('INCR', failed_total) end
  end
end

local g = tonumber(ARGV[12] or '0') or 0
for i = 1, g do
  if redis.call('HGET', KEYS[13 + i], ARGV[11 + 2 * i]) ~= ARGV[12 + 2 * i] then return {'unguarded'} end
end
local ended = ''
local op, id = ARGV[1], ARGV[2]
if op ~= '' then
  if redis.call('LREM', KEYS[4], 0, id) == 0 then
    ended = 'gone'
  else
    ended = 'ok'
    redis.call('ZREM', KEYS[5], id)
    if op == 'complete' then
      redis.call('ZADD', KEYS[6], ARGV[4], id)
      redis.call('HSET', KEYS[1], 'msg', ARGV[3], 'state', 'completed')
      count(KEYS[8], KEYS[10], KEYS[9], KEYS[11], false)
    elseif op == 'done' then
      redis.call('DEL', KEYS[1])
      count(KEYS[8], KEYS[10], KEYS[9], KEYS[11], false)
    elseif op == 'retry' or op == 'fail' then
      redis.call('ZADD', KEYS[3], ARGV[4], id)
      redis.call('HSET', KEYS[1], 'msg', ARGV[3], 'state', 'retry')
      if op == 'fail' then count(KEYS[8], KEYS[10], KEYS[9], KEYS[11], true) end
    elseif op == 'archive' then
      redis.call('ZADD', KEYS[7], ARGV[4], id)
      local old = redis.call('ZRANGE', KEYS[7], '-inf', ARGV[6], 'BYSCORE')
      if #old > 0 then
        for _, o in ipairs(old) do redis.call('DEL', ARGV[8] .. o) end
        redis.call('ZREM', KEYS[7], unpack(old))
      end
      local extra = redis.call('ZRANGE', KEYS[7], 0, -tonumber(ARGV[7]))
      if #extra > 0 then
        for _, o in ipairs(extra) do redis.call('DEL', ARGV[8] .. o) end
        redis.call('ZREM', KEYS[7], unpack(extra))
      end
      redis.call('HSET', KEYS[1], 'msg', ARGV[3], 'state', 'archived')
      count(KEYS[8], KEYS[10], KEYS[9], KEYS[11], true)
    elseif op == 'requeue' then
      redis.call('RPUSH', KEYS[2], id)
      redis.call('HSET', KEYS[1], 'state', 'pending')
    end
  end
end
if ARGV[10] == '' then return {ended} end
local cid = ARGV[10]
local st = redis.call('HMGET', KEYS[13], 'state', 'group', 'msg')
if st[2] and st[2] ~= '' then return {ended, 'grouped'} end
if redis.call('EXISTS', KEYS[12]) == 1 then return {ended, 'paused'} end
if st[1] == 'retry' then
  if redis.call('ZREM', KEYS[3], cid) == 0 then return {ended, st[1]} end
elseif st[1] == 'pending' then
  if redis.call('LREM', KEYS[2], 1, cid) == 0 then return {ended, st[1]} end
else
  return {ended, st[1] or ''}
end
redis.call('LPUSH', KEYS[4], cid)
redis.call('ZADD', KEYS[5], ARGV[11], cid)
redis.call('HSET', KEYS[13], 'state', 'active')
redis.call('HDEL', KEYS[13], 'pending_since')
local res = {ended, 'claimed', st[3]}
if KEYS[14 + g] and #ARGV > 12 + 2 * g then
  local fields = {}
  for i = 13 + 2 * g, #ARGV do fields[#fields + 1] = ARGV[i] end
  for _, v in ipairs(redis.call('HMGET', KEYS[14 + g], unpack(fields))) do res[#res + 1] = v end
end
return res
`)

// Step records how the run of a claimed task ended (done may be nil: no
// run) and then claims task id of queue (id may be "": no claim), as
// asynq's dequeue would take it: out of the retry set (a parked task) or
// the pending list, into the active list with a lease of [LeaseDuration].
// Both happen in one round trip when done's task is in queue, two
// otherwise (on a Cluster, two queues are two slots).
//
// It returns the claimed task, or nil and an error matching
// [ErrNotClaimed] (a [*NotClaimedError]) when the task was in no state to
// claim (active, scheduled on purpose, archived, completed, gone, of a
// group, or its queue is paused): it is left alone then. gone reports that
// done's task was no longer active (its lease had expired and it was
// brought back): nothing was written for it. Other errors are Redis's;
// done's outcome may then be written or not (a task left active is
// recovered once its lease ends, and runs again). It is safe for
// concurrent use.
func Step(ctx context.Context, rdb redis.Scripter, done *Outcome, queue, id string) (c *Claimed, gone bool, err error) {
	return StepWith(ctx, rdb, done, queue, id, StepOptions{})
}

// StepOptions are the options of [StepWith] and [PipeStep].
type StepOptions struct {
	// Guards must all hold for the step to write anything; when one does
	// not, the step writes nothing and returns [ErrUnguarded]. A guard's
	// hash must be on the queue's Redis node (on a Cluster: in the queue's
	// slot), so guards are for a single Redis.
	Guards []Guard
	// PeekKey and PeekFields: when the step claims a task, it also reads
	// these fields of hash PeekKey, in the same round trip, into
	// [Claimed.Peek]. The same rule as the guards' applies to PeekKey.
	PeekKey    string
	PeekFields []string
}

// Guard is a precondition of a step: field Field of hash Key holds Value.
type Guard struct{ Key, Field, Value string }

// ErrUnguarded is the error of a step whose guard did not hold: it wrote
// nothing.
var ErrUnguarded = errors.New("asynqwire: a guard of the step did not hold")

// StepWith is [Step] with options: guards that must hold for the step to
// write anything, and fields to peek at with the claim.
func StepWith(ctx context.Context, rdb redis.Scripter, done *Outcome, queue, id string, opt StepOptions) (c *Claimed, gone bool, err error) {
	now := time.Now()
	if done != nil && id != "" && done.Task.Queue != queue {
		if gone, err = step(ctx, rdb, now, done, "", "", nil, opt); err != nil {
			return nil, gone, err
		}
		done, opt.Guards = nil, nil // held when done's end was written
	}
	var claimed *Claimed
	if id != "" {
		claimed = new(Claimed)
	}
	g, err := step(ctx, rdb, now, done, queue, id, claimed, opt)
	return claimed, gone || g, err
}

// PipeStep queues on pipe the step that [StepWith] runs, for a caller that
// sends it in the round trip of other commands (the commit of a store),
// and returns the function that reads its result once pipe has been
// executed, with StepWith's results. done's task must be in queue (or
// done nil, or id ""). A step that pipe sends before the server has its
// script fails with a NOSCRIPT error and writes nothing: the caller then
// runs it with StepWith, which loads the script.
func PipeStep(ctx context.Context, pipe redis.Pipeliner, done *Outcome, queue, id string, opt StepOptions) (result func() (c *Claimed, gone bool, err error), err error) {
	if done != nil && id != "" && done.Task.Queue != queue {
		return nil, fmt.Errorf("asynqwire: pipe a step of %s and %s: two queues", done.Task.Queue, queue)
	}
	var claimed *Claimed
	if id != "" {
		claimed = new(Claimed)
	}
	q, keys, args := stepArgs(time.Now(), done, queue, id, opt)
	cmd := stepScript.EvalSha(ctx, pipe, keys, args...)
	return func() (*Claimed, bool, error) {
		gone, err := stepResult(cmd, q, done, id, claimed)
		if err != nil {
			return nil, gone, err
		}
		return claimed, gone, nil
	}, nil
}

// step runs stepScript once, on done's queue or queue.
func step(ctx context.Context, rdb redis.Scripter, now time.Time, done *Outcome, queue, id string, c *Claimed, opt StepOptions) (gone bool, err error) {
	q, keys, args := stepArgs(now, done, queue, id, opt)
	return stepResult(stepScript.Run(ctx, rdb, keys, args...), q, done, id, c)
}

// stepArgs returns the queue, keys and arguments of stepScript.
func stepArgs(now time.Time, done *Outcome, queue, id string, opt StepOptions) (q string, keys []string, args []any) {
	q = queue
	if done != nil {
		q = done.Task.Queue
	}
	pre := QueueKey(q)
	endKey, claimKey := pre+"t:", pre+"t:"
	args = []any{"", "", "", 0, now.Add(statsTTL).Unix(), now.AddDate(0, 0, -archiveDays).Unix(), maxArchiveSize, pre + "t:", int64(math.MaxInt64), id,
		now.Add(LeaseDuration).Unix()}
	if done != nil {
		t := done.Task
		endKey = TaskKey(q, t.ID)
		op, msg, score := outcome(done, now)
		args[0], args[1], args[2], args[3] = op, t.ID, msg, score
	}
	if id != "" {
		claimKey = TaskKey(q, id)
	}
	day := now.UTC().Format("2006-01-02")
	keys = []string{endKey, PendingKey(q), RetryKey(q), ActiveKey(q), LeaseKey(q), CompletedKey(q), ArchivedKey(q),
		pre + "processed:" + day, pre + "failed:" + day, pre + "processed", pre + "failed", PausedKey(q), claimKey}
	if len(opt.Guards) > 0 || (opt.PeekKey != "" && len(opt.PeekFields) > 0) {
		args = append(args, len(opt.Guards))
		for _, g := range opt.Guards {
			keys = append(keys, g.Key)
			args = append(args, g.Field, g.Value)
		}
		if opt.PeekKey != "" && len(opt.PeekFields) > 0 {
			keys = append(keys, opt.PeekKey)
			for _, f := range opt.PeekFields {
				args = append(args, f)
			}
		}
	}
	return q, keys, args
}

// stepResult reads the reply of stepScript into c (claimed when not nil).
func stepResult(cmd *redis.Cmd, q string, done *Outcome, id string, c *Claimed) (gone bool, err error) {
	res, err := cmd.Slice()
	if err != nil {
		what := "claim " + id
		if done != nil {
			what = "end " + done.Task.ID + ", " + what
		}
		return false, fmt.Errorf("asynqwire: %s in %s: %w", what, q, err)
	}
	if len(res) == 0 {
		return false, fmt.Errorf("asynqwire: step in %s: empty reply", q)
	}
	ended, _ := res[0].(string)
	if ended == "unguarded" {
		return false, ErrUnguarded
	}
	gone = ended == "gone"
	if c == nil {
		return gone, nil
	}
	if len(res) < 3 {
		state := ""
		if len(res) > 1 {
			state, _ = res[1].(string)
		}
		return gone, &NotClaimedError{Queue: q, ID: id, State: state}
	}
	msg, _ := res[2].(string)
	*c = decodeClaimed([]byte(msg))
	c.Queue, c.ID = q, id
	if n := len(res) - 3; n > 0 {
		c.Peek = make([]*string, n)
		for i, v := range res[3:] {
			if s, ok := v.(string); ok {
				c.Peek[i] = &s
			}
		}
	}
	return gone, nil
}

// outcome returns the step's operation for done, the task's new message and
// the score, as asynq's processor records them.
func outcome(done *Outcome, now time.Time) (op string, msg []byte, score int64) {
	t := done.Task
	switch {
	case done.Err == nil && t.Retention > 0:
		return "complete", rewrite(t.msg, map[protowire.Number]any{13: now.Unix()}), now.Unix() + int64(t.Retention/time.Second)
	case done.Err == nil:
		return "done", nil, 0
	case done.Requeue:
		return "requeue", nil, 0
	case done.Archive:
		return "archive", rewrite(t.msg, map[protowire.Number]any{7: done.Err.Error(), 11: now.Unix()}), now.Unix()
	}
	fields := map[protowire.Number]any{7: done.Err.Error(), 11: now.Unix()}
	op = "retry"
	if done.Failure {
		op = "fail"
		fields[6] = int64(t.Retried + 1)
	}
	return op, rewrite(t.msg, fields), done.RetryAt.Unix()
}

// rewrite returns msg, a TaskMessage, with the given fields (a string or
// an int64 each; of 6 retried, 7 error_msg, 11 last_failed_at and 13
// completed_at) set: their old values are dropped and the new ones
// appended, zero values left out, as protobuf encodes them. Every other
// field is copied as it is, and a malformed tail is kept as it is.
func rewrite(msg []byte, set map[protowire.Number]any) []byte {
	out := make([]byte, 0, len(msg)+32)
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := -1
		if n >= 0 {
			m = protowire.ConsumeFieldValue(num, typ, b[n:])
		}
		if n < 0 || m < 0 {
			out = append(out, b...)
			break
		}
		if _, ok := set[num]; !ok {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	for _, num := range []protowire.Number{6, 7, 11, 13} {
		switch v := set[num].(type) {
		case string:
			if v != "" {
				out = protowire.AppendTag(out, num, protowire.BytesType)
				out = protowire.AppendString(out, v)
			}
		case int64:
			if v != 0 {
				out = protowire.AppendTag(out, num, protowire.VarintType)
				out = protowire.AppendVarint(out, uint64(v))
			}
		}
	}
	return out
}

// decodeClaimed reads a TaskMessage: type 1, payload 2, id 3, queue 4,
// retry 5, retried 6, timeout 8 (s), deadline 9 (Unix s), retention 12 (s).
func decodeClaimed(msg []byte) Claimed {
	c := Claimed{msg: msg}
	eachField(msg, func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			c.Type = string(v)
		case 2:
			c.Payload = append([]byte{}, v...)
		}
	}, func(num protowire.Number, v uint64) {
		switch num {
		case 5:
			c.MaxRetry = int(int32(v))
		case 6:
			c.Retried = int(int32(v))
		case 8:
			c.Timeout = time.Duration(int64(v)) * time.Second
		case 9:
			if v != 0 {
				c.Deadline = time.Unix(int64(v), 0)
			}
		case 12:
			c.Retention = time.Duration(int64(v)) * time.Second
		}
	})
	return c
}

// ExtendLease extends the lease of claimed task id of queue to until, as
// asynq's heartbeat does for the tasks its server runs (a run longer than
// [LeaseDuration] needs it). A task without a lease (recovered meanwhile)
// is left alone. It is safe for concurrent use.
func ExtendLease(ctx context.Context, rdb redis.Cmdable, queue, id string, until time.Time) error {
	if err := rdb.ZAddXX(ctx, LeaseKey(queue), redis.Z{Score: float64(until.Unix()), Member: id}).Err(); err != nil {
		return fmt.Errorf("asynqwire: extend the lease of %s in %s: %w", id, queue, err)
	}
	return nil
}
