// Package producer enqueues orderworker tasks. It is what an upstream Go
// service imports to hand an order modify or exchange to the workers, and what
// the HTTP intake uses for everyone else.
//
// It owns the enqueue policy on top of the wire contract of package tasks:
// which queue a task goes to, its task ID, how often it is retried, how long
// its handler may run and how long a finished task is remembered.
//
// It is not a worker: it processes nothing, takes no order lock and never
// touches the order store. Nor does it own the Redis client it is given; the
// caller closes that.
//
// # Idempotency
//
// Every task carries an event ID, the upstream's idempotency key, given with
// [WithEventID] or in the payload, or else generated (a UUIDv7). The asynq
// task ID is the event ID itself, unchanged, so a system that enqueues by hand
// can follow the same rule. asynq refuses a task ID it still holds in the
// queue, and the producer reports that as a [*DuplicateError]. asynq holds an
// ID
//
//   - while the task waits, runs or waits to be retried;
//   - for [Config.Retention] after the task succeeds;
//   - while the task sits in the archive after failing for good (asynq keeps
//     archived tasks for up to 90 days, at most 10,000 per queue). Deleting it
//     from the archive, with asynqmon for example, frees the event ID.
//
// Task IDs are scoped to a queue, and modifies and exchanges have queues of
// their own, so one event ID can be enqueued once as each. Upstreams should
// not reuse an event ID across task types.
package producer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/tasks"
)

// The defaults of [Config].
const (
	// DefaultRetention is the default of [Config.Retention].
	DefaultRetention = 24 * time.Hour
	// DefaultMaxRetry is the default of [Config.MaxRetry].
	DefaultMaxRetry = 10
	// DefaultTimeout is the default of [Config.Timeout].
	DefaultTimeout = 2 * time.Minute
)

// Config tunes a [Producer]. The zero value is ready to use: every zero field
// means its default.
type Config struct {
	// ModifyQueue is the queue of modify tasks. Change it only together with
	// the workers' configuration. It is 1 to 64 characters of A-Z, a-z, 0-9,
	// '_', '-', '.' and ':', and differs from ExchangeQueue. Defaults to
	// tasks.QueueModify ("order_modify").
	ModifyQueue string

	// ExchangeQueue is the queue of exchange tasks, which the workers serve
	// with a higher priority. Its rules are those of ModifyQueue. Defaults to
	// tasks.QueueExchange ("order_exchange").
	ExchangeQueue string

	// Retention is how long asynq keeps a task after it succeeds, and with it
	// the task's ID, so that the same event enqueued again within that time
	// is refused as a duplicate. asynq counts it in whole seconds; it must be
	// at least one second. Defaults to 24 hours.
	Retention time.Duration

	// MaxRetry is how many times a failed task is retried before asynq
	// archives it. Retries back off with asynq's default delay (n⁴+15
	// seconds plus jitter), so 10 retries span about four and a half hours;
	// an order change that has not gone through by then wants a person. A
	// negative value means no retries. Waiting for a busy order lock does not
	// use up retries (that is the worker's policy). Defaults to 10.
	MaxRetry int

	// Timeout is how long the worker's handler may run for one attempt,
	// including waiting for the order lock, before its context is cancelled.
	// asynq counts it in whole seconds; it must be at least one second.
	// Defaults to 2 minutes.
	Timeout time.Duration
}

// withDefaults returns c with its zero fields filled in.
func (c Config) withDefaults() Config {
	c.ModifyQueue = cmp.Or(c.ModifyQueue, tasks.QueueModify)
	c.ExchangeQueue = cmp.Or(c.ExchangeQueue, tasks.QueueExchange)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.MaxRetry = cmp.Or(c.MaxRetry, DefaultMaxRetry)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	return c
}

func (c Config) validate() error {
	switch {
	case !validQueue(c.ModifyQueue):
		return fmt.Errorf("producer: invalid ModifyQueue %q: want 1 to 64 characters of [A-Za-z0-9_.:-]", c.ModifyQueue)
	case !validQueue(c.ExchangeQueue):
		return fmt.Errorf("producer: invalid ExchangeQueue %q: want 1 to 64 characters of [A-Za-z0-9_.:-]", c.ExchangeQueue)
	case c.ModifyQueue == c.ExchangeQueue:
		return fmt.Errorf("producer: ModifyQueue and ExchangeQueue are both %q; exchanges need a queue of their own", c.ModifyQueue)
	case c.Retention < time.Second:
		return fmt.Errorf("producer: Retention %v is less than 1s", c.Retention)
	case c.Timeout < time.Second:
		return fmt.Errorf("producer: Timeout %v is less than 1s", c.Timeout)
	}
	return nil
}

