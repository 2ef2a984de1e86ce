package keyorder

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// seqField is the member of a task's JSON payload that carries its position
// in its key's sequence. [Client.Enqueue] appends it; [Runner] reads it. A
// payload given to Enqueue must not have it.
const seqField = "seq"

// ErrPayload is matched by the error of [Client.Enqueue] for a payload that
// cannot carry a position: not a JSON object, or one with a "seq" member.
var ErrPayload = errors.New("keyorder: the payload must be a JSON object without a \"seq\" member")

// ClientConfig tunes a [Client]. The zero value means all defaults. The
// key space (the Redis keys' prefix, the sequences' retention, the cap on
// a key's waiting positions) is the [Sequencer]'s the Client is built on.
type ClientConfig struct {
	// ParkFor is the longest a task accepted behind unfinished tasks of its
	// key waits parked before asynq brings it back by itself (the task
	// before it calls it back as soon as its turn comes). A gap (a position
	// whose task will never come) is found when the task behind it comes
	// back, so keep ParkFor at most the Runners' RunnerConfig.GapWait.
	// Defaults to DefaultGapWait (30 s), the GapWait's default.
	ParkFor time.Duration
	// Locate returns where the task of a position of key waits, given its
	// label (see RunnerConfig.Locate): a void of a key's head (an enqueue
	// refused after its position was taken) wakes the parked task it
	// hands the turn to there. Defaults to reading a Client's label
	// (taskLabel); it must be the Runners' RunnerConfig.Locate.
	Locate Locate
}

// Client enqueues asynq tasks that take the next position of a key's
// sequence at acceptance: a task enqueued after another one's Enqueue
// returned runs after it, whatever clocks say and however many
// processes enqueue.
//
// A Client is safe for concurrent use. It starts no goroutine and owns no
// connection: its Sequencer's Redis client stays the caller's to close.
type Client struct {
	rdb   redis.UniversalClient
	seq   *Sequencer
	asynq *asynq.Client
	cfg   ClientConfig
}

// NewClient returns a Client that reserves the positions of seq's
// sequences (on seq's Redis, under its prefix, with its retention and its
// SeqConfig.MaxWaiting) and enqueues the tasks there. The [Runner] that
// runs them must be built on a Sequencer of the same SeqConfig.Prefix:
// the same one, in a program that does both. It returns an error for a
// nil seq or a negative setting, and when the program links another asynq
// release than v0.25.1, whose private Redis layout the Client writes.
func NewClient(seq *Sequencer, cfg ClientConfig) (*Client, error) {
	if !seq.valid() {
		return nil, errors.New("keyorder: NewClient needs a Sequencer from NewSequencer")
	}
	if err := asynqwire.CheckVersion(); err != nil {
		return nil, fmt.Errorf("keyorder: %w", err)
	}
	if cfg.ParkFor < 0 {
		return nil, errors.New("keyorder: ClientConfig: ParkFor must not be negative")
	}
	cfg.ParkFor = cmp.Or(cfg.ParkFor, DefaultGapWait)
	return &Client{rdb: seq.rdb, seq: seq, asynq: asynq.NewClientFromRedisClient(seq.rdb), cfg: cfg}, nil
}

// Enqueued is what [Client.Enqueue] accepted.
type Enqueued struct {
	// TaskID and Queue name the asynq task.
	TaskID, Queue string
	// Key is the key whose sequence the task takes a position of, and Pos
	// that position.
	Key string
	Pos int64
	// LinkPos is the position that [AtOnce].Link reserved (0 for none).
	LinkPos int64
}

// taskLabel returns the label a [Client] reserves a task's position under: its
// queue and its task ID, so that a Runner finds the task of a position.
func taskLabel(queue, taskID string) string { return queue + " " + taskID }

// parseLabel reverses taskLabel.
func parseLabel(label string) (queue, taskID string, ok bool) {
	queue, taskID, ok = strings.Cut(label, " ")
	return queue, taskID, ok && queue != "" && taskID != ""
}

