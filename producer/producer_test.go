package producer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
)

type env struct {
	p    *producer.Producer
	insp *asynq.Inspector
	db   *redistest.DB
}

// newEnv returns a producer on a database of the test's own, and an
// inspector to read back what it enqueued.
func newEnv(t *testing.T, cfg producer.Config) env {
	t.Helper()
	db := redistest.New(t)
	p, err := producer.New(db.Client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return env{p: p, insp: asynq.NewInspectorFromRedisClient(db.Client), db: db}
}

// requireEmpty checks that nothing at all was written to Redis.
func (e env) requireEmpty(t *testing.T) {
	t.Helper()
	n, err := e.db.Client.DBSize(t.Context()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing is enqueued")
}

func TestEnqueueModify(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Address: new("1 Main St"), Items: []tasks.Item{{SKU: "A", Qty: 2}}}

	res, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	require.Positive(t, res.Seq)
	assert.Equal(t, producer.Result{TaskID: "evt-1", Queue: "order_modify", EventID: "evt-1", Seq: res.Seq}, res)

	info, err := e.insp.GetTaskInfo("order_modify", "evt-1")
	require.NoError(t, err)
	assert.Equal(t, tasks.TypeModify, info.Type)
	assert.Equal(t, `{"event_id":"evt-1","order_no":"SO1","changes":{"address":"1 Main St","items":[{"sku":"A","qty":2}]},"seq":`+
		strconv.FormatInt(res.Seq, 10)+`}`, string(info.Payload))
	assert.Equal(t, asynq.TaskStatePending, info.State)
	assert.Equal(t, producer.DefaultMaxRetry+1, info.MaxRetry, "the budget plus the spare retry")
	assert.Equal(t, producer.DefaultTimeout, info.Timeout)
	assert.Equal(t, producer.DefaultRetention, info.Retention)

	got, err := tasks.Parse[tasks.ModifyPayload](info.Payload)
	require.NoError(t, err)
	assert.Equal(t, tasks.ModifyPayload{EventID: "evt-1", OrderNo: "SO1", Changes: changes, Seq: res.Seq}, got)
}

func TestEnqueueExchange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	items := []tasks.Item{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 3}}

	res, err := e.p.EnqueueExchange(t.Context(), "SO1", items,
		producer.WithEventID("evt-2"), producer.WithNewOrderNo("SO2"), producer.WithReason("size"))
	require.NoError(t, err)
	assert.Equal(t, producer.Result{TaskID: "evt-2", Queue: "order_exchange", EventID: "evt-2", Seq: res.Seq}, res)

	info, err := e.insp.GetTaskInfo("order_exchange", "evt-2")
	require.NoError(t, err)
	assert.Equal(t, tasks.TypeExchange, info.Type)
	assert.Equal(t, `{"event_id":"evt-2","order_no":"SO1","items":[{"sku":"A","qty":1},{"sku":"B","qty":3}],"new_order_no":"SO2","reason":"size","seq":`+
		strconv.FormatInt(res.Seq, 10)+`}`, string(info.Payload))
	assert.Equal(t, producer.DefaultMaxRetry+1, info.MaxRetry)
	assert.Equal(t, producer.DefaultTimeout, info.Timeout)
	assert.Equal(t, producer.DefaultRetention, info.Retention)
}

func TestEnqueuePayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})

	// The payload's event ID is used; repeating it as an option is fine.
	res, err := e.p.Enqueue(t.Context(),
		tasks.ModifyPayload{EventID: "evt-3", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}},
		producer.WithEventID("evt-3"))
	require.NoError(t, err)
	assert.Equal(t, producer.Result{TaskID: "evt-3", Queue: "order_modify", EventID: "evt-3", Seq: res.Seq}, res)

	// A position the caller gives is replaced by the one Redis hands out.
	res, err = e.p.Enqueue(t.Context(),
		tasks.ExchangePayload{EventID: "evt-4", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}, NewOrderNo: "SO2", Reason: "size", Seq: 7})
	require.NoError(t, err)
	assert.Equal(t, producer.Result{TaskID: "evt-4", Queue: "order_exchange", EventID: "evt-4", Seq: res.Seq}, res)
	info, err := e.insp.GetTaskInfo("order_exchange", "evt-4")
	require.NoError(t, err)
	assert.Equal(t, `{"event_id":"evt-4","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":"SO2","reason":"size","seq":`+
		strconv.FormatInt(res.Seq, 10)+`}`, string(info.Payload))
}

