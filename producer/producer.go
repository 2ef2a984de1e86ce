// Package producer enqueues orderworker tasks. It is what an upstream Go
// service imports to hand an order modify or exchange to the workers, and what
// the HTTP intake uses for everyone else.
//
// It owns the enqueue policy on top of the wire contract of package tasks:
// the task ID, the change's position in its order's sequence, how often a
// task is retried, how long its handler may run and how long a finished task
// is remembered. The queue of each task type is the contract's (see
// tasks.Kinds), not a setting; only the number of shards each type is
// spread over is ([Config.Shards]).
//
// It is not a worker: it processes nothing, takes no order lock and never
// touches the order store. Nor does it own the Redis client it is given; the
// caller closes that.
//
// # Order of acceptance
//
// Every change takes the next position in its order's sequence when it is
// accepted: Redis hands the position out (never a host's clock), so a change
// accepted after another one's Enqueue returned is always later, across any
// number of producer processes. The workers apply an order's changes
// strictly in that sequence. An exchange also reserves the first position
// of its replacement order, so that changes of the replacement accepted
// after it wait for the replacement to exist.
//
// On one Redis (or a Sentinel group's master) accepting a new change costs
// one round trip: one script claims the event ID, takes the positions and
// enqueues the task carrying them, all or nothing, writing the task as
// asynq's Client would (see package keyorder). On a Redis Cluster the
// claim, the positions and the queue live in different slots, so it costs
// two: the claim and the positions in one pipeline, then asynq's enqueue.
// A change sent again (its event ID claimed before) and a scheduled one
// ([WithProcessIn]) take the two-step way everywhere.
//
// # Idempotency
//
// Every task carries an event ID, the upstream's idempotency key, given with
// [WithEventID] or in the payload, or else generated (a UUIDv7). The asynq
// task ID is the event ID itself, unchanged, so a system that enqueues by hand
// can follow the same rule. An event ID names one change: one task type, one
// order, one payload. The producer refuses, as a [*DuplicateError]:
//
//   - an event ID that asynq still holds in the task's queue: while the task
//     waits, runs or waits to be retried, for [Config.Retention] after it
//     succeeds, and while it sits in the archive after failing for good
//     (asynq keeps archived tasks for up to 90 days, at most 10,000 per
//     queue; deleting it from the archive frees the event ID there);
//   - for [Config.DedupeWindow] after its first acceptance, an event ID used
//     again with another task type, another order or another payload
//     (matching [ErrPayloadMismatch] too).
//
// The same event sent again with the same payload within the dedupe window
// but after asynq forgot it is enqueued again; the worker's store then
// answers it with the recorded outcome and applies nothing twice.
package producer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/replwait"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The defaults of [Config].
const (
	// DefaultKeyPrefix is the default of [Config.KeyPrefix]: an alias of
	// the order domain's one default KEY_PREFIX, the workers' default
	// (worker.DefaultKeyPrefix) too.
	DefaultKeyPrefix = orderkeys.DefaultPrefix
	// DefaultRetention is the default of [Config.Retention].
	DefaultRetention = 24 * time.Hour
	// DefaultDedupeWindow is the default of [Config.DedupeWindow].
	DefaultDedupeWindow = 7 * 24 * time.Hour
	// DefaultMaxRetry is the default of [Config.MaxRetry].
	DefaultMaxRetry = 10
	// DefaultTimeout is the default of [Config.Timeout].
	DefaultTimeout = 2 * time.Minute
	// DefaultWaitTimeout is the default of [Config.WaitTimeout].
	DefaultWaitTimeout = time.Second
	// DefaultMaxWaiting is the default of [Config.MaxWaiting].
	DefaultMaxWaiting = 10000
	// DefaultParkFor is the default of [Config.ParkFor]: the workers'
	// default gap wait (worker.DefaultGapWait).
	DefaultParkFor = keyorder.DefaultGapWait
	// DefaultMaxScheduleAhead is the default of [Config.MaxScheduleAhead].
	DefaultMaxScheduleAhead = tasks.DefaultMaxScheduleAhead
)

