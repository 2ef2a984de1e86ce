package keyorder

import (
	"bytes"
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

	"github.com/orderworker/orderworker/internal/asynqwire"
)

// SeqField is the member of a task's JSON payload that carries its position
// in its key's sequence. [Client.Enqueue] appends it; [Runner] reads it. A
// payload given to Enqueue must not have it.
const SeqField = "seq"

// ErrPayload is matched by the error of [Client.Enqueue] for a payload that
// cannot carry a position: not a JSON object, or one with a "seq" member.
var ErrPayload = errors.New("keyorder: the payload must be a JSON object without a \"seq\" member")

// ClientConfig tunes a [Client]. The zero value means all defaults.
type ClientConfig struct {
	// Prefix starts the Redis keys of the sequences, and must be the
	// [RunnerConfig.Prefix] of the Runners that run the tasks. Defaults
	// to DefaultPrefix ("ow:lock:").
	Prefix string
	// MaxWaiting caps the positions of one key that wait (handed out and
	// not finished): past it, Enqueue refuses with a [*FullError] and
	// writes nothing. Zero means no cap.
	MaxWaiting int64
	// ParkFor is the longest a task accepted behind unfinished tasks of its
	// key waits parked before asynq brings it back by itself (the task
	// before it calls it back as soon as its turn comes). A gap (a position
	// whose task will never come) is found when the task behind it comes
	// back, so keep ParkFor at most the Runners' RunnerConfig.GapWait.
	// Defaults to DefaultGapWait (30 s), the GapWait's default.
	ParkFor time.Duration
}

// Client enqueues asynq tasks that take the next position of a key's
// sequence at acceptance: a task enqueued after another one's Enqueue
// returned runs after it, whatever clocks say and however many
// processes enqueue.
//
// A Client is safe for concurrent use. It starts no goroutine and owns no
// connection: rdb stays the caller's to close.
type Client struct {
	rdb   redis.UniversalClient
	seq   *Sequencer
	asynq *asynq.Client
	cfg   ClientConfig
}

// NewClient returns a Client that enqueues on rdb. It returns an error for
// a negative setting, and when the program links another asynq release
// than v0.25.1, whose private Redis layout the Client writes.
func NewClient(rdb redis.UniversalClient, cfg ClientConfig) (*Client, error) {
	if rdb == nil {
		return nil, errors.New("keyorder: NewClient needs a Redis client")
	}
	if err := asynqwire.CheckVersion(); err != nil {
		return nil, fmt.Errorf("keyorder: %w", err)
	}
	if cfg.MaxWaiting < 0 || cfg.ParkFor < 0 {
		return nil, errors.New("keyorder: ClientConfig: MaxWaiting and ParkFor must not be negative")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.ParkFor == 0 {
		cfg.ParkFor = DefaultGapWait
	}
	seq, err := NewSequencer(rdb, SeqConfig{Prefix: cfg.Prefix, MaxWaiting: cfg.MaxWaiting})
	if err != nil {
		return nil, err
	}
	return &Client{rdb: rdb, seq: seq, asynq: asynq.NewClientFromRedisClient(rdb), cfg: cfg}, nil
}

// Enqueued is what [Client.Enqueue] accepted.
type Enqueued struct {
	// TaskID and Queue name the asynq task.
	TaskID, Queue string
	// Key is the key whose sequence the task takes a position of, and Pos
	// that position.
	Key string
	Pos int64
}

// Label returns the label a [Client] reserves a task's position under: its
// queue and its task ID, so that a Runner finds the task of a position.
func Label(queue, taskID string) string { return queue + " " + taskID }

// parseLabel reverses [Label].
func parseLabel(label string) (queue, taskID string, ok bool) {
	queue, taskID, ok = strings.Cut(label, " ")
	return queue, taskID, ok && queue != "" && taskID != ""
}

// Enqueue enqueues t for key: it takes the next position of key's
// sequence and enqueues t with that position appended to its payload as
// the member "seq" ([SeqField]). A [Runner] runs key's tasks one at a time
// in the order of their positions.
//
// t's type must not be blank, and its payload must be a JSON object
// without a "seq" member ([ErrPayload]).
// opts are asynq's options. asynq.Queue (default "default") must not hold
// a space. asynq.TaskID defaults to a random UUID; an ID its queue holds
// already is refused with asynq.ErrTaskIDConflict, and takes no position.
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
// it once they are sure no task holds it (see [TurnsConfig.GapWait]). A
// task scheduled later holds its key's later tasks until it has run:
// schedule no further ahead than the key may wait.
//
// It returns a [*FullError] past ClientConfig.MaxWaiting, and Redis and
// asynq errors, wrapped.
func (c *Client) Enqueue(ctx context.Context, key string, t *asynq.Task, opts ...asynq.Option) (Enqueued, error) {
	if t == nil {
		return Enqueued{}, errors.New("keyorder: Enqueue: nil task")
	}
	if strings.TrimSpace(t.Type()) == "" {
		// asynq's Client refuses it too: refused first, it takes no position.
		return Enqueued{}, errors.New("keyorder: Enqueue: the task type must not be blank")
	}
	o, err := options(opts)
	if err != nil {
		return Enqueued{}, err
	}
	body, err := positionless(t.Payload())
	if err != nil {
		return Enqueued{}, err
	}
	label := Label(o.queue, o.id)
	seqKey, ttl, maxWaiting, err := c.seq.ReserveArgs(key, label, "")
	if err != nil {
		return Enqueued{}, err
	}
	if _, one := c.rdb.(*redis.Client); one && !o.later {
		msg := asynqwire.Message{Type: t.Type(), ID: o.id, Queue: o.queue, MaxRetry: o.maxRetry + 1, Timeout: o.timeout, Retention: o.retention}
		keys := []string{seqKey, asynqwire.TaskKey(o.queue, o.id), asynqwire.PendingKey(o.queue), asynqwire.AllQueues, asynqwire.RetryKey(o.queue)}
		now := time.Now()
		args := []any{label, ttl, msg.Head(), body, o.queue, o.id, now.UnixNano(), maxWaiting, now.Add(c.cfg.ParkFor).Unix()}
		res, err := enqueueScript.Run(ctx, c.rdb, keys, args...).Int64()
		switch {
		case err != nil:
			return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, ReserveError(key, err))
		case res == 0:
			return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, asynq.ErrTaskIDConflict)
		}
		return Enqueued{TaskID: o.id, Queue: o.queue, Key: key, Pos: res}, nil
	}
	pos, err := c.seq.Reserve(ctx, key, label, "")
	if err != nil {
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s: %w", o.id, key, err)
	}
	task := asynq.NewTask(t.Type(), withSeq(body, pos))
	all := append(opts[:len(opts):len(opts)], asynq.Queue(o.queue), asynq.TaskID(o.id), asynq.MaxRetry(o.maxRetry+1))
	if _, err := c.asynq.EnqueueContext(ctx, task, all...); err != nil {
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			// Certain: no task holds the position. Free it now.
			vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
			defer cancel()
			if st, verr := c.seq.Void(vctx, key, pos, label, "the enqueue was refused as a duplicate"); verr == nil {
				_ = moveLabels(vctx, c.rdb, clientLabel, key, st.Wake, asynqwire.FrontInTransit)
			}
		}
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s at position %d: %w", o.id, key, pos, err)
	}
	return Enqueued{TaskID: o.id, Queue: o.queue, Key: key, Pos: pos}, nil
}