func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := producer.Config{
		KeyPrefix:        "p:",
		Retention:        time.Hour,
		DedupeWindow:     2 * time.Hour,
		MaxRetry:         3,
		Timeout:          30 * time.Second,
		WaitTimeout:      time.Second,
		MaxWaiting:       50,
		MaxScheduleAhead: time.Hour,
		ParkFor:          5 * time.Second,
		Kinds:            tasks.Kinds(),
	}
	e := newEnv(t, cfg)
	assert.Equal(t, cfg, e.p.Config())

	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("m"))
	require.NoError(t, err)
	_, err = e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithEventID("x"))
	require.NoError(t, err)

	for _, at := range []struct{ queue, id string }{{"order_modify", "m"}, {"order_exchange", "x"}} {
		info, err := e.insp.GetTaskInfo(at.queue, at.id)
		require.NoError(t, err)
		assert.Equal(t, 4, info.MaxRetry)
		assert.Equal(t, 30*time.Second, info.Timeout)
		assert.Equal(t, time.Hour, info.Retention)
	}
}

func TestConfig_Defaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	assert.Equal(t, producer.Config{
		KeyPrefix:        "ow:",
		Retention:        24 * time.Hour,
		DedupeWindow:     7 * 24 * time.Hour,
		MaxRetry:         10,
		Timeout:          2 * time.Minute,
		WaitTimeout:      time.Second,
		MaxWaiting:       10000,
		MaxScheduleAhead: 24 * time.Hour,
		ParkFor:          30 * time.Second,
		Kinds:            tasks.Kinds(),
	}, e.p.Config())
}

func TestConfig_NoRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{MaxRetry: -1})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("e"))
	require.NoError(t, err)
	info, err := e.insp.GetTaskInfo("order_modify", "e")
	require.NoError(t, err)
	assert.Equal(t, 1, info.MaxRetry, "no retry of a failure; the spare one is for waiting")
}

func TestNew_InvalidConfig(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	tests := []struct {
		name string
		cfg  producer.Config
		msg  string
	}{
		{"prefix with a brace", producer.Config{KeyPrefix: "ow{"},
			`producer: KeyPrefix "ow{" contains a brace`},
		{"dedupe window under the retention", producer.Config{Retention: 48 * time.Hour, DedupeWindow: time.Hour},
			"producer: DedupeWindow 1h0m0s is shorter than Retention 48h0m0s"},
		{"negative retention", producer.Config{Retention: -time.Hour},
			"producer: Retention -1h0m0s is less than 1s"},
		{"sub-second retention", producer.Config{Retention: time.Millisecond},
			"producer: Retention 1ms is less than 1s"},
		{"sub-second timeout", producer.Config{Timeout: 999 * time.Millisecond},
			"producer: Timeout 999ms is less than 1s"},
		{"negative replicas to wait for", producer.Config{WaitReplicas: -1},
			"producer: WaitReplicas -1 is negative"},
		{"negative wait timeout", producer.Config{WaitReplicas: 1, WaitTimeout: -time.Second},
			"producer: WaitTimeout -1s is less than 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := producer.New(db.Client, tt.cfg)
			assert.Nil(t, p)
			assert.EqualError(t, err, tt.msg)
		})
	}
}

func TestNew_NilClient(t *testing.T) {
	t.Parallel()
	_, err := producer.New(nil, producer.Config{})
	assert.EqualError(t, err, "producer: nil Redis client")
}

func TestWithMaxRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")},
		producer.WithEventID("e"), producer.WithMaxRetry(-1), producer.WithMaxRetry(0))
	require.NoError(t, err, "a later option overrides an earlier one")
	info, err := e.insp.GetTaskInfo("order_modify", "e")
	require.NoError(t, err)
	assert.Equal(t, 1, info.MaxRetry)
}