// Config tunes a [Producer]. The zero value is ready to use: every zero field
// means its default.
type Config struct {
	// KeyPrefix starts orderworker's Redis keys: the order sequences live
	// under KeyPrefix+"lock:" and the event claims under
	// KeyPrefix+"event:". It must be the workers' KEY_PREFIX. It must not
	// contain "{" or "}". Defaults to "ow:".
	KeyPrefix string

	// Retention is how long asynq keeps a task after it succeeds, and with it
	// the task's ID, so that the same event enqueued again within that time
	// is refused as a duplicate and its task's state reported. asynq counts
	// it in whole seconds; it must be at least one second. Defaults to 24
	// hours.
	Retention time.Duration

	// DedupeWindow is how long an event ID stays claimed after it was first
	// accepted: within it, the same ID with another task type, another
	// order or another payload is refused (ErrPayloadMismatch). Keep it at
	// least as long as the workers' order store remembers events, so that
	// no reused ID is accepted and then refused by the store. It must be at
	// least Retention. Defaults to 7 days.
	DedupeWindow time.Duration
	// ParkFor is how long a change accepted behind unfinished changes of
	// its order waits parked at most (in its queue's retry set, where asynq
	// shows it as a retry that has not run yet) before it goes to its
	// queue's pending list by itself. The change before it normally hands
	// it the turn long before; ParkFor bounds the wait when that hand-off
	// is lost (a worker killed between the two), and how soon the workers
	// find a gap before it (a producer that died between taking a position
	// and enqueueing). Set it to the workers' GapWait (worker.Config). On
	// a Cluster (where the acceptance takes two round trips), changes are
	// not parked at acceptance: the workers park them when they find their
	// turn has not come. Defaults to 30s.
	ParkFor time.Duration

	// MaxRetry is the failure budget: how many times a task whose handler
	// failed is retried before the worker archives it. Retries back off
	// with asynq's default delay (n⁴+15 seconds plus jitter), so 10 retries
	// span about four and a half hours; an order change that has not gone
	// through by then wants a person. A negative value means no retries.
	// Waiting (for a busy order, or for the change's turn) never uses it up.
	// The asynq task carries MaxRetry+1: asynq archives a task that returns
	// any error once its retries reach that number, even when it only
	// waited, so the spare retry is what lets a task wait on its last
	// allowed attempt (the worker archives it itself after MaxRetry
	// failures). Defaults to 10.
	MaxRetry int

	// Timeout is how long the worker's handler may run for one attempt,
	// including waiting for the order lock, before its context is cancelled.
	// asynq counts it in whole seconds; it must be at least one second.
	// Defaults to 2 minutes.
	Timeout time.Duration

	// Shards spreads each task type over Shards.Count queues: a task goes
	// to its order's shard of its type's queue (tasks.Kind.QueueFor), so
	// that a Redis Cluster spreads the queues' load over its masters. It
	// must be the workers' setting. During a change of the count, a change
	// sent again is looked for in its placements under the counts that
	// drain too, so that it is refused as a duplicate there as well. It
	// must pass tasks.Shards.Validate. Defaults to one queue per type, the
	// types' own queues.
	Shards tasks.Shards

	// WaitReplicas is how many replicas must have an accepted change before
	// an enqueue reports it accepted (Redis WAIT). Redis replicates
	// asynchronously, so without it an accepted change can be lost in a
	// failover: a Sentinel failover loses what the old master acknowledged
	// until its clients switched (about a second of enqueues; see
	// docs/scaling.md, "What a failover can lose"). On one Redis the position and
	// the task are written together and a WAIT rides in the same round
	// trip. In the two-step way (a Cluster; see the package documentation)
	// the producer waits twice: on the master of the order's sequence once
	// the position is taken, before any task carries it (a task whose
	// position only an old master handed out would be refused by the
	// workers), and on the queue's master after the enqueue. A change a
	// replica did not confirm
	// is answered with an error matching [ErrNotReplicated] (and
	// [ErrUnavailable]): sent again with the same event ID, it is accepted
	// once. A duplicate is confirmed the same way before it is reported.
	// It must not exceed the replicas each master has, or every enqueue
	// fails ([Producer.CheckReplicas] tells). It costs the replicas'
	// acknowledgement, and in the two-step way two more round trips.
	// Defaults to 0: no wait.
	WaitReplicas int

	// WaitTimeout bounds each WAIT of WaitReplicas; keep it below the Redis
	// client's read timeout (3 s by default). Defaults to 1 s.
	WaitTimeout time.Duration

	// MaxWaiting caps one order's backlog: the changes accepted and not
	// yet applied (or archived), the one running included. A change past
	// it is refused with an error matching [ErrBacklogFull], and nothing
	// is written: its upstream sends it again later, rather than having
	// it accepted and then starved behind the backlog. The count and the
	// check are one step in Redis, so racing producers never pass it
	// together. A negative value means no cap. Defaults to 10,000.
	MaxWaiting int

	// Kinds are the task kinds the producer enqueues: a payload of a kind
	// missing here is refused, and the tasks and position labels it finds
	// in Redis are read against them. A program with a kind of its own
	// (tasks.NewKind) appends it to tasks.Kinds() here, and gives the
	// workers the same kinds. It must pass tasks.Table.Validate. Defaults
	// to tasks.Kinds(), the contract's.
	Kinds tasks.Table

	// MaxScheduleAhead bounds [WithProcessIn]: a change takes its
	// position when it is accepted, so every later change of its order
	// waits behind a scheduled one until it has run. A change scheduled
	// further ahead is refused with an error matching [ErrInvalidOption].
	// Defaults to 24 hours; it must be below the sequences' 7-day
	// retention.
	MaxScheduleAhead time.Duration

	// TracerProvider, when set, traces each enqueue as a span of kind
	// producer ("send <queue>", per the OpenTelemetry messaging
	// conventions) under the span of the context given, and carries that
	// span's W3C trace context in the task's payload (tasks.TraceContext),
	// so that the worker's spans of the change join the same trace. Pass
	// otel.GetTracerProvider() to use the global one. Defaults to nil:
	// no spans, and a payload's own trace context (when the caller set
	// one) is enqueued as given.
	TracerProvider trace.TracerProvider
}