// Enqueue enqueues t for key: it takes the next position of key's
// sequence and enqueues t with that position appended to its payload as
// the member "seq" (seqField). A [Runner] runs key's tasks one at a time
// in the order of their positions.
//
// t's type must not be blank, and its payload must be a JSON object
// without a "seq" member ([ErrPayload]).
// key is 1 to [MaxKeyLen] bytes of printable UTF-8 without spaces or
// braces ([ErrInvalidKey]). opts are asynq's options. asynq.Queue (default
// "default") and asynq.TaskID (1 to maxTaskIDLen bytes) must be
// printable UTF-8 without spaces: labels and the release's wake lists are
// split at spaces and newlines. asynq.TaskID defaults to a random UUID; an
// ID its queue holds already is refused with asynq.ErrTaskIDConflict, and
// takes no position.
// asynq.MaxRetry is the failure budget, as with asynq (default 25): a
// [Runner] archives a task that failed that many times and once more, and
// never counts a wait for its turn against it. asynq.Unique and
// asynq.Group are refused: a task's position is its own.
//
// On one Redis (or a Sentinel's master) Enqueue takes the position and
// enqueues the task in one script, in one round trip: a task accepted
// behind unfinished tasks of its key waits parked (in asynq's retry set,
// for up to ClientConfig.ParkFor) until its turn comes. On a Cluster, or
// with asynq.ProcessIn, asynq.ProcessAt or asynq.Deadline, it takes the
// position, then enqueues with asynq's Client; when that enqueue fails
// otherwise than by a conflict, the position stays, and the Runners skip
// it once they are sure no task holds it (see turnsConfig.GapWait). A
// task scheduled later holds its key's later tasks until it has run:
// schedule no further ahead than the key may wait.
//
// It returns a [*FullError] past SeqConfig.MaxWaiting, and Redis and
// asynq errors, wrapped.
func (c *Client) Enqueue(ctx context.Context, key string, t *asynq.Task, opts ...asynq.Option) (Enqueued, error) {
	// Refused before anything is written: it takes no position.
	o, body, err := checkTask(t, opts)
	if err != nil {
		return Enqueued{}, err
	}
	label := taskLabel(o.queue, o.id)
	if _, one := c.rdb.(*redis.Client); one && !o.later {
		return c.atOnce(ctx, key, t.Type(), body, o, AtOnce{Label: label})
	}
	res, err := c.Reserve(ctx, key, AtOnce{Label: label})
	if err != nil {
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, err)
	}
	return res.Enqueue(ctx, asynq.NewTask(t.Type(), body), append(opts[:len(opts):len(opts)], asynq.TaskID(o.id))...)
}

// AtOnce is what [Client.EnqueueAtOnce] writes in its one script besides
// the task and its position. The zero value adds nothing.
type AtOnce struct {
	// Label is the label of the task's position, which a Runner's
	// RunnerConfig.Locate reads back. Defaults to taskLabel of the task's
	// queue and ID.
	Label string
	// Claim, when not "", is a Redis key that the script sets to
	// ClaimValue for ClaimTTL (at least 1 ms) when it does not exist, before
	// anything else: when it exists, the script writes nothing and
	// EnqueueAtOnce returns an error matching [ErrClaimed]. A task ID
	// that its queue holds already is claimed all the same (and
	// EnqueueAtOnce returns asynq.ErrTaskIDConflict, having taken no
	// position): a producer that dedupes by an ID of its own claims it so.
	Claim, ClaimValue string
	ClaimTTL          time.Duration
	// Link, when not "", is another key whose next position the script
	// reserves too, under LinkLabel and LinkRef (see
	// [Sequencer.Reserve]): not capped by MaxWaiting, and never parked
	// (Enqueued.LinkPos). A task that opens another key's sequence (one
	// that creates a key) holds its first position so.
	Link, LinkLabel, LinkRef string
	// Pipe, when set, queues commands to run right after the script, in
	// its round trip (a WAIT for replicas, say); the caller reads their
	// results. EnqueueAtOnce calls it again when the script has to be
	// loaded first; [Client.Reserve] calls it once, in its first round
	// trip.
	Pipe func(redis.Pipeliner)
}

// checkClaim refuses a claim whose TTL Redis cannot keep (under 1 ms).
func (x *AtOnce) checkClaim() error {
	if x.Claim != "" && x.ClaimTTL < time.Millisecond {
		return fmt.Errorf("keyorder: claim %s: TTL %v is under 1ms", x.Claim, x.ClaimTTL)
	}
	return nil
}