// A change scheduled for later is accepted in two steps (the engine's
// Reserve, then its enqueue): it carries the same retry rule as one
// accepted in one script (its budget plus the spare try for waiting, one
// at a budget of 0 or below) and its position as the payload's seq.
func TestTwoStepsRetriesAndPosition(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  producer.Config
		opts []producer.Option
		want int
	}{
		{"default", producer.Config{}, nil, producer.DefaultMaxRetry + 1},
		{"MaxRetry 0", producer.Config{}, []producer.Option{producer.WithMaxRetry(0)}, 1},
		{"Config.MaxRetry -1", producer.Config{MaxRetry: -1}, nil, 1},
		{"MaxRetry 3", producer.Config{}, []producer.Option{producer.WithMaxRetry(3)}, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tt.cfg)
			opts := append([]producer.Option{producer.WithEventID("later"), producer.WithProcessIn(time.Hour)}, tt.opts...)
			res, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, opts...)
			require.NoError(t, err)
			info, err := e.insp.GetTaskInfo("order_modify", "later")
			require.NoError(t, err)
			assert.Equal(t, asynq.TaskStateScheduled, info.State)
			assert.Equal(t, tt.want, info.MaxRetry)
			p, err := tasks.Modify.Parse(info.Payload)
			require.NoError(t, err)
			assert.Positive(t, res.Seq)
			assert.Equal(t, res.Seq, p.Header().Seq, "the payload carries the position the result reports")
		})
	}
}

func TestWithProcessIn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	before := time.Now()
	_, err := e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}},
		producer.WithEventID("later"), producer.WithProcessIn(time.Hour))
	require.NoError(t, err)
	_, err = e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}},
		producer.WithEventID("now"), producer.WithProcessIn(-time.Second))
	require.NoError(t, err)

	info, err := e.insp.GetTaskInfo("order_exchange", "later")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateScheduled, info.State)
	assert.WithinRange(t, info.NextProcessAt, before.Add(time.Hour).Truncate(time.Second), time.Now().Add(time.Hour))

	info, err = e.insp.GetTaskInfo("order_exchange", "now")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State)

	// A scheduled event is held as well.
	_, err = e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithEventID("later"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, asynq.TaskStateScheduled, dup.State)
	assert.True(t, dup.SamePayload)
}

func TestDuplicate_SamePayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Address: new("1 Main St")}
	first, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)

	res, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	assert.NotErrorIs(t, err, producer.ErrPayloadMismatch)
	assert.Equal(t, first, res, "the result describes the existing task")
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, &producer.DuplicateError{
		TaskID: "evt-1", Queue: "order_modify", EventID: "evt-1", Seq: first.Seq, SamePayload: true, State: asynq.TaskStatePending,
	}, dup)
	assert.EqualError(t, err, `producer: duplicate event "evt-1": task "evt-1" already in queue order_modify (pending)`)

	pending, err := e.insp.ListPendingTasks("order_modify")
	require.NoError(t, err)
	assert.Len(t, pending, 1)
}

func TestDuplicate_DifferentPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Address: new("1 Main St")}, producer.WithEventID("evt-1"))
	require.NoError(t, err)

	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Address: new("2 Main St")}, producer.WithEventID("evt-1"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	require.ErrorIs(t, err, producer.ErrPayloadMismatch)
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.False(t, dup.SamePayload)
	assert.NoError(t, dup.LookupErr)
	assert.Equal(t, "evt-1", dup.TaskID)
	assert.EqualError(t, err,
		`producer: duplicate event "evt-1" for a different change: it was accepted for order:modify of order SO1 (task "evt-1" in queue order_modify, pending)`)

	info, err := e.insp.GetTaskInfo("order_modify", "evt-1")
	require.NoError(t, err)
	assert.Contains(t, string(info.Payload), "1 Main St", "the first task is kept")
}

// Exchanges reusing an event ID are compared on their payload too, whatever
// the option or payload field that carried it.
func TestDuplicate_Exchange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	items := []tasks.Item{{SKU: "A", Qty: 1}}
	_, err := e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("x"), producer.WithReason("size"))
	require.NoError(t, err)

	_, err = e.p.Enqueue(t.Context(),
		tasks.ExchangePayload{EventID: "x", OrderNo: "SO1", Items: items, Reason: "size"})
	require.ErrorIs(t, err, producer.ErrDuplicate)
	assert.NotErrorIs(t, err, producer.ErrPayloadMismatch)

	_, err = e.p.EnqueueExchange(t.Context(), "SO1", items, producer.WithEventID("x"))
	assert.ErrorIs(t, err, producer.ErrPayloadMismatch)
}

func TestDuplicate_Archived(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Remark: new("r")}
	_, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	require.NoError(t, e.insp.ArchiveTask("order_modify", "evt-1"))

	_, err = e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, asynq.TaskStateArchived, dup.State)
	assert.True(t, dup.SamePayload)

	// Deleting the archived task frees the event ID.
	require.NoError(t, e.insp.DeleteTask("order_modify", "evt-1"))
	_, err = e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)
}