// withDefaults returns c with its zero fields filled in.
func (c Config) withDefaults() Config {
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DefaultKeyPrefix)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.DedupeWindow = cmp.Or(c.DedupeWindow, DefaultDedupeWindow)
	c.ParkFor = cmp.Or(c.ParkFor, DefaultParkFor)
	c.MaxRetry = cmp.Or(c.MaxRetry, DefaultMaxRetry)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, DefaultWaitTimeout)
	c.MaxWaiting = cmp.Or(c.MaxWaiting, DefaultMaxWaiting)
	c.MaxScheduleAhead = cmp.Or(c.MaxScheduleAhead, DefaultMaxScheduleAhead)
	if c.Kinds == nil {
		c.Kinds = tasks.Kinds()
	} else {
		c.Kinds = slices.Clone(c.Kinds)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		return fmt.Errorf("producer: KeyPrefix %q contains a brace", c.KeyPrefix)
	case c.Retention < time.Second:
		return fmt.Errorf("producer: Retention %v is less than 1s", c.Retention)
	case c.DedupeWindow < c.Retention:
		return fmt.Errorf("producer: DedupeWindow %v is shorter than Retention %v", c.DedupeWindow, c.Retention)
	case c.Timeout < time.Second:
		return fmt.Errorf("producer: Timeout %v is less than 1s", c.Timeout)
	case c.ParkFor < time.Second:
		return fmt.Errorf("producer: ParkFor %v is less than 1s (asynq schedules in whole seconds)", c.ParkFor)
	case c.WaitReplicas < 0:
		return fmt.Errorf("producer: WaitReplicas %d is negative", c.WaitReplicas)
	case c.WaitTimeout < time.Millisecond:
		return fmt.Errorf("producer: WaitTimeout %v is less than 1ms", c.WaitTimeout)
	case c.MaxScheduleAhead < 0 || c.MaxScheduleAhead >= keyorder.DefaultSeqRetention:
		return fmt.Errorf("producer: MaxScheduleAhead %v is not between 0 and the sequences' retention %v", c.MaxScheduleAhead, keyorder.DefaultSeqRetention)
	}
	if err := c.Shards.Validate(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	if err := c.Kinds.Validate(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	return nil
}

// Producer enqueues order tasks. Make one with [New] and share it: it is safe
// for concurrent use by multiple goroutines.
type Producer struct {
	cfg       Config
	rdb       redis.UniversalClient
	inspector *asynq.Inspector
	ordered   *keyorder.Client // the engine's enqueue: one script (acceptAtOnce), or a reservation and its enqueue
	closed    atomic.Bool
	tracer    trace.Tracer // nil: tracing off
	// crossSlot is set once Redis refused the one-script enqueue for its
	// keys' slots (a proxy that spreads one address over shards): the producer
	// then takes the two-step way.
	crossSlot atomic.Bool
}

// Result describes an enqueued task.
type Result struct {
	// TaskID is the asynq task ID, equal to EventID.
	TaskID string `json:"task_id"`
	// Queue is the queue the task went to.
	Queue string `json:"queue"`
	// EventID is the event's ID, as given or as generated.
	EventID string `json:"event_id"`
	// Seq is the change's position in its order's sequence.
	Seq int64 `json:"seq"`
}

// New returns a Producer that enqueues through rdb, filling the zero fields of
// cfg with their defaults.
//
// The caller owns rdb: it may share it with other users, and closes it after
// the Producer is done; the Producer never closes it. It returns an error when
// rdb is nil or a field of cfg breaks its documented rules, and when the
// program links another asynq release than v0.25.1, whose private Redis
// layout orderworker relies on.
func New(rdb redis.UniversalClient, cfg Config) (*Producer, error) {
	if rdb == nil {
		return nil, errors.New("producer: nil Redis client")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	seq, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{MaxWaiting: int64(max(cfg.MaxWaiting, 0))})
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	ordered, err := keyorder.NewClient(seq, keyorder.ClientConfig{ParkFor: cfg.ParkFor, Locate: orderkeys.Locate(cfg.Shards, cfg.Kinds)})
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	return &Producer{
		cfg:       cfg,
		rdb:       rdb,
		inspector: asynq.NewInspectorFromRedisClient(rdb),
		ordered:   ordered,
		tracer:    tracing.Tracer(cfg.TracerProvider),
	}, nil
}

// Config returns the producer's configuration with the defaults filled in.
func (p *Producer) Config() Config { return p.cfg }

// Close marks the producer closed, so that later enqueues fail with
// [ErrClosed]; enqueues already under way finish. It does not close the Redis
// client given to [New], which stays the caller's.
//
// The asynq Client and Inspector inside hold nothing of their own, and since
// they were made from the caller's client their Close (in asynq v0.25.1) only
// returns an error saying the connection is shared, so Close does not call
// them. It returns nil, and may be called more than once.
func (p *Producer) Close() error {
	p.closed.Store(true)
	return nil
}

// EnqueueModify enqueues a modify of order orderNo. It builds the payload and
// calls [Producer.Enqueue]; see there for the options and errors.
// [WithNewOrderNo] and [WithReason] apply to exchanges only and fail here with
// [ErrInvalidOption].
func (p *Producer) EnqueueModify(ctx context.Context, orderNo string, changes tasks.Changes, opts ...Option) (Result, error) {
	return p.Enqueue(ctx, tasks.ModifyPayload{OrderNo: orderNo, Changes: changes}, opts...)
}

// EnqueueExchange enqueues an exchange of order orderNo for a new order
// holding items; [WithNewOrderNo] and [WithReason] fill in the payload's
// fields. It calls [Producer.Enqueue]; see there for the other options and
// the errors.
func (p *Producer) EnqueueExchange(ctx context.Context, orderNo string, items []tasks.Item, opts ...Option) (Result, error) {
	o, err := p.collect(opts)
	if err != nil {
		return Result{}, err
	}
	x := tasks.ExchangePayload{OrderNo: orderNo, Items: items}
	if o.newOrderNo != nil {
		x.NewOrderNo = *o.newOrderNo
	}
	if o.reason != nil {
		x.Reason = *o.reason
	}
	return p.enqueuePayload(ctx, x, o)
}

// Enqueue enqueues a task carrying payload, of payload's kind, to the kind's
// queue (see tasks.Kinds), or to its order's shard of it with
// [Config.Shards]. This is how the HTTP intake enqueues what it decoded.
//
// The event ID is the payload's, or the one given with [WithEventID] (giving
// both, different, is an error), or else a generated UUIDv7. The task ID is
// the event ID. The payload's position (Seq) is set here: a position the
// caller gave is ignored. The task gets [Config.MaxRetry] (or
// [WithMaxRetry]) plus one, [Config.Timeout] and [Config.Retention].
//
// It returns
//   - the payload's Validate error, unwrapped, when the payload breaks the
//     contract: it matches tasks.ErrInvalid and, where a field is at fault,
//     is a *tasks.FieldError. Nothing is enqueued.
//   - an error matching [ErrInvalidOption] for a misused option;
//   - an error matching tasks.ErrKinds when the payload's kind is not one
//     of [Config.Kinds];
//   - a [*DuplicateError], matching [ErrDuplicate] and perhaps
//     [ErrPayloadMismatch], when the event was accepted before (see the
//     package documentation). Result then describes the existing task;
//   - [ErrClosed] after [Producer.Close];
//   - a Redis or context error, wrapped with what was being enqueued and
//     matching [ErrUnavailable]. The change may or may not have been
//     accepted then: send it again with the same event ID, which is safe
//     and applies it exactly once.
//
// ctx bounds the enqueue. On a duplicate the existing task is read with
// asynq's Inspector, which takes no context: that one read is bounded by the
// Redis client's timeouts instead, and skipped when ctx is already done.
func (p *Producer) Enqueue(ctx context.Context, payload tasks.Payload, opts ...Option) (Result, error) {
	o, err := p.collect(opts)
	if err != nil {
		return Result{}, err
	}
	switch {
	case o.newOrderNo != nil:
		return Result{}, fmt.Errorf("%w: WithNewOrderNo applies to EnqueueExchange only", ErrInvalidOption)
	case o.reason != nil:
		return Result{}, fmt.Errorf("%w: WithReason applies to EnqueueExchange only", ErrInvalidOption)
	}
	return p.enqueuePayload(ctx, payload, o)
}

// enqueuePayload is Enqueue after the options were collected.
func (p *Producer) enqueuePayload(ctx context.Context, payload tasks.Payload, o options) (Result, error) {
	if k := payload.Kind(); p.cfg.Kinds.Of(k.Type) != k {
		return Result{}, fmt.Errorf("%w: producer: kind %s is not one of Config.Kinds", tasks.ErrKinds, k)
	}
	h := payload.Header()
	var err error
	if h.EventID, err = o.resolveEventID(h.EventID); err != nil {
		return Result{}, err
	}
	h.Seq = 0
	payload = payload.WithHeader(h)
	if err := payload.Validate(); err != nil {
		return Result{}, err
	}
	if p.tracer == nil {
		return p.enqueue(ctx, payload, o)
	}
	return p.enqueueTraced(ctx, payload, o)
}

// enqueueTraced is enqueue inside a producer span, whose trace context the
// task carries (tasks.TraceContext) in place of any the payload had.
func (p *Producer) enqueueTraced(ctx context.Context, payload tasks.Payload, o options) (r Result, err error) {
	kind, h := payload.Kind(), payload.Header()
	queue := kind.QueueFor(h.OrderNo, p.cfg.Shards.Count)
	ctx, span := p.tracer.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(tracing.MessagingSystem),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(queue),
			semconv.MessagingMessageID(h.EventID),
			tracing.AttrOrderNo.String(h.OrderNo),
			tracing.AttrEventID.String(h.EventID),
			tracing.AttrTaskType.String(kind.Type),
		))
	defer func() {
		var dup *DuplicateError
		switch {
		case errors.As(err, &dup):
			// A retry of an accepted change is no error; another change
			// under a taken event ID is.
			span.SetAttributes(attribute.Bool("orderworker.duplicate", true), tracing.AttrSeq.Int64(dup.Seq))
			if !dup.SamePayload {
				tracing.RecordError(span, err)
			}
		case err != nil:
			tracing.RecordError(span, err)
		default:
			span.SetAttributes(tracing.AttrSeq.Int64(r.Seq))
		}
		span.End()
	}()
	if tp, ts := tracing.Inject(ctx); tp != "" { // a provider that records nothing gives none: keep the caller's
		h.Trace = &tasks.TraceContext{Traceparent: tp, Tracestate: ts}
	}
	return p.enqueue(ctx, payload.WithHeader(h), o)
}