// ErrNotAtOnce is matched by the error of [Client.EnqueueAtOnce] when it
// cannot enqueue in one script, having written nothing: on a Cluster
// client, with asynq.ProcessIn, ProcessAt or Deadline, or when Redis
// refuses the script's keys as in different slots (a proxy in front of
// shards). [Client.Enqueue] then takes two steps.
var ErrNotAtOnce = errors.New("keyorder: not enqueued in one script")

// ErrClaimed is matched by the error of [Client.EnqueueAtOnce] when
// [AtOnce].Claim exists already (the script then wrote nothing).
var ErrClaimed = errors.New("keyorder: claimed already")

// claimedError is the error of [Client.EnqueueAtOnce] when [AtOnce].Claim
// exists: nothing was written. Value is the claim's.
type claimedError struct {
	Key, Value string
}

func (e *claimedError) Error() string        { return "keyorder: " + e.Key + " is claimed already" }
func (e *claimedError) Is(target error) bool { return target == ErrClaimed }

// EnqueueAtOnce enqueues t for key, as [Client.Enqueue] does on one Redis,
// in one script and one round trip, with x's claim, linked reservation
// and piped commands in it: the one way a position is reserved and its
// task enqueued together, for the Client and for a producer that needs
// more in that step. opts are asynq's, as for Enqueue.
//
// It returns an error matching [ErrNotAtOnce] when it cannot (nothing is
// written: take two steps), an error matching [ErrClaimed] when x.Claim exists, an
// error matching asynq.ErrTaskIDConflict when the queue holds the task ID
// already (x.Claim, if any, is then set, and no position is taken), a
// [*FullError] past SeqConfig.MaxWaiting, [ErrPayload], and Redis
// errors, wrapped.
func (c *Client) EnqueueAtOnce(ctx context.Context, key string, t *asynq.Task, x AtOnce, opts ...asynq.Option) (Enqueued, error) {
	o, body, err := checkTask(t, opts)
	if err != nil {
		return Enqueued{}, err
	}
	if _, one := c.rdb.(*redis.Client); !one || o.later {
		return Enqueued{}, ErrNotAtOnce
	}
	return c.atOnce(ctx, key, t.Type(), body, o, x)
}

// atOnce runs enqueueScript for key's task of type typ and payload body
// (positionless), of options o, with x.
func (c *Client) atOnce(ctx context.Context, key, typ string, body []byte, o enqueueOptions, x AtOnce) (Enqueued, error) {
	label := cmp.Or(x.Label, taskLabel(o.queue, o.id))
	seqKey, ttl, maxWaiting, err := c.seq.reserveArgs(key, label, "")
	if err != nil {
		return Enqueued{}, err
	}
	claimKey, linkKey := seqKey, seqKey // unused keys stand in the key's own slot
	if err := x.checkClaim(); err != nil {
		return Enqueued{}, err
	}
	if x.Claim != "" {
		claimKey = x.Claim
	}
	if x.Link != "" {
		if linkKey, _, _, err = c.seq.reserveArgs(x.Link, x.LinkLabel, x.LinkRef); err != nil {
			return Enqueued{}, err
		}
	}
	msg := asynqwire.Message{Type: typ, ID: o.id, Queue: o.queue, MaxRetry: o.maxRetry + 1, Timeout: o.timeout, Retention: o.retention}
	keys := []string{seqKey, asynqwire.TaskKey(o.queue, o.id), asynqwire.PendingKey(o.queue), asynqwire.AllQueues, asynqwire.RetryKey(o.queue), claimKey, linkKey,
		c.seq.backlogKey(), c.seq.backlogSumKey()}
	now := time.Now()
	args := []any{label, ttl, msg.Head(), body, o.queue, o.id, now.UnixNano(), maxWaiting, now.Add(c.cfg.ParkFor).Unix(),
		x.ClaimValue, x.ClaimTTL.Milliseconds(), x.Link, x.LinkLabel, x.LinkRef}
	if x.Claim == "" {
		args[9] = ""
	}
	run := func() *redis.Cmd {
		if x.Pipe == nil {
			return enqueueScript.EvalSha(ctx, c.rdb, keys, args...)
		}
		var cmd *redis.Cmd
		_, _ = c.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			cmd = enqueueScript.EvalSha(ctx, pipe, keys, args...)
			x.Pipe(pipe)
			return nil
		}) // each command keeps its own error
		return cmd
	}
	cmd := run()
	if noScriptErr(cmd.Err()) {
		// Redis lost its script cache (a restart): nothing ran.
		if err := enqueueScript.Load(ctx, c.rdb).Err(); err != nil {
			return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, err)
		}
		cmd = run()
	}
	res, err := cmd.Slice()
	switch {
	case redis.HasErrorPrefix(err, "CROSSSLOT"):
		return Enqueued{}, fmt.Errorf("%w: %w", ErrNotAtOnce, err)
	case err != nil:
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, reserveError(key, err))
	case len(res) == 2 && res[0] == "claimed":
		v, _ := res[1].(string)
		return Enqueued{}, &claimedError{Key: x.Claim, Value: v}
	case len(res) == 1 && res[0] == "exists":
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, asynq.ErrTaskIDConflict)
	case len(res) != 3 || res[0] != "ok":
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: unexpected reply %v", o.id, key, res)
	}
	// seq_reserve's positions may come as integers or as strings.
	pos, err := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64)
	if err != nil || pos <= 0 {
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: bad position %v", o.id, key, res[1])
	}
	var link int64
	if x.Link != "" {
		if link, err = strconv.ParseInt(fmt.Sprint(res[2]), 10, 64); err != nil || link <= 0 {
			return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: bad linked position %v", o.id, key, res[2])
		}
	}
	return Enqueued{TaskID: o.id, Queue: o.queue, Key: key, Pos: pos, LinkPos: link}, nil
}