// A task that ran to completion keeps its ID for Config.Retention.
func TestDuplicate_Completed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Remark: new("r")}
	_, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)

	handled := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(e.db.Client, asynq.Config{
		Concurrency: 1,
		Queues:      map[string]int{"order_modify": 1},
		LogLevel:    asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(handled)
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	select {
	case <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("the task was not handled")
	}
	// asynq records the completion just after the handler returns.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := e.insp.GetTaskInfo("order_modify", "evt-1")
		require.NoError(c, err)
		assert.Equal(c, asynq.TaskStateCompleted, info.State)
	}, 10*time.Second, 10*time.Millisecond)

	_, err = e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Equal(t, asynq.TaskStateCompleted, dup.State)
	assert.True(t, dup.SamePayload)
}

// When the existing task cannot be read, the error still says duplicate but
// makes no claim about the payload.
func TestDuplicate_LookupFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	changes := tasks.Changes{Remark: new("r")}
	_, err := e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.NoError(t, err)
	// Make the task unreadable to the Inspector.
	require.NoError(t, e.db.Client.HSet(t.Context(), "asynq:{order_modify}:t:evt-1", "state", "bogus").Err())

	_, err = e.p.EnqueueModify(t.Context(), "SO1", changes, producer.WithEventID("evt-1"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
	assert.NotErrorIs(t, err, producer.ErrPayloadMismatch, "unknown is not a mismatch")
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.Error(t, dup.LookupErr)
	assert.False(t, dup.SamePayload)
	assert.Zero(t, dup.State)
	assert.Contains(t, err.Error(), `producer: duplicate event "evt-1": task "evt-1" already in queue order_modify (payload not compared: `)
}

func TestDuplicate_Concurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	const n = 50
	start := make(chan struct{})
	errs := make([]error, n)
	results := make([]producer.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")},
				producer.WithEventID("evt-race"))
		})
	}
	close(start)
	wg.Wait()

	var ok, dups int
	for i, err := range errs {
		var dup *producer.DuplicateError
		switch {
		case err == nil:
			ok++
		case assert.ErrorAs(t, err, &dup):
			dups++
			assert.True(t, dup.SamePayload, "goroutine %d: %v", i, err)
		}
		assert.Equal(t, "evt-race", results[i].TaskID)
		assert.Equal(t, "order_modify", results[i].Queue)
	}
	assert.Equal(t, 1, ok, "exactly one enqueue succeeds")
	assert.Equal(t, n-1, dups)
	pending, err := e.insp.ListPendingTasks("order_modify")
	require.NoError(t, err)
	assert.Len(t, pending, 1)
}

func TestEnqueue_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		enqueue func(context.Context, *producer.Producer) error
		msg     string
	}{
		{"bad order no", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO 1", tasks.Changes{Remark: new("r")})
			return err
		}, `order_no: must contain only A-Z, a-z, 0-9, '_' and '-', got "SO 1"`},
		{"no changes", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{})
			return err
		}, "changes: must set at least one of address, remark and items"},
		{"bad event id", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("evt 1"))
			return err
		}, `event_id: must be ` + tasks.EventIDRule + `, got "evt 1"`},
		{"event id with a path", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("../pending_tasks:delete_all"))
			return err
		}, `event_id: must be ` + tasks.EventIDRule + `, got "../pending_tasks:delete_all"`},
		{"bad qty", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "A", Qty: 1}, {SKU: "B"}})
			return err
		}, "items[1].qty: must be between 1 and 10000, got 0"},
		{"no items", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueExchange(ctx, "SO1", nil)
			return err
		}, "items: required"},
		{"new order no is the old one", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithNewOrderNo("SO1"))
			return err
		}, "new_order_no: must differ from order_no"},
		{"bad payload", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.Enqueue(ctx, tasks.ModifyPayload{EventID: "e", OrderNo: "SO1",
				Changes: tasks.Changes{Address: new(" ")}})
			return err
		}, "changes.address: must not be blank"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, producer.Config{})
			err := tt.enqueue(t.Context(), e.p)
			require.ErrorIs(t, err, tasks.ErrInvalid)
			assert.EqualError(t, err, tt.msg, "validation errors pass through as they are")
			var fe *tasks.FieldError
			assert.ErrorAs(t, err, &fe)
			e.requireEmpty(t)
		})
	}
}