// collect applies opts after checking that the producer is open.
func (p *Producer) collect(opts []Option) (options, error) {
	if p.closed.Load() {
		return options{}, ErrClosed
	}
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.maxRetry != nil && *o.maxRetry < 0 {
		return options{}, fmt.Errorf("%w: WithMaxRetry(%d) is negative", ErrInvalidOption, *o.maxRetry)
	}
	if o.processIn > p.cfg.MaxScheduleAhead {
		return options{}, fmt.Errorf("%w: WithProcessIn(%v) is further ahead than MaxScheduleAhead (%v): every later change of the order would wait behind it",
			ErrInvalidOption, o.processIn, p.cfg.MaxScheduleAhead)
	}
	return o, nil
}

// resolveEventID picks the event ID from the payload's and the option's,
// generating one when neither is given.
func (o options) resolveEventID(fromPayload string) (string, error) {
	if o.eventID != nil && *o.eventID == "" {
		return "", fmt.Errorf("%w: WithEventID given an empty event ID", ErrInvalidOption)
	}
	switch {
	case o.eventID == nil && fromPayload != "":
		return fromPayload, nil
	case o.eventID != nil && fromPayload != "" && fromPayload != *o.eventID:
		return "", fmt.Errorf("%w: WithEventID(%q) conflicts with the payload's event_id %q",
			ErrInvalidOption, *o.eventID, fromPayload)
	case o.eventID != nil:
		return *o.eventID, nil
	}
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("producer: generate event ID: %w", err)
	}
	return u.String(), nil
}