// enqueueScript takes the next position of a key and enqueues the task
// carrying it, as asynq's Client would, in one step. It returns the
// position, or 0, having written nothing, when the queue holds a task with
// the ID already. A task behind unfinished positions of its key is parked
// in the queue's retry set until ARGV[9] at the latest (seq_reserve marks
// it so), and called back by the task before it.
//
// KEYS[1] the sequence, KEYS[2] the task's hash, KEYS[3] the queue's
// pending list, KEYS[4] asynq's set of queues, KEYS[5] the queue's retry
// set. ARGV[1] the label, ARGV[2] the sequence's retention in ms, ARGV[3]
// the task message's head, ARGV[4] the payload without a position, ARGV[5]
// the queue, ARGV[6] the task ID, ARGV[7] now in ns, ARGV[8] the cap of
// positions waiting, ARGV[9] until when a parked task waits (Unix s).
var enqueueScript = redis.NewScript(ReserveLua + asynqwire.EnqueueLua + `
local full = seq_full(KEYS[1], ARGV[8])
if full then return redis.error_reply(full) end
if asynq_exists(KEYS[2]) then return 0 end
local pos, _, parked = seq_reserve(KEYS[1], ARGV[1], ARGV[2], '', 0, true)
local msg = asynq_message(ARGV[3], seq_splice(ARGV[4], pos))
if parked then
  asynq_park(KEYS[2], KEYS[5], KEYS[4], ARGV[5], ARGV[6], msg, ARGV[9])
else
  asynq_enqueue(KEYS[2], KEYS[3], KEYS[4], ARGV[5], ARGV[6], msg, ARGV[7])
end
return pos
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
	case strings.TrimSpace(o.queue) == "" || strings.ContainsAny(o.queue, " \t\r\n"):
		return o, fmt.Errorf("keyorder: queue %q must be non-empty and hold no space", o.queue)
	case o.id == "":
		o.id = uuid.NewString()
	case strings.TrimSpace(o.id) == "":
		return o, errors.New("keyorder: the task ID must not be blank")
	}
	return o, nil
}

// defaultMaxRetry is asynq's default MaxRetry.
const defaultMaxRetry = 25

// positionless checks that payload is a JSON object without a "seq" member,
// and returns it trimmed of surrounding space (an empty object as "{}").
func positionless(payload []byte) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil || members == nil {
		return nil, ErrPayload
	}
	if _, ok := members[SeqField]; ok {
		return nil, ErrPayload
	}
	if len(members) == 0 {
		// "{ }" and the like: the position is appended to "{}" exactly.
		return []byte("{}"), nil
	}
	return bytes.TrimSpace(payload), nil
}

// withSeq appends the member "seq": pos to body, a JSON object trimmed of
// space, as seq_splice does in a script ([ReserveLua]).
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

// Position reads the position a [Client] gave a task from its payload: 0
// for a payload without one (a task enqueued otherwise runs without
// order). It returns an error for a payload that is no JSON object, or
// whose "seq" is not a positive integer.
func Position(payload []byte) (int64, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil || members == nil {
		return 0, fmt.Errorf("keyorder: the payload is not a JSON object")
	}
	raw, ok := members[SeqField]
	if !ok {
		return 0, nil
	}
	pos, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || pos <= 0 {
		return 0, fmt.Errorf("keyorder: the payload's %q is %s, not a positive integer", SeqField, clip(string(raw)))
	}
	return pos, nil
}