func TestEnqueue_InvalidOption(t *testing.T) {
	t.Parallel()
	items := []tasks.Item{{SKU: "A", Qty: 1}}
	tests := []struct {
		name    string
		enqueue func(context.Context, *producer.Producer) error
		msg     string
	}{
		{"reason on a modify", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithReason("x"))
			return err
		}, "producer: invalid option: WithReason applies to EnqueueExchange only"},
		{"new order no on a modify", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithNewOrderNo("SO2"))
			return err
		}, "producer: invalid option: WithNewOrderNo applies to EnqueueExchange only"},
		{"negative max retry", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueExchange(ctx, "SO1", items, producer.WithMaxRetry(-1))
			return err
		}, "producer: invalid option: WithMaxRetry(-1) is negative"},
		{"empty event id", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.EnqueueExchange(ctx, "SO1", items, producer.WithEventID(""))
			return err
		}, "producer: invalid option: WithEventID given an empty event ID"},
		{"event id contradicts the payload", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.Enqueue(ctx,
				tasks.ModifyPayload{EventID: "a", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}},
				producer.WithEventID("b"))
			return err
		}, `producer: invalid option: WithEventID("b") conflicts with the payload's event_id "a"`},
		{"reason given to Enqueue", func(ctx context.Context, p *producer.Producer) error {
			_, err := p.Enqueue(ctx, tasks.ExchangePayload{OrderNo: "SO1", Items: items, Reason: "a"}, producer.WithReason("b"))
			return err
		}, `producer: invalid option: WithReason applies to EnqueueExchange only`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, producer.Config{})
			err := tt.enqueue(t.Context(), e.p)
			require.ErrorIs(t, err, producer.ErrInvalidOption)
			assert.EqualError(t, err, tt.msg)
			assert.NotErrorIs(t, err, tasks.ErrInvalid)
			e.requireEmpty(t)
		})
	}
}

func TestNilOptionIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, nil, producer.WithEventID("e"))
	require.NoError(t, err)
}

func TestGeneratedEventIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	const n = 200
	seen := make(map[string]bool, n)
	for i := range n {
		res, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new(fmt.Sprint(i))})
		require.NoError(t, err)
		require.False(t, seen[res.EventID], "event ID %s generated twice", res.EventID)
		seen[res.EventID] = true

		id, err := uuid.Parse(res.EventID)
		require.NoError(t, err)
		assert.Equal(t, uuid.Version(7), id.Version())
		assert.Equal(t, res.EventID, res.TaskID)
		assert.True(t, tasks.ValidEventID(res.EventID))
	}
	pending, err := e.insp.ListPendingTasks("order_modify", asynq.PageSize(n+1))
	require.NoError(t, err)
	require.Len(t, pending, 1, "only the order's head waits in the queue")
	parked, err := e.insp.ListRetryTasks("order_modify", asynq.PageSize(n+1))
	require.NoError(t, err)
	require.Len(t, parked, n-1, "the changes behind it are parked")
	for _, info := range append(pending, parked...) {
		p, err := tasks.Parse[tasks.ModifyPayload](info.Payload)
		require.NoError(t, err)
		assert.Equal(t, info.ID, p.EventID, "the payload carries the generated event ID")
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	require.NoError(t, e.p.Close())
	require.NoError(t, e.p.Close(), "Close may be called twice")

	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")})
	require.ErrorIs(t, err, producer.ErrClosed)
	_, err = e.p.Enqueue(t.Context(), tasks.ExchangePayload{})
	require.ErrorIs(t, err, producer.ErrClosed)

	require.NoError(t, e.db.Client.Ping(t.Context()).Err(), "the caller's client stays open")
	e.requireEmpty(t)
}

func TestEnqueue_RedisDown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	p, err := producer.New(rdb, producer.Config{})
	require.NoError(t, err)

	_, err = p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("e"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `producer: accept order:modify event "e" for order SO1: `)
	assert.ErrorIs(t, err, producer.ErrUnavailable)
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr, "the cause stays matchable")
	assert.NotErrorIs(t, err, tasks.ErrInvalid)
	assert.NotErrorIs(t, err, producer.ErrDuplicate)
}

func TestEnqueue_ContextDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := e.p.EnqueueModify(ctx, "SO1", tasks.Changes{Remark: new("r")}, producer.WithEventID("e"))
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, producer.ErrUnavailable)
	assert.Contains(t, err.Error(), `producer: accept order:modify event "e" for order SO1: `)
	e.requireEmpty(t)
}