// claim is what an event ID's claim holds: who took it.
type claim struct {
	typ, orderNo, fp string
}

func (c claim) String() string { return c.typ + " " + c.orderNo + " " + c.fp }

// same reports whether two claims are of the same change. Fingerprints are
// compared on their common length: an older producer wrote longer ones.
func (c claim) same(o claim) bool {
	n := min(len(c.fp), len(o.fp))
	return c.typ == o.typ && c.orderNo == o.orderNo && n > 0 && c.fp[:n] == o.fp[:n]
}

func parseClaim(s string) claim {
	f := strings.SplitN(s, " ", 3)
	for len(f) < 3 {
		f = append(f, "")
	}
	return claim{f[0], f[1], f[2]}
}

// fingerprint identifies a payload apart from its position: two payloads
// with the same fingerprint are the same change.
//
// The fingerprint hashes the JSON with HTML's characters escaped as
// encoding/json's default writes them, the encoding tasks carried before
// tasks.Marshal stopped escaping them: a change's fingerprint stays what its
// event's claim recorded, so a retry across that upgrade is still the
// duplicate it is.
//
// A payload's trace context is not part of it: the same change sent again
// under another trace is the same change.
func fingerprint(payload tasks.Payload) string {
	_, fp := encode(payload)
	return fp
}

// encode returns the JSON of payload with no position, the task's payload
// as tasks.NewTask encodes it but without its "seq" field (left out when
// zero), and the change's fingerprint, of that JSON without its trace
// context too.
func encode(payload tasks.Payload) (body []byte, fp string) {
	h := payload.Header()
	h.Seq = 0
	body = marshal(payload.WithHeader(h))
	if h.Trace == nil {
		return body, fingerprintOf(body)
	}
	h.Trace = nil
	return body, fingerprintOf(marshal(payload.WithHeader(h)))
}

func marshal(payload tasks.Payload) []byte {
	b, err := tasks.Marshal(payload)
	if err != nil {
		// Unreachable: the payloads have only strings, ints and slices of them.
		panic(err)
	}
	return b
}

// fingerprintOf is the fingerprint of a payload whose JSON without its
// position is b.
func fingerprintOf(b []byte) string {
	if bytes.ContainsAny(b, "<>&\u2028\u2029") {
		var esc bytes.Buffer
		json.HTMLEscape(&esc, b)
		b = esc.Bytes()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:4])
}

func (p *Producer) claimKey(eventID string) string {
	return p.cfg.KeyPrefix + "event:{" + eventID + "}"
}

// positions are the positions one acceptance takes: its order's, and the
// first of the order an exchange creates.
type positions struct {
	orderNo, label string
	created        string // the order the task creates, or ""
	createLabel    string
}