// validQueue reports whether name is a queue name that is safe inside asynq's
// hash-tagged keys ("asynq:{name}:...").
func validQueue(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// Producer enqueues order tasks. Make one with [New] and share it: it is safe
// for concurrent use by multiple goroutines.
type Producer struct {
	cfg       Config
	client    *asynq.Client
	inspector *asynq.Inspector
	closed    atomic.Bool
}

// Result describes an enqueued task.
type Result struct {
	// TaskID is the asynq task ID, equal to EventID.
	TaskID string `json:"task_id"`
	// Queue is the queue the task went to.
	Queue string `json:"queue"`
	// EventID is the event's ID, as given or as generated.
	EventID string `json:"event_id"`
}

// New returns a Producer that enqueues through rdb, filling the zero fields of
// cfg with their defaults.
//
// The caller owns rdb: it may share it with other users, and closes it after
// the Producer is done; the Producer never closes it. It returns an error when
// rdb is nil or a field of cfg breaks its documented rules.
func New(rdb redis.UniversalClient, cfg Config) (*Producer, error) {
	if rdb == nil {
		return nil, errors.New("producer: nil Redis client")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Producer{
		cfg:       cfg,
		client:    asynq.NewClientFromRedisClient(rdb),
		inspector: asynq.NewInspectorFromRedisClient(rdb),
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
// calls [Producer.EnqueueModifyPayload]; see there for the options and errors.
// [WithNewOrderNo] and [WithReason] apply to exchanges only and fail here with
// [ErrInvalidOption].
func (p *Producer) EnqueueModify(ctx context.Context, orderNo string, changes tasks.Changes, opts ...Option) (Result, error) {
	return p.EnqueueModifyPayload(ctx, tasks.ModifyPayload{OrderNo: orderNo, Changes: changes}, opts...)
}

// EnqueueExchange enqueues an exchange of order orderNo for a new order
// holding items. It builds the payload and calls
// [Producer.EnqueueExchangePayload]; see there for the options and errors.
func (p *Producer) EnqueueExchange(ctx context.Context, orderNo string, items []tasks.Item, opts ...Option) (Result, error) {
	return p.EnqueueExchangePayload(ctx, tasks.ExchangePayload{OrderNo: orderNo, Items: items}, opts...)
}

// EnqueueModifyPayload enqueues a modify given as a whole payload, as the HTTP
// intake decodes it, to [Config.ModifyQueue].
//
// The event ID is the payload's, or the one given with [WithEventID] (giving
// both, different, is an error), or else a generated UUIDv7. The task ID is
// the event ID. The task gets [Config.MaxRetry] (or [WithMaxRetry]),
// [Config.Timeout] and [Config.Retention].
//
// It returns
//   - the [tasks.ModifyPayload.Validate] error, unwrapped, when the payload
//     breaks the contract: it matches tasks.ErrInvalid and, where a field is at fault,
//     is a *tasks.FieldError. Nothing is enqueued.
//   - an error matching [ErrInvalidOption] for a misused option;
//   - a [*DuplicateError], matching [ErrDuplicate] and perhaps
//     [ErrPayloadMismatch], when the event was enqueued before (see the
//     package documentation). Result then describes the existing task too;
//   - [ErrClosed] after [Producer.Close];
//   - a Redis or context error, wrapped with what was being enqueued.
//
// ctx bounds the enqueue. On a duplicate the existing task is read with
// asynq's Inspector, which takes no context: that one read is bounded by the
// Redis client's timeouts instead, and skipped when ctx is already done.
func (p *Producer) EnqueueModifyPayload(ctx context.Context, payload tasks.ModifyPayload, opts ...Option) (Result, error) {
	o, err := p.collect(opts)
	if err != nil {
		return Result{}, err
	}
	switch {
	case o.newOrderNo != nil:
		return Result{}, fmt.Errorf("%w: WithNewOrderNo applies to exchanges only", ErrInvalidOption)
	case o.reason != nil:
		return Result{}, fmt.Errorf("%w: WithReason applies to exchanges only", ErrInvalidOption)
	}
	if payload.EventID, err = o.resolveEventID(payload.EventID); err != nil {
		return Result{}, err
	}
	task, err := tasks.NewModifyTask(payload)
	if err != nil {
		return Result{}, err
	}
	return p.enqueue(ctx, task, p.cfg.ModifyQueue, payload.EventID, o)
}

// EnqueueExchangePayload enqueues an exchange given as a whole payload to
// [Config.ExchangeQueue], as [Producer.EnqueueModifyPayload] does a modify,
// with the same errors ([tasks.ExchangePayload.Validate] for a bad payload). [WithNewOrderNo] and [WithReason] fill in the
// payload's fields; giving a field both ways with different values fails with
// [ErrInvalidOption].
func (p *Producer) EnqueueExchangePayload(ctx context.Context, payload tasks.ExchangePayload, opts ...Option) (Result, error) {
	o, err := p.collect(opts)
	if err != nil {
		return Result{}, err
	}
	if payload.EventID, err = o.resolveEventID(payload.EventID); err != nil {
		return Result{}, err
	}
	if payload.NewOrderNo, err = merge("WithNewOrderNo", "new_order_no", payload.NewOrderNo, o.newOrderNo); err != nil {
		return Result{}, err
	}
	if payload.Reason, err = merge("WithReason", "reason", payload.Reason, o.reason); err != nil {
		return Result{}, err
	}
	task, err := tasks.NewExchangeTask(payload)
	if err != nil {
		return Result{}, err
	}
	return p.enqueue(ctx, task, p.cfg.ExchangeQueue, payload.EventID, o)
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
	return o, nil
}

// resolveEventID picks the event ID from the payload's and the option's,
// generating one when neither is given.
func (o options) resolveEventID(fromPayload string) (string, error) {
	if o.eventID != nil && *o.eventID == "" {
		return "", fmt.Errorf("%w: WithEventID given an empty event ID", ErrInvalidOption)
	}
	id, err := merge("WithEventID", "event_id", fromPayload, o.eventID)
	if err != nil || id != "" {
		return id, err
	}
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("producer: generate event ID: %w", err)
	}
	return u.String(), nil
}

// merge combines a payload field with the option that may also set it.
func merge(option, field, fromPayload string, fromOption *string) (string, error) {
	switch {
	case fromOption == nil:
		return fromPayload, nil
	case fromPayload != "" && fromPayload != *fromOption:
		return "", fmt.Errorf("%w: %s(%q) conflicts with the payload's %s %q",
			ErrInvalidOption, option, *fromOption, field, fromPayload)
	}
	return *fromOption, nil
}

// enqueue sends task with the producer's policy and turns a task ID conflict
// into a *DuplicateError.
func (p *Producer) enqueue(ctx context.Context, task *asynq.Task, queue, eventID string, o options) (Result, error) {
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.TaskID(eventID),
		asynq.MaxRetry(p.cfg.MaxRetry),
		asynq.Timeout(p.cfg.Timeout),
		asynq.Retention(p.cfg.Retention),
	}
	if o.maxRetry != nil {
		opts = append(opts, asynq.MaxRetry(*o.maxRetry))
	}
	if o.processIn > 0 {
		opts = append(opts, asynq.ProcessIn(o.processIn))
	}
	info, err := p.client.EnqueueContext(ctx, task, opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		dup := p.duplicate(ctx, task, queue, eventID)
		return Result{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID}, dup
	case err != nil:
		err = fmt.Errorf("producer: enqueue %s event %q to %s: %w", task.Type(), eventID, queue, err)
		// asynq flattens Redis errors to text; keep the context's error
		// matchable with errors.Is.
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return Result{}, err
	}
	return Result{TaskID: info.ID, Queue: info.Queue, EventID: eventID}, nil
}

// duplicate reads the task that holds eventID's task ID and compares it with
// task.
func (p *Producer) duplicate(ctx context.Context, task *asynq.Task, queue, eventID string) *DuplicateError {
	dup := &DuplicateError{TaskID: eventID, Queue: queue, EventID: eventID}
	if err := context.Cause(ctx); err != nil {
		dup.LookupErr = err
		return dup
	}
	info, err := p.inspector.GetTaskInfo(queue, eventID)
	if err != nil {
		dup.LookupErr = fmt.Errorf("read task %q in %s: %w", eventID, queue, err)
		return dup
	}
	dup.State = info.State
	dup.SamePayload = info.Type == task.Type() && bytes.Equal(info.Payload, task.Payload())
	return dup
}