// failEnqueue is a Redis client hook that fails the next script that
// enqueues a task (asynq's, or the producer's acceptance in one step; or
// what match picks, when set) once armed, with err (a connection reset by
// default), as a connection that breaks would: before Redis ran it, or,
// with ran set, after (the task exists, the answer is lost). seen counts
// the scripts it picked, failed or not.
type failEnqueue struct {
	match func(redis.Cmder) bool
	err   error
	ran   bool
	armed atomic.Bool
	seen  atomic.Int32
}

var _ redis.Hook = (*failEnqueue)(nil)

func (f *failEnqueue) DialHook(next redis.DialHook) redis.DialHook { return next }

// fail reports whether cmds are to fail, and with what.
func (f *failEnqueue) fail(cmds ...redis.Cmder) (bool, error) {
	match := f.match
	if match == nil {
		match = isEnqueue
	}
	if !slices.ContainsFunc(cmds, match) {
		return false, nil
	}
	f.seen.Add(1)
	if !f.armed.CompareAndSwap(true, false) {
		return false, nil
	}
	return true, cmp.Or(f.err, errors.New("test: connection reset by peer"))
}

func (f *failEnqueue) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		fail, err := f.fail(cmds...)
		if !fail {
			return next(ctx, cmds)
		}
		if f.ran {
			if err := next(ctx, cmds); err != nil {
				return err
			}
		}
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}
}

func (f *failEnqueue) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		fail, err := f.fail(cmd)
		if !fail {
			return next(ctx, cmd)
		}
		if f.ran {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		cmd.SetErr(err)
		return err
	}
}

// isEnqueue reports whether cmd is asynq's enqueue script: an EVAL or
// EVALSHA with a queue's pending list among its keys.
func isEnqueue(cmd redis.Cmder) bool {
	if n := cmd.Name(); n != "evalsha" && n != "eval" {
		return false
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.HasPrefix(s, "asynq:{") && strings.HasSuffix(s, "}:pending") {
			return true
		}
	}
	return false
}

// On one Redis a new change is accepted in one script: a connection that
// breaks before Redis ran it leaves nothing behind (no claim, no position,
// no task), and sending the change again accepts it; one that breaks after
// leaves the change accepted, and sending it again is refused as a
// duplicate of the same change, which the caller takes for success.
func TestAcceptFailsOnOneRedis(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rdb := db.NewClient(t)
	hook := &failEnqueue{}
	rdb.AddHook(hook)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	remark := tasks.Changes{Remark: new("r")}

	hook.armed.Store(true)
	_, err = p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	require.ErrorIs(t, err, producer.ErrUnavailable)
	assert.NotErrorIs(t, err, producer.ErrDuplicate)
	assert.Contains(t, err.Error(), `producer: accept order:modify event "e1" for order SO1: `)
	assert.Contains(t, err.Error(), "connection reset by peer")
	n, err := db.Client.Exists(t.Context(), db.Prefix+"event:{e1}", db.Prefix+"lock:{SO1}:seq").Result()
	require.NoError(t, err)
	require.Zero(t, n, "no claim and no position")
	_, err = insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "and no task")

	res, err := p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	require.NoError(t, err, "the retry accepts the change")
	info, err := insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.NoError(t, err)
	got, err := tasks.Modify.Parse(info.Payload)
	require.NoError(t, err)
	assert.Equal(t, res.Seq, got.Header().Seq)

	requireLostAnswerIsDuplicate(t, p, hook, insp)
}