// enqueue accepts a valid payload. On one Redis (or a Sentinel's master) a
// new change is accepted in one round trip ([Producer.acceptAtOnce]);
// otherwise (a Cluster, a scheduled task, an event ID claimed before) it
// claims the event ID and takes the positions in one round trip, then
// enqueues the task.
func (p *Producer) enqueue(ctx context.Context, payload tasks.Payload, o options) (Result, error) {
	kind, h := payload.Kind(), payload.Header()
	body, fp := encode(payload)
	me := claim{kind.Type, h.OrderNo, fp}
	at := positions{orderNo: h.OrderNo, label: tasks.PositionLabel(kind.Type, h.EventID)}
	if c, ok := payload.(tasks.Creator); ok {
		at.created = c.Creates()
		at.createLabel = tasks.CreationLabel(h.EventID, h.OrderNo)
	}
	queue := kind.QueueFor(h.OrderNo, p.cfg.Shards.Count)
	maxRetry := p.cfg.MaxRetry
	if o.maxRetry != nil {
		maxRetry = *o.maxRetry
	}
	if _, one := p.rdb.(*redis.Client); one && o.processIn == 0 && !p.crossSlot.Load() {
		// The engine adds the one try a wait keeps (tasks.MaxRetry).
		r, done, err := p.acceptAtOnce(ctx, me, at, h.EventID, asynq.NewTask(kind.Type, body), []asynq.Option{
			asynq.Queue(queue), asynq.TaskID(h.EventID), asynq.MaxRetry(maxRetry),
			asynq.Timeout(p.cfg.Timeout), asynq.Retention(p.cfg.Retention)})
		if done || err != nil {
			return r, err
		}
	}
	res, prev, err := p.accept(ctx, h.EventID, me, at)
	if full := (*keyorder.FullError)(nil); errors.As(err, &full) {
		return Result{}, backlogFull(me, h.EventID, full)
	}
	if err != nil {
		return Result{}, &unavailableError{fmt.Errorf("producer: accept %s event %q for order %s: %w", kind.Type, h.EventID, h.OrderNo, withCause(ctx, err))}
	}
	if prev != nil && !prev.same(me) {
		// The event ID was taken for another change: refuse it before
		// anything is enqueued.
		_ = res.Void(ctx, "the event ID was taken for another change")
		dup := p.duplicate(ctx, kind.Type, prev, h.EventID, "")
		return Result{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID, Seq: dup.Seq}, dup
	}
	// With WaitReplicas, the positions must be on a replica before a task
	// carries them: a task enqueued on a new master with a position only
	// the old one handed out would be refused there.
	if err := p.replicated(ctx, h.OrderNo, at.created); err != nil {
		_ = res.Void(ctx, "the positions were not confirmed by the replicas")
		return Result{}, p.notConfirmed(me, h.EventID, err)
	}
	if prev != nil && len(p.cfg.Shards.Draining) > 0 && ctx.Err() == nil {
		// The same change again while a shard count drains: asynq refuses
		// a task ID only within one queue, so look for the task where the
		// counts that drain put it.
		if dup := p.heldElsewhere(kind, h, queue, me.fp); dup != nil {
			_ = res.Void(ctx, "the enqueue was refused as a duplicate")
			if err := p.replicated(ctx, dup.Queue); err != nil {
				return Result{}, p.notConfirmed(me, h.EventID, err)
			}
			return Result{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID, Seq: dup.Seq}, dup
		}
	}

	// The engine adds the one try a wait keeps (tasks.MaxRetry), and puts
	// the position last in the payload, as tasks.NewTask encodes it.
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.TaskID(h.EventID),
		asynq.MaxRetry(maxRetry),
		asynq.Timeout(p.cfg.Timeout),
		asynq.Retention(p.cfg.Retention),
	}
	if o.processIn > 0 {
		opts = append(opts, asynq.ProcessIn(o.processIn))
	}
	e, err := res.Enqueue(ctx, asynq.NewTask(kind.Type, body), opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// The refusal is certain: no task carries the positions just
		// taken, and the engine gave them back.
		dup := p.duplicate(ctx, kind.Type, &me, h.EventID, me.fp)
		// The task it duplicates may exist on this master only (an old
		// master after a failover): confirm it as an accepted change.
		if err := p.replicated(ctx, queue); err != nil {
			return Result{}, p.notConfirmed(me, h.EventID, err)
		}
		return Result{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID, Seq: dup.Seq}, dup
	case errors.Is(err, keyorder.ErrPayload):
		return Result{}, err // unreachable: encode writes a JSON object without "seq"
	case err != nil:
		// The task may or may not exist now: leave the positions to the
		// worker, which skips them once it is sure that no task holds them.
		return Result{}, &unavailableError{fmt.Errorf("producer: enqueue %s event %q to %s: %w", kind.Type, h.EventID, queue, withCause(ctx, err))}
	}
	if err := p.replicated(ctx, queue); err != nil {
		return Result{}, p.notConfirmed(me, h.EventID, err)
	}
	return Result{TaskID: e.TaskID, Queue: e.Queue, EventID: h.EventID, Seq: e.Pos}, nil
}