// enqueueScript takes the next position of a key and enqueues the task
// carrying it, as asynq's Client would, in one step: the one script that
// does so (the Client's Enqueue and a producer's EnqueueAtOnce). A task
// behind unfinished positions of its key is parked in the queue's retry
// set until ARGV[9] at the latest (seq_reserve marks it so), and called
// back by the task before it. The task's payload is the JSON without a
// position with "seq" put last (seq_splice).
//
// Past the cap of positions waiting it writes nothing and answers the
// error reply "FULL <waiting> <max>" (reserveError). With a claim
// (ARGV[10] not ""), it sets it first, and writes nothing more when it
// exists: {"claimed", its value}. When the queue holds a task with the ID,
// it takes no position: {"exists"}. Otherwise it returns {"ok", position,
// the linked key's position or ""}.
//
// It adds the queue to asynq's set of queues every time, where asynq's
// Client does it once per process: a queue missing from that set (lost in
// a failover, say) makes asynq's Inspector answer ErrQueueNotFound for its
// tasks, and a Runner's gap check would take a task for gone.
//
// KEYS[1] the sequence, KEYS[2] the task's hash, KEYS[3] the queue's
// pending list, KEYS[4] asynq's set of queues, KEYS[5] the queue's retry
// set, KEYS[6] the claim (KEYS[1] for none), KEYS[7] the linked key's
// sequence (KEYS[1] for none), KEYS[8] and KEYS[9] the index of backlogs
// and its sum (the script runs on one Redis only, where the key space
// keeps them). ARGV[1] the label, ARGV[2] the sequences'
// retention in ms, ARGV[3] the task message's head, ARGV[4] the payload
// without a position, ARGV[5] the queue, ARGV[6] the task ID, ARGV[7] now
// in ns, ARGV[8] the cap of positions waiting (0 for none), ARGV[9] until
// when a parked task waits (Unix s), ARGV[10] the claim's value ("" for
// none), ARGV[11] its TTL in ms, ARGV[12] the linked key ("" for none),
// ARGV[13] its label, ARGV[14] its reference.
var enqueueScript = redis.NewScript(reserveLua + asynqwire.EnqueueLua + `
local full = seq_full(KEYS[1], ARGV[8])
if full then return redis.error_reply(full) end
if ARGV[10] ~= '' then
  local prev = redis.call('SET', KEYS[6], ARGV[10], 'NX', 'GET', 'PX', ARGV[11])
  if prev then return {'claimed', prev} end
end
if asynq_exists(KEYS[2]) then return {'exists'} end
local pos, _, parked = seq_reserve(KEYS[1], ARGV[1], ARGV[2], '', 0, true, KEYS[8], KEYS[9])
local linked = ''
if ARGV[12] ~= '' then linked = seq_reserve(KEYS[7], ARGV[13], ARGV[2], ARGV[14], 0, false, KEYS[8], KEYS[9]) end
local msg = asynq_message(ARGV[3], seq_splice(ARGV[4], pos))
if parked then
  asynq_park(KEYS[2], KEYS[5], KEYS[4], ARGV[5], ARGV[6], msg, ARGV[9])
else
  asynq_enqueue(KEYS[2], KEYS[3], KEYS[4], ARGV[5], ARGV[6], msg, ARGV[7])
end
return {'ok', pos, linked}
`)