// On a Cluster the claim and the position (in the event's and the order's
// slots) and the enqueue (in the queue's) are two round trips: an enqueue
// that fails after the event ID was claimed and the position taken leaves
// the change half-accepted. The error matches ErrUnavailable, and sending
// the change again with the same event ID completes it: with one task, at
// a later position. (That the workers then skip the first position and
// apply the change once is cmd/worker's TestRetryCompletesHalfAcceptedChange.)
func TestEnqueueFailsAfterTheClaim(t *testing.T) {
	db := redistest.NewCluster(t)
	rdb := db.NewClient(t)
	hook := &failEnqueue{}
	rdb.AddHook(hook)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	remark := tasks.Changes{Remark: new("r")}

	hook.armed.Store(true)
	_, err = p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	require.ErrorIs(t, err, producer.ErrUnavailable)
	assert.NotErrorIs(t, err, producer.ErrDuplicate)
	assert.Contains(t, err.Error(), `producer: enqueue order:modify event "e1" to order_modify: `)
	assert.Contains(t, err.Error(), "connection reset by peer")
	n, err := db.Client.Exists(t.Context(), db.Prefix+"event:{e1}").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the event ID is claimed")
	_, err = insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "but no task holds it")
	first, err := db.Client.HGet(t.Context(), db.Prefix+"lock:{SO1}:seq", "n").Int64()
	require.NoError(t, err, "and a position was taken")

	res, err := p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	require.NoError(t, err, "the retry completes the change")
	assert.Greater(t, res.Seq, first)
	info, err := insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.NoError(t, err)
	got, err := tasks.Modify.Parse(info.Payload)
	require.NoError(t, err)
	assert.Equal(t, res.Seq, got.Header().Seq)
	_, err = p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e1"))
	require.ErrorIs(t, err, producer.ErrDuplicate, "and a third send is a duplicate")
	require.NotErrorIs(t, err, producer.ErrPayloadMismatch)

	requireLostAnswerIsDuplicate(t, p, hook, insp)
}

// requireLostAnswerIsDuplicate makes hook lose the answer of the next
// enqueue after Redis ran it, and requires that the retry be refused as a
// duplicate of the same change (which the caller takes for success) and
// nothing be enqueued twice: the modify queue then holds two tasks, e1's
// and e2's.
func requireLostAnswerIsDuplicate(t *testing.T, p *producer.Producer, hook *failEnqueue, insp *asynq.Inspector) {
	t.Helper()
	remark := tasks.Changes{Remark: new("r")}
	hook.ran = true
	hook.armed.Store(true)
	_, err := p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e2"))
	require.ErrorIs(t, err, producer.ErrUnavailable)
	_, err = p.EnqueueModify(t.Context(), "SO1", remark, producer.WithEventID("e2"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup)
	assert.True(t, dup.SamePayload, "%v", err)
	pending, err := insp.ListPendingTasks(tasks.QueueModify)
	require.NoError(t, err)
	parked, err := insp.ListRetryTasks(tasks.QueueModify)
	require.NoError(t, err)
	assert.Len(t, append(pending, parked...), 2, "one task each, waiting or parked behind the other")
	assert.Contains(t, []asynq.TaskState{asynq.TaskStatePending, asynq.TaskStateRetry}, dup.State)
}

// redisError is an error as Redis sends one.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

// isAccept reports whether cmd is the producer's acceptance in one step:
// a script with an event claim and a queue's pending list among its keys.
func isAccept(cmd redis.Cmder) bool {
	return isEnqueue(cmd) && slices.ContainsFunc(cmd.Args(), func(a any) bool {
		s, ok := a.(string)
		return ok && strings.Contains(s, "event:{")
	})
}

// Behind a proxy that spreads one address over shards, Redis refuses the
// one-script acceptance (its keys are in several slots) before it runs:
// the producer then accepts in two steps, then and from then on.
func TestAcceptBehindAShardingProxy(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rdb := db.NewClient(t)
	hook := &failEnqueue{match: isAccept, err: redisError("CROSSSLOT Keys in request don't hash to the same slot")}
	hook.armed.Store(true)
	rdb.AddHook(hook)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	var seqs []int64
	for _, ev := range []string{"e1", "e2"} {
		res, err := p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new(ev)}, producer.WithEventID(ev))
		require.NoError(t, err)
		info, err := insp.GetTaskInfo(tasks.QueueModify, ev)
		require.NoError(t, err)
		got, err := tasks.Modify.Parse(info.Payload)
		require.NoError(t, err)
		assert.Equal(t, res.Seq, got.Header().Seq)
		seqs = append(seqs, res.Seq)
	}
	assert.Equal(t, seqs[0]+1, seqs[1], "consecutive positions: nothing was taken by the refused script")
	assert.EqualValues(t, 1, hook.seen.Load(), "refused once, then not tried again")
}

// Every acceptance lists its queue in asynq's set of queues, even one this
// producer listed before: a queue missing from it (lost in a failover, say)
// would make asynq's Inspector answer "queue not found" for its tasks.
func TestAcceptListsTheQueueEveryTime(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	_, err = p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("a")}, producer.WithEventID("e1"))
	require.NoError(t, err)
	require.NoError(t, db.Client.SRem(t.Context(), "asynq:queues", tasks.QueueModify).Err())
	_, err = insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.ErrorIs(t, err, asynq.ErrQueueNotFound)
	_, err = p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("b")}, producer.WithEventID("e2"))
	require.NoError(t, err)
	_, err = insp.GetTaskInfo(tasks.QueueModify, "e1")
	require.NoError(t, err, "listed again")
}