// acceptAtOnce accepts a new change on one Redis in one step, in one round
// trip, with the engine's one-script enqueue (keyorder.Client's
// EnqueueAtOnce): it claims the event ID, takes the change's position (and
// an exchange's first position of its replacement order, linked) and
// enqueues the task carrying the position, as asynq's Client would. The
// task's payload is body, the change's JSON without a position, with
// "seq" put last by the script: the bytes tasks.NewTask encodes, since Seq
// is the payloads' last field (TestSeqSpliceMatchesTheEncoding pins that
// for every kind). With [Config.WaitReplicas], the WAIT rides in the same
// pipeline (the position and the task are written together, so one WAIT
// covers both).
//
// Only the head of an order waits in the queue: a change accepted behind
// earlier changes of its order that are not finished is parked (in the
// queue's retry set, for up to Config.ParkFor), and the change before it
// hands it the turn: the worker that holds the order goes on with it in
// the same hold, or calls it back to the front of the queue.
//
// It reports done false, having written nothing, when the event ID was
// claimed before, or when Redis refused the script's keys as in different
// slots (a proxy in front of shards; the producer then keeps to the
// two-step way): the caller then takes the general path. When the queue
// holds a task with the event's ID (one whose claim has expired), the
// event ID is claimed, no position is taken, and the change is the
// duplicate of that task. Its errors are the caller's to return.
func (p *Producer) acceptAtOnce(ctx context.Context, me claim, at positions, eventID string, task *asynq.Task, opts []asynq.Option) (r Result, done bool, err error) {
	x := keyorder.AtOnce{Label: at.label, Claim: p.claimKey(eventID), ClaimValue: me.String(), ClaimTTL: p.cfg.DedupeWindow}
	if at.created != "" {
		x.Link, x.LinkLabel, x.LinkRef = at.created, at.createLabel, keyorder.CreationRef(eventID)
	}
	var wait *redis.Cmd
	if p.cfg.WaitReplicas > 0 {
		x.Pipe = func(pipe redis.Pipeliner) {
			wait = replwait.Do(ctx, pipe, p.cfg.WaitReplicas, p.cfg.WaitTimeout)
		}
	}
	e, err := p.ordered.EnqueueAtOnce(ctx, at.orderNo, task, x, opts...)
	var full *keyorder.FullError
	switch {
	case errors.Is(err, keyorder.ErrNotAtOnce):
		// Refused before it ran: this Redis spreads keys over shards.
		p.crossSlot.Store(true)
		return Result{}, false, nil
	case errors.Is(err, keyorder.ErrClaimed):
		return Result{}, false, nil
	case errors.As(err, &full):
		return Result{}, true, backlogFull(me, eventID, full)
	case errors.Is(err, asynq.ErrTaskIDConflict):
		dup := p.duplicate(ctx, me.typ, &me, eventID, me.fp)
		if err := p.replicated(ctx, dup.Queue); err != nil {
			return Result{}, true, p.notConfirmed(me, eventID, err)
		}
		return Result{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID, Seq: dup.Seq}, true, dup
	case err != nil:
		return Result{}, true, &unavailableError{fmt.Errorf("producer: accept %s event %q for order %s: %w", me.typ, eventID, me.orderNo, withCause(ctx, err))}
	}
	if wait != nil {
		if err := p.waited(wait); err != nil {
			return Result{}, true, p.notConfirmed(me, eventID, err)
		}
	}
	return Result{TaskID: e.TaskID, Queue: e.Queue, EventID: eventID, Seq: e.Pos}, true, nil
}

// notConfirmed wraps an error of [Producer.replicated] for the caller.
func (p *Producer) notConfirmed(c claim, eventID string, err error) error {
	return &unavailableError{fmt.Errorf("producer: confirm %s event %q for order %s: %w", c.typ, eventID, c.orderNo, err)}
}

// replicated returns nil once [Config.WaitReplicas] replicas have every
// write made so far on the masters of the slots of names (order numbers
// and queues; empty names are left out), at once when WaitReplicas is 0:
// a marker key in each name's slot (KeyPrefix+"wait:{name}", kept a
// minute) and a WAIT behind it, on one connection of each master
// (replwait.Confirm). It returns an error matching [ErrNotReplicated] when
// fewer replicas acknowledged within [Config.WaitTimeout], and Redis's
// error when a call failed.
func (p *Producer) replicated(ctx context.Context, names ...string) error {
	if p.cfg.WaitReplicas == 0 {
		return nil
	}
	var markers []string
	for _, n := range names {
		if n != "" {
			markers = append(markers, p.cfg.KeyPrefix+"wait:{"+n+"}")
		}
	}
	return notReplicated(replwait.Confirm(ctx, p.rdb, markers, p.cfg.WaitReplicas, p.cfg.WaitTimeout))
}

// waited returns nil when the WAIT of wait, which ran, was acknowledged by
// [Config.WaitReplicas] replicas, and otherwise an error matching
// [ErrNotReplicated] (or Redis's).
func (p *Producer) waited(wait *redis.Cmd) error {
	return notReplicated(replwait.Check(wait, p.cfg.WaitReplicas, p.cfg.WaitTimeout))
}

// notReplicated makes replwait's ErrShort the producer's ErrNotReplicated.
func notReplicated(err error) error {
	if errors.Is(err, replwait.ErrShort) {
		return fmt.Errorf("%w: %w", ErrNotReplicated, err)
	}
	return err
}