// enqueueOptions are the asynq options Enqueue reads.
type enqueueOptions struct {
	queue, id          string
	maxRetry           int
	timeout, retention time.Duration
	later              bool // ProcessIn, ProcessAt or Deadline: asynq's Client enqueues
}

func options(opts []asynq.Option) (enqueueOptions, error) {
	o := enqueueOptions{queue: "default", maxRetry: defaultMaxRetry}
	for _, opt := range opts {
		switch opt.Type() {
		case asynq.QueueOpt:
			o.queue = opt.Value().(string)
		case asynq.TaskIDOpt:
			o.id = opt.Value().(string)
		case asynq.MaxRetryOpt:
			o.maxRetry = max(opt.Value().(int), 0)
		case asynq.TimeoutOpt:
			o.timeout = opt.Value().(time.Duration)
		case asynq.RetentionOpt:
			o.retention = opt.Value().(time.Duration)
		case asynq.ProcessAtOpt, asynq.ProcessInOpt, asynq.DeadlineOpt:
			o.later = true
		case asynq.UniqueOpt, asynq.GroupOpt:
			return o, fmt.Errorf("keyorder: Enqueue refuses %s: a task's position is its own", opt)
		}
	}
	switch {
	case o.queue == "" || len(o.queue) > MaxKeyLen || !printable(o.queue):
		return o, fmt.Errorf("keyorder: queue %q must be 1 to %d bytes of printable UTF-8 without spaces", o.queue, MaxKeyLen)
	case o.id == "":
		o.id = uuid.NewString()
	case len(o.id) > maxTaskIDLen || !printable(o.id):
		// A label ("<queue> <id>") and a wake list (labels joined by
		// newlines) must read back as they were written.
		return o, fmt.Errorf("keyorder: task ID %q must be 1 to %d bytes of printable UTF-8 without spaces", o.id, maxTaskIDLen)
	}
	return o, nil
}

// maxTaskIDLen bounds the task ID a [Client] enqueues, in bytes.
const maxTaskIDLen = 128

// defaultMaxRetry is asynq's default MaxRetry.
const defaultMaxRetry = 25

// positionless checks that payload is a JSON object without a "seq" member,
// and returns it trimmed of surrounding space (an empty object as "{}").
func positionless(payload []byte) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil || members == nil {
		return nil, ErrPayload
	}
	if _, ok := members[seqField]; ok {
		return nil, ErrPayload
	}
	if len(members) == 0 {
		// "{ }" and the like: the position is appended to "{}" exactly.
		return []byte("{}"), nil
	}
	return bytes.TrimSpace(payload), nil
}

// withSeq appends the member "seq": pos to body, a JSON object trimmed of
// space, as seq_splice does in a script (reserveLua).
func withSeq(body []byte, pos int64) []byte {
	out := make([]byte, 0, len(body)+24)
	out = append(out, body[:len(body)-1]...)
	if !bytes.Equal(body, []byte("{}")) {
		out = append(out, ',')
	}
	out = append(out, `"seq":`...)
	out = strconv.AppendInt(out, pos, 10)
	return append(out, '}')
}

// payloadPos reads the position a [Client] gave a task from its payload: 0
// for a payload without one (a task enqueued otherwise runs without
// order). It returns an error for a payload that is no JSON object, or
// whose "seq" is not a positive integer.
func payloadPos(payload []byte) (int64, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil || members == nil {
		return 0, fmt.Errorf("keyorder: the payload is not a JSON object")
	}
	raw, ok := members[seqField]
	if !ok {
		return 0, nil
	}
	pos, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || pos <= 0 {
		return 0, fmt.Errorf("keyorder: the payload's %q is %s, not a positive integer", seqField, clip(string(raw)))
	}
	return pos, nil
}