// On one Redis accepting a new change costs one round trip, as raw asynq's
// enqueue does: a modify, an exchange (which also takes its replacement's
// first position), and with WaitReplicas, whose WAIT rides in the same
// pipeline (unconfirmed here: the server has no replica).
func TestAcceptIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	rdb := db.NewClient(t)
	hook := benchkit.NewCountHook()
	rdb.AddHook(hook)
	p, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	waiting, err := producer.New(rdb, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	require.NoError(t, err)
	_, err = p.EnqueueModify(t.Context(), "SO0", tasks.Changes{Remark: new("warm")}) // loads the script
	require.NoError(t, err)

	trips := func(enqueue func()) int64 {
		before := hook.RoundTrips()
		enqueue()
		return hook.RoundTrips() - before
	}
	assert.EqualValues(t, 1, trips(func() {
		_, err := p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")})
		require.NoError(t, err)
	}), "a modify")
	assert.EqualValues(t, 1, trips(func() {
		_, err := p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}}, producer.WithNewOrderNo("SO2"))
		require.NoError(t, err)
	}), "an exchange")
	assert.EqualValues(t, 1, trips(func() {
		_, err := waiting.EnqueueModify(t.Context(), "SO3", tasks.Changes{Remark: new("r")})
		require.ErrorIs(t, err, producer.ErrNotReplicated)
	}), "with WaitReplicas")
}

// A payload's HTML characters are stored as they are: a remark of 1 KiB of
// "<" is a task about 1 KiB larger, not 6 (encoding/json's default escapes
// each as "\u003c"). The change's fingerprint is still that of the escaped
// encoding, so a retry of a change accepted before is its duplicate.
func TestPayloadStoredWithoutHTMLEscaping(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{})
	remark := strings.Repeat("<", tasks.MaxRemarkLen)
	res, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: &remark}, producer.WithEventID("evt-html"))
	require.NoError(t, err)
	info, err := e.insp.GetTaskInfo(res.Queue, res.TaskID)
	require.NoError(t, err)
	assert.Less(t, len(info.Payload), len(remark)+100, "stored size")
	assert.Contains(t, string(info.Payload), remark)
	got, err := tasks.Parse[tasks.ModifyPayload](info.Payload)
	require.NoError(t, err)
	assert.Equal(t, remark, *got.Changes.Remark)

	// The same change again is its duplicate, on the one-script path and
	// after the claim recorded the fingerprint.
	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: &remark}, producer.WithEventID("evt-html"))
	require.ErrorIs(t, err, producer.ErrDuplicate)
}

// A change accepted behind unfinished changes of its order is parked: its
// task waits in the retry set (until ParkFor at most), not in the pending
// list, and its position is marked parked, so that the change before it
// hands it the turn. The order's head waits in the queue.
func TestChangesBehindTheHeadAreParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{ParkFor: 7 * time.Second})
	head, err := e.p.EnqueueModify(t.Context(), "SO-PARK", tasks.Changes{Remark: new("1")}, producer.WithEventID("park-1"))
	require.NoError(t, err)
	start := time.Now()
	behind, err := e.p.EnqueueModify(t.Context(), "SO-PARK", tasks.Changes{Remark: new("2")}, producer.WithEventID("park-2"))
	require.NoError(t, err)
	info, err := e.insp.GetTaskInfo(tasks.QueueModify, "park-1")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State, "the head waits in the queue")
	info, err = e.insp.GetTaskInfo(tasks.QueueModify, "park-2")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateRetry, info.State, "the change behind it is parked")
	assert.Zero(t, info.Retried, "parking is no failure")
	assert.WithinDuration(t, start.Add(7*time.Second), info.NextProcessAt, 2*time.Second, "for ParkFor at most")
	got, err := tasks.Modify.Parse(info.Payload)
	require.NoError(t, err)
	assert.Equal(t, behind.Seq, got.Header().Seq)
	mark, err := e.db.Client.HGet(t.Context(), "ow:lock:{SO-PARK}:seq", "k:"+strconv.FormatInt(behind.Seq, 10)).Result()
	require.NoError(t, err, "its position is marked parked")
	assert.Equal(t, "1", mark)
	assert.Greater(t, behind.Seq, head.Seq)
}