// withCause keeps the context's error matchable with errors.Is: asynq
// flattens Redis errors to text.
func withCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// accept claims the event ID for me and takes the positions of at, in one
// round trip (the engine's reservation, keyorder.Client.Reserve). It
// returns the reservation and the claim's earlier holder, nil when the
// claim is new. On an error it has given back what it took.
func (p *Producer) accept(ctx context.Context, eventID string, me claim, at positions) (*keyorder.Reservation, *claim, error) {
	x := keyorder.AtOnce{Label: at.label, Claim: p.claimKey(eventID), ClaimValue: me.String(), ClaimTTL: p.cfg.DedupeWindow}
	if at.created != "" {
		x.Link, x.LinkLabel, x.LinkRef = at.created, at.createLabel, keyorder.CreationRef(eventID)
	}
	res, err := p.ordered.Reserve(ctx, at.orderNo, x)
	if err != nil {
		return nil, nil, err
	}
	if res.Claimed == "" {
		return res, nil, nil
	}
	c := parseClaim(res.Claimed)
	return res, &c, nil
}

// backlogFull is the error of a change refused by Config.MaxWaiting.
func backlogFull(c claim, eventID string, full *keyorder.FullError) error {
	return fmt.Errorf("producer: %s event %q for order %s refused: %d changes of the order wait, the most allowed (MaxWaiting %d); send it again later: %w: %w",
		c.typ, eventID, c.orderNo, full.Waiting, full.Max, ErrBacklogFull, full)
}

// duplicate reads the task that holds eventID's task ID in the queue of
// c.typ for c.orderNo (in its placements under Config.Shards, the first
// that has it) and describes it. fp is the refused payload's fingerprint,
// or "" when c is already known to be another change.
func (p *Producer) duplicate(ctx context.Context, typ string, c *claim, eventID, fp string) *DuplicateError {
	k := p.cfg.Kinds.Of(c.typ)
	if k == nil || !tasks.ValidOrderNo(c.orderNo) {
		k = tasks.Modify // a claim this producer did not write
	}
	queues := p.cfg.Shards.Placements(k, c.orderNo)
	dup := &DuplicateError{TaskID: eventID, Queue: queues[0], EventID: eventID}
	if fp == "" {
		dup.Other = &Claim{Type: c.typ, OrderNo: c.orderNo}
	}
	if err := context.Cause(ctx); err != nil {
		dup.LookupErr = err
		return dup
	}
	for _, queue := range queues {
		info, err := p.inspector.GetTaskInfo(queue, eventID)
		if err != nil {
			if dup.Other == nil && dup.LookupErr == nil {
				dup.LookupErr = fmt.Errorf("read task %q in %s: %w", eventID, queue, err)
			}
			continue
		}
		dup.Queue, dup.LookupErr = queue, nil
		p.describe(dup, info, typ, fp)
		return dup
	}
	return dup
}

// heldElsewhere looks for the task of h's event in the placements of kind
// for h's order under the counts that drain, other than queue, where the
// enqueue goes. It returns the *DuplicateError describing the task when one
// holds it, nil when none does (or the lookup failed: the enqueue then goes
// on, and the store applies the change at most once).
// asynq's Inspector takes no context: the caller skips it when its context
// is done.
func (p *Producer) heldElsewhere(kind *tasks.Kind, h tasks.Header, queue, fp string) *DuplicateError {
	for _, q := range p.cfg.Shards.Placements(kind, h.OrderNo) {
		if q == queue {
			continue
		}
		info, err := p.inspector.GetTaskInfo(q, h.EventID)
		if err != nil {
			continue
		}
		dup := &DuplicateError{TaskID: h.EventID, Queue: q, EventID: h.EventID}
		p.describe(dup, info, kind.Type, fp)
		return dup
	}
	return nil
}

// describe fills in dup from the existing task info: its state, position,
// and whether its payload is the refused one of type typ (fingerprint
// fp).
func (p *Producer) describe(dup *DuplicateError, info *asynq.TaskInfo, typ, fp string) {
	dup.State = info.State
	if k := p.cfg.Kinds.Of(info.Type); k != nil {
		if existing, err := k.Parse(info.Payload); err == nil {
			dup.Seq = existing.Header().Seq
			dup.SamePayload = fp != "" && info.Type == typ && fingerprint(existing) == fp
		}
	}
}

// CheckReplicas returns nil when the masters of the producer's queues
// (each shard's, under [Config.Shards]) confirm a write to
// [Config.WaitReplicas] replicas within [Config.WaitTimeout], at once when
// WaitReplicas is 0, and otherwise an error matching [ErrNotReplicated]
// (or Redis's): until they can, every enqueue fails. It makes the same
// marker write and WAIT as an enqueue, so it needs no more than an
// enqueue's Redis permissions (INFO and ROLE are in @dangerous). On a
// Cluster the masters of orders without a queue are not checked. Call it
// at start-up to warn of a setting above the deployment's replicas; a
// master whose replica is rejoining after a failover fails it too, for a
// while.
func (p *Producer) CheckReplicas(ctx context.Context) error {
	var queues []string
	for _, k := range p.cfg.Kinds {
		queues = append(queues, k.ShardQueues(p.cfg.Shards.Count)...)
	}
	if err := p.replicated(ctx, queues...); err != nil {
		return fmt.Errorf("producer: check replicas: %w", err)
	}
	return nil
}
