// Package worker runs orderworker's tasks: the asynq server wiring, one
// handler per task kind (see [Kinds]), and the middleware that runs every
// handler inside its order's lock, in its turn.
//
// # Order
//
// Every change accepted by the producer carries its position in its order's
// sequence (tasks.Header.Seq). A task runs only in its turn: once every
// earlier position of its order is applied, rejected, archived or skipped.
// A task whose turn has not come waits by its kind's policy (random delay
// between a min and a max, woken early by the notice of the position before it, until a deadline), then goes back to its
// queue with a short delay, or, when the position before it is backing off
// after a failure, until that one runs again. A position that no task will
// ever fill (the producer died between taking it and enqueueing, the task was
// deleted) is skipped once it has waited Config.GapWait and asynq confirms
// that no such task exists; the skip is logged in the order's sequence. A
// task enqueued without a position runs as soon as it gets the lock, without
// order.
//
// # Exclusion
//
// A task of any kind takes its order's lock before it runs, so no two
// tasks change one order at once. A task never runs without
// its lock. The lock's fencing token reaches the store in the context
// (orders.WithWrite), so a handler whose lease was lost can never write: its
// context is cancelled, and a late write is refused by the store.
//
// # Failures and the failure budget
//
// Waiting (for the lock or for the turn) is never a failure: it spends no
// retry and never archives a task, whatever MaxRetry it carries. Neither are
// a lost lease, a write refused for a stale fence, nor a task whose worker
// died (asynq's "task lease expired"): they run again after a short delay.
// Every other handler error is a failure: it is retried with asynq's
// backoff until the task has failed FailureBudget times (tasks.FailureBudget
// of its asynq MaxRetry), and then the worker archives it with the reason. A
// malformed task, and a change the store refuses for good (unknown or
// closed order, conflict), is archived at once (asynq.SkipRetry). An
// archived task uses up its position, and a task archived in its turn is
// noted in its order's sequence log with the reason, so that the order's
// status view (the intake's, the dashboard's and the CLI's) finds it.
//
// # Queues and shards
//
// A Worker serves each kind's queue (Config.Queues), or, with Config.Shards,
// every shard queue of each kind, each with the kind's weight (see
// tasks.Shards). A task found on a queue that is none of its order's
// placements is archived with the reason: the gap check and the wake look
// a position's task up only there. While a shard count drains, the Worker
// serves the queues of the old count too and accepts the tasks placed by it.
//
// # Your own store
//
// worker's API names only public types, so a program in another module can
// run a Worker around its own order store: implement orders.Store and the
// write of each kind it serves (such as orders.Modifier; package
// github.com/orderworker/orderworker/worker/orders states what a store
// must do), check it with worker/orders/storetest.Run, and pass it to
// [New] with a Redis client; [New] refuses a kind whose write the store
// lacks. Package worker/workertest runs one task through a kind's handler
// against the store, with the Worker's rules, without an asynq server. The
// module's examples/ownstore does both with an in-memory store.
//
// # Your own kind
//
// A kind is a payload type (tasks.NewKind), a handler and the store write
// it needs: [NewKind] builds the Worker's entry from a handler whose
// payload and store types the compiler checks, and Config.Kinds lists the
// entries (docs/adding-a-task-type.md).
//
// worker reads no environment and parses no flags: cmd/worker does.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// The defaults of [Config].
const (
	// DefaultConcurrency is the default of Config.Concurrency.
	DefaultConcurrency = 20
	// DefaultGapWait is the default of Config.GapWait: the engine's
	// (keyorder.DefaultGapWait).
	DefaultGapWait = keyorder.DefaultGapWait
	// DefaultBusyRetryMin and DefaultBusyRetryMax are the defaults of
	// Config.BusyRetryMin and Config.BusyRetryMax.
	DefaultBusyRetryMin = 500 * time.Millisecond
	DefaultBusyRetryMax = 2 * time.Second
	// DefaultShutdownTimeout is the default of Config.ShutdownTimeout.
	DefaultShutdownTimeout = 25 * time.Second
	// DefaultKeyPrefix is the default of Config.KeyPrefix: an alias of
	// the order domain's one default KEY_PREFIX (orderkeys.DefaultPrefix),
	// which every program of the domain defaults to.
	DefaultKeyPrefix = orderkeys.DefaultPrefix
	// DefaultLockTTL is the default of Config.LockTTL: the lock's own
	// default lease (keyorder.DefaultTTL).
	DefaultLockTTL = keyorder.DefaultTTL
	// DefaultWaitTimeout is the default of Config.WaitTimeout.
	DefaultWaitTimeout = keyorder.DefaultWaitTimeout
)

// ErrNoNotices is matched by the error of [Worker.CheckNotices] when the
// Redis user may not use the lock's release notice channel.
var ErrNoNotices = keyorder.ErrNoNotices

// Config tunes a Worker. The zero value is valid and means all defaults.
type Config struct {
	// Concurrency is how many tasks one Worker runs at once. Handlers mostly
	// wait on Redis or the order API, so it is well above the core count.
	// Defaults to 20.
	Concurrency int
	// Kinds are the kinds the Worker handles, each with how its tasks wait
	// and are applied: every task type, queue and position label the
	// Worker reads is read against them (a label of a kind missing here
	// is taken for no task, and its position skipped by the gap check).
	// Their tasks.Kind entries must pass tasks.Table.Validate, each is
	// made by [NewKind], and the store must implement each one's write
	// (New refuses it otherwise); an empty list is refused. Defaults to
	// [Kinds], the contract's; [KindsFor] gives those a store serves.
	Kinds []Kind
	// Queues maps the queue of each kind to serve (tasks.Kind.Queue, such
	// as "order_modify") to its priority weight; every shard queue of the
	// kind (see Shards) is served with that weight. Another name, a shard
	// queue's included, is an error. Defaults to every kind of Kinds with
	// its weight (tasks.Kind.Weight; see tasks.Kinds for the contract's).
	//
	// Each shard gets the kind's whole weight rather than a part of it:
	// asynq picks the queue it takes a task from at random with chances
	// proportional to the weights of the queues that have tasks, and
	// divides all weights by their greatest common divisor, so N shards
	// of weight w each give a kind the same share against the others as
	// one queue of weight w had (6N:3N is 6:3), with every shard equally
	// likely; splitting the weight (2 and 1 for 3 shards) would give the
	// same chances where it divides, and nothing where it does not.
	Queues map[string]int
	// Shards spreads each kind over Shards.Count queues by order number
	// (tasks.Shards), the same setting as the producers'. The worker
	// serves the shard queues of the count and of the counts that drain,
	// and archives a task found on a queue that is none of its order's
	// placements under them (tasks.Shards.Accepts), with the reason.
	// Defaults to one queue per kind.
	Shards tasks.Shards
	// StrictPriority serves a lower-priority queue only when the higher ones
	// are empty. Defaults to false (weighted). With Shards, the shards of a
	// kind share one weight, and asynq serves queues of equal weight in an
	// order it fixes when the Worker starts: one shard of a kind is emptied
	// before the next one is looked at, by each Worker (the order differs
	// from one Worker to another).
	StrictPriority bool
	// Waits sets, by kind name (tasks.Kind.Name, such as "modify"), how a
	// task waits for its order's lock and for its turn; a zero field keeps
	// the kind's default (see [Kind.Wait]). Defaults to the kinds'
	// defaults.
	Waits map[string]Wait
	// Failures sets, by kind name, the failure policy of the kind's
	// changes (see [Kind.Failure]): Halt or Continue. Defaults to the
	// kinds' own (Halt for the contract's).
	Failures map[string]FailurePolicy
	// KeyPrefix starts the Redis keys of the orders' locks, fencing tokens
	// and sequences, which live under KeyPrefix+"lock:" (with the release
	// notice channel KeyPrefix+"lock:released"). It must be the
	// producers' KeyPrefix (producer.Config.KeyPrefix), and the same for
	// every Worker of a deployment, and it must not contain a brace.
	// Defaults to "ow:".
	KeyPrefix string
	// LockTTL is the lease of an order's lock: how long the lock outlives
	// a Worker that died holding it. While a task runs its lease is renewed
	// every third of it. Every Worker of a deployment should use the same.
	// Defaults to 30s.
	LockTTL time.Duration
	// WaitReplicas is how many replicas must have an order's state (its
	// lock and fence, its positions, and on one Redis or Sentinel the
	// task) before a change is written to the order store: a Redis
	// failover then cannot hand a fence or a position that the store has
	// seen out again, and a change that a replica never had (one whose
	// acceptance the intake answered 503) is not applied from the old
	// master. A write not confirmed within WaitTimeout is not sent, and
	// the task runs again after a busy delay, its retries kept. Set it
	// with the HTTP order store, whose orders outlive the Redis failover;
	// keep it at most the replicas each master has, or no change applies
	// (see keyorder.RunnerConfig.WaitReplicas and docs/scaling.md). Defaults to
	// 0: no wait.
	WaitReplicas int
	// WaitTimeout bounds each wait of WaitReplicas. Defaults to
	// DefaultWaitTimeout (1 s).
	WaitTimeout time.Duration
	// OnLockWait, when set, is called once per task run that finds its
	// order locked (or not yet in its turn) and starts waiting, with the
	// order number, the task's description ("<type> <task ID>") and the
	// holder's (for a turn, the label of the position whose turn it is).
	// It runs on the task's goroutine and must not block. Defaults to nil.
	OnLockWait func(orderNo, task, holder string)
	// GapWait is how long a position may stay unfilled (reserved, but no
	// task of it has come) before the tasks behind it check with asynq and
	// skip it when its task does not exist. It bounds how long an order
	// stalls when a producer died between taking a position and enqueueing,
	// and how long a producer may take to enqueue after taking a position
	// (one that takes longer finds its position skipped and its change
	// applied out of order). Defaults to 30s.
	GapWait time.Duration
	// MaxScheduleAhead bounds how long an order's next change may hold
	// its order while its task waits in asynq's scheduled set (or in the
	// retry set without a failure's backoff as long): the gap check brings
	// a task due further ahead to the front of its queue, with a warning
	// ("head scheduled further ahead than any producer schedules; brought
	// forward"). Such a task cannot have come from a producer, which
	// refuses to schedule past its own MaxScheduleAhead: a Redis user
	// moved it, or a system that enqueues by hand broke the contract. It
	// must be at least the producers' producer.Config.MaxScheduleAhead.
	// Defaults to tasks.DefaultMaxScheduleAhead (24h), the producers'
	// default.
	MaxScheduleAhead time.Duration
	// BusyRetryMin and BusyRetryMax bound the random delay before a task
	// runs again after it met its wait deadline, lost its lease, had its
	// write refused for a stale fence, or its worker died. None of these is
	// a failure. Defaults to 500ms and 2s.
	BusyRetryMin, BusyRetryMax time.Duration
	// ShutdownTimeout is how long Shutdown lets tasks in flight finish
	// before it cancels them; cancelled tasks go back to their queue and
	// their locks are released. Defaults to 25s, under the usual 30 s before
	// SIGKILL.
	ShutdownTimeout time.Duration
	// TaskCheckInterval is how long an idle Worker waits before it looks at
	// empty queues again (asynq sleeps between half of it and one and a
	// half times it); it sets the latency of a change that reaches an idle
	// Worker: about half of it on average, 1.5 times it at most. Each look
	// runs one small dequeue script per queue served, so an idle Worker
	// serving the two default queues runs about 2/TaskCheckInterval
	// scripts a second (40 at the default). Defaults to 50ms (asynq's own
	// default is 1 s; 200ms before hot orders drained, when a quiet
	// change's p99 was about 300 ms at low load).
	TaskCheckInterval time.Duration
	// RecoverAfter is how long past its asynq lease the task of a worker
	// that died is brought back to the front of its queue by the running
	// workers' own recoverer, which looks every RecoverEvery. asynq's own
	// recoverer waits 30 s past the lease (about a minute after the death)
	// and looks once a minute; an order's next changes wait for the task
	// meanwhile. The margin also covers the skew between the workers'
	// clocks. Defaults to 10s.
	RecoverAfter time.Duration
	// RecoverEvery is how often the recoverer looks. Defaults to 5s.
	RecoverEvery time.Duration
	// DelayedTaskCheckInterval is how often scheduled and retried tasks are
	// moved to their queue; it bounds how late a task that waited runs
	// again. Defaults to 1s (asynq's own default is 5 s).
	DelayedTaskCheckInterval time.Duration
	// DrainMax bounds how many changes of one order a Worker runs in one
	// quantum of a hold of its lock, the first included (WORKER_DRAIN_MAX):
	// the engine's quantum, described at [keyorder.RunnerConfig] (DrainMax),
	// with changes for its tasks and orders for its keys. Each drained
	// change is still its own asynq task, completed, logged and counted as
	// its own run. 1 turns the drain off. Defaults to DefaultDrainMax (100).
	DrainMax int
	// DrainFor bounds how long one quantum of a hold drains
	// (WORKER_DRAIN_FOR; see DrainMax). Defaults to DefaultDrainFor (1s).
	DrainFor time.Duration
	// ID names this Worker in logs and in the order history. Defaults to
	// "<hostname>-<pid>-<random>".
	ID string
	// Metrics receives the worker's Prometheus series. Defaults to nil:
	// none are recorded.
	Metrics *Metrics
	// Logger receives the task log (one line per task run) and asynq's own
	// logs. Defaults to a no-op logger.
	Logger *zap.Logger
	// OnDone, when set, is called after every task run with what happened
	// (see [Done]), on the task's goroutine, before asynq records the
	// outcome. It must not block. Defaults to nil.
	OnDone func(Done)
	// TracerProvider, when set, traces every task run: a consumer span
	// ("process <queue>") that continues the trace the change's payload
	// carries (tasks.TraceContext; a task without one starts a new trace),
	// with child spans for the order's lock, the store's write and the
	// hand-off to the next in line, and span events for each wait (behind
	// which position), park and skipped gap. The task's log line and every
	// line logged during the run carry the trace_id and span_id. Pass
	// otel.GetTracerProvider() to use the global one. Defaults to nil: no
	// spans, and the payload's trace context is ignored.
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	if c.Kinds == nil {
		c.Kinds = Kinds()
	} else {
		c.Kinds = slices.Clone(c.Kinds)
	}
	if len(c.Queues) == 0 {
		c.Queues = queuesOf(table(c.Kinds))
	}
	waits := make(map[string]Wait, len(c.Kinds))
	for _, k := range c.Kinds {
		if k.Kind != nil { // nil: validate says so
			waits[k.Kind.Name] = c.Waits[k.Kind.Name].Or(k.Wait)
		}
	}
	for name, w := range c.Waits {
		if _, ok := waits[name]; !ok {
			waits[name] = w // unknown: validate says so
		}
	}
	c.Waits = waits
	failures := make(map[string]FailurePolicy, len(c.Kinds))
	for _, k := range c.Kinds {
		if k.Kind != nil {
			failures[k.Kind.Name] = cmp.Or(c.Failures[k.Kind.Name], k.Failure, Continue)
		}
	}
	for name, f := range c.Failures {
		if _, ok := failures[name]; !ok {
			failures[name] = f // unknown: validate says so
		}
	}
	c.Failures = failures
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DefaultKeyPrefix)
	c.LockTTL = cmp.Or(c.LockTTL, DefaultLockTTL)
	c.GapWait = cmp.Or(c.GapWait, DefaultGapWait)
	c.MaxScheduleAhead = cmp.Or(c.MaxScheduleAhead, tasks.DefaultMaxScheduleAhead)
	c.BusyRetryMin = cmp.Or(c.BusyRetryMin, DefaultBusyRetryMin)
	c.BusyRetryMax = cmp.Or(c.BusyRetryMax, DefaultBusyRetryMax)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.TaskCheckInterval = cmp.Or(c.TaskCheckInterval, 50*time.Millisecond)
	c.DelayedTaskCheckInterval = cmp.Or(c.DelayedTaskCheckInterval, time.Second)
	c.RecoverAfter = cmp.Or(c.RecoverAfter, 10*time.Second)
	c.DrainMax = cmp.Or(c.DrainMax, DefaultDrainMax)
	c.DrainFor = cmp.Or(c.DrainFor, DefaultDrainFor)
	c.RecoverEvery = cmp.Or(c.RecoverEvery, 5*time.Second)
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = cmp.Or(host, "worker") + "-" + strconv.Itoa(os.Getpid()) + "-" + uuid.NewString()[:8]
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// DefaultQueues returns every kind's queue with its default weight, see
// Config.Queues.
func DefaultQueues() map[string]int { return queuesOf(tasks.Kinds()) }

// queuesOf returns the queue of each kind of t with its weight.
func queuesOf(t tasks.Table) map[string]int {
	q := make(map[string]int)
	for _, k := range t {
		if k != nil { // nil: validate says so
			q[k.Queue] = k.Weight
		}
	}
	return q
}

func (c Config) validate() error {
	if len(c.Kinds) == 0 {
		return errors.New("worker: no kinds to serve: Config.Kinds is empty")
	}
	for _, k := range c.Kinds {
		if k.Kind == nil || k.apply == nil {
			return k.Check(nil)
		}
	}
	kinds := table(c.Kinds)
	if err := kinds.Validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	for q, w := range c.Queues {
		if k := kinds.OfQueue(q); k == nil || k.Queue != q {
			return fmt.Errorf("worker: unknown queue %q (known: %v; a kind's queue stands for all its shards)", q, slices.Sorted(maps.Keys(queuesOf(kinds))))
		}
		if w <= 0 {
			return fmt.Errorf("worker: queue %q has weight %d, want > 0", q, w)
		}
	}
	if err := c.Shards.Validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	for name, f := range c.Failures {
		if c.kindNamed(name) == nil {
			return fmt.Errorf("worker: failure policy for unknown kind %q", name)
		}
		if f != Halt && f != Continue {
			return fmt.Errorf("worker: %s: failure policy %q, want %s or %s", name, f, Halt, Continue)
		}
	}
	for name, w := range c.Waits {
		if c.kindNamed(name) == nil {
			return fmt.Errorf("worker: wait for unknown kind %q", name)
		}
		if err := w.Validate(); err != nil {
			return fmt.Errorf("worker: %s wait: %w", name, err)
		}
	}
	switch {
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		return fmt.Errorf("worker: key prefix %q contains a brace", c.KeyPrefix)
	case c.LockTTL < 0:
		return fmt.Errorf("worker: negative lock TTL %v", c.LockTTL)
	case c.Concurrency < 0:
		return fmt.Errorf("worker: concurrency %d < 0", c.Concurrency)
	case c.GapWait < 0:
		return fmt.Errorf("worker: negative gap wait %v", c.GapWait)
	case c.MaxScheduleAhead < 0:
		return fmt.Errorf("worker: negative MaxScheduleAhead %v", c.MaxScheduleAhead)
	case c.BusyRetryMin < 0 || c.BusyRetryMax < c.BusyRetryMin:
		return fmt.Errorf("worker: busy retry %v–%v: want 0 <= min <= max", c.BusyRetryMin, c.BusyRetryMax)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("worker: negative shutdown timeout %v", c.ShutdownTimeout)
	case c.DrainMax < 0 || c.DrainFor < 0:
		return fmt.Errorf("worker: drain of %d changes or %v: want neither negative", c.DrainMax, c.DrainFor)
	case c.RecoverAfter < time.Second || c.RecoverEvery < 0:
		return fmt.Errorf("worker: recover after %v every %v: want at least 1s after, and a positive period", c.RecoverAfter, c.RecoverEvery)
	}
	return nil
}

// served returns the queues a Worker with cfg serves, each with its
// weight: every shard queue of each kind of cfg.Queues (see Config.Queues
// and Config.Shards).
func (c Config) served() map[string]int {
	out := make(map[string]int)
	kinds := table(c.Kinds)
	for q, w := range c.Queues {
		for _, sq := range c.Shards.Queues(kinds.OfQueue(q)) {
			out[sq] = w
		}
	}
	return out
}

// Worker is an asynq server that applies order tasks to a store. Start it
// once and Shutdown it once.
type Worker struct {
	cfg      Config
	kinds    tasks.Table    // the kinds of cfg.Kinds: what task types and labels are read against
	queues   map[string]int // the queues served, shards included, with their weights
	srv      *asynq.Server
	rdb      redis.UniversalClient
	handler  asynq.Handler
	runner   *keyorder.Runner // the one run loop: the Worker's own, Shutdown closes it
	store    orders.Store
	log      *zap.Logger
	tracer   trace.Tracer    // nil: tracing off
	inflight sync.WaitGroup  // handler runs; asynq stops waiting for them at its shutdown timeout
	locate   keyorder.Locate // where a position's task waits (orderkeys.Locate of its shards and kinds)

	stopRecover context.CancelFunc // ends the recoverer
	recoverDone chan struct{}      // closed when the recoverer has ended
}

// New returns a Worker that takes tasks from rdb, locks orders on rdb (the
// locks and sequences under Config.KeyPrefix) and writes to store, which
// may be any implementation of the [orders.Store] contract that has the
// write of every kind of Config.Kinds (package worker/orders;
// worker/orders/storetest checks one). The caller owns rdb and store and
// closes them after Shutdown; the Worker owns its lock and stops it in
// Shutdown. It returns an error when rdb or store is nil or cfg is
// invalid, and one matching [ErrNoWrite], naming the kind and the
// interface, when store lacks a kind's write (see [Kind.Check]), and one
// when the program links another asynq release than v0.25.1, whose private
// Redis layout orderworker relies on.
func New(rdb redis.UniversalClient, store orders.Store, cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if rdb == nil || store == nil {
		return nil, errors.New("worker: nil redis client or store")
	}
	for _, k := range cfg.Kinds {
		if err := k.Check(store); err != nil {
			return nil, err
		}
	}
	log := cfg.Logger.Named("worker").With(zap.String("worker_id", cfg.ID))
	seq, err := orderkeys.Sequencer(rdb, cfg.KeyPrefix, orderkeys.Use{})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{cfg: cfg, kinds: table(cfg.Kinds), queues: cfg.served(), rdb: rdb, store: store, log: log,
		tracer: tracing.Tracer(cfg.TracerProvider)}
	w.locate = orderkeys.Locate(cfg.Shards, w.kinds)
	// The engine's Runner is the run loop; the order domain joins it with
	// its checks before the turn (admit), its log line, metrics and span
	// around each run (observe, phase), the heads it brings forward
	// (headDue), and the changes a hold may take (locateChange).
	w.runner, err = keyorder.NewRunner(seq, keyorder.RunnerConfig{
		Key:          orderkeys.OrderNo(w.kinds),
		Locate:       w.locate,
		HoldLocate:   w.locateChange,
		TTL:          cfg.LockTTL,
		GapWait:      cfg.GapWait,
		BusyRetryMin: cfg.BusyRetryMin,
		BusyRetryMax: cfg.BusyRetryMax,
		DrainMax:     cfg.DrainMax,
		DrainFor:     cfg.DrainFor,
		OnHold:       func(d keyorder.HoldDone) { cfg.Metrics.observeHold(d.Runs, d.Yielded) },
		WaitReplicas: cfg.WaitReplicas,
		WaitTimeout:  cfg.WaitTimeout,
		Logger:       logging.Slog(log),
		KeyField:     "order_no",
		OnWait:       cfg.OnLockWait,
		Admit:        w.admit,
		Observe:      w.observe,
		Phase:        w.phase,
		HeadDue:      w.headDue,
		Failure:      w.failure,
	})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.srv = asynq.NewServerFromRedisClient(rdb, w.runner.ServerConfig(asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   maps.Clone(w.queues),
		StrictPriority:           cfg.StrictPriority,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		TaskCheckInterval:        cfg.TaskCheckInterval,
		DelayedTaskCheckInterval: cfg.DelayedTaskCheckInterval,
		ErrorHandler:             asynq.ErrorHandlerFunc(w.countArchived),
		Logger:                   cfg.Logger.Named("asynq").Sugar(),
		LogLevel:                 asynq.WarnLevel,
	}))
	// One handler for every kind; a mux, so that a hold runs any kind.
	mux := asynq.NewServeMux()
	for _, k := range w.kinds {
		mux.HandleFunc(k.Type, w.process)
	}
	w.handler = w.runner.Handler(mux)
	types := []string{taskTypeUnknown}
	for _, k := range w.kinds {
		types = append(types, k.Type)
	}
	cfg.Metrics.initArchived(types)
	cfg.Metrics.initGhosts(slices.Collect(maps.Keys(w.queues)))
	return w, nil
}

// ID returns the Worker's ID, as written to the order history.
func (w *Worker) ID() string { return w.cfg.ID }

// Queues returns the queues the Worker serves, shard queues included, with
// their weights, in a new map.
func (w *Worker) Queues() map[string]int { return maps.Clone(w.queues) }

// Start starts fetching and running tasks. It returns an error when the
// server cannot start (for example Redis is unreachable).
func (w *Worker) Start() error {
	if err := w.srv.Start(w.handler); err != nil {
		return fmt.Errorf("worker: start: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.stopRecover, w.recoverDone = cancel, make(chan struct{})
	go w.recoverLoop(ctx)
	return nil
}

// recoverLoop brings dead workers' tasks back (see Config.RecoverAfter)
// until ctx ends, and removes the task IDs that name no task (ghosts)
// from the lease set, the active list and the front of the pending list
// of each queue (see asynqredis.Recover), counting them in
// orderworker_ghost_tasks_removed_total. Shutdown ends it and waits for it.
func (w *Worker) recoverLoop(ctx context.Context) {
	defer close(w.recoverDone)
	t := time.NewTicker(w.cfg.RecoverEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for q := range w.queues {
			rctx, cancel := context.WithTimeout(ctx, w.cfg.RecoverEvery)
			got, err := asynqredis.Recover(rctx, w.rdb, q, w.cfg.RecoverAfter)
			cancel()
			if err != nil && ctx.Err() == nil {
				w.log.Warn("recover dead workers' tasks", zap.String("queue", q), zap.Error(err))
			}
			if len(got.IDs) > 0 {
				w.log.Info("brought back the tasks of a worker whose lease expired", zap.String("queue", q), zap.Strings("task_ids", got.IDs))
			}
			if got.Ghosts > 0 {
				w.cfg.Metrics.observeGhosts(q, got.Ghosts)
				w.log.Warn("removed task ids that name no task", zap.String("queue", q), zap.Int("ghosts", got.Ghosts), zap.Strings("sample_ids", got.GhostIDs))
			}
		}
	}
}

// Shutdown stops fetching, waits up to Config.ShutdownTimeout for tasks in
// flight, then cancels the rest; they go back to their queues. It returns
// once every handler has returned, which releases its order lock, and the
// lock's release-notice subscription has ended, so the caller may close
// the Redis client afterwards. (asynq itself stops waiting for a handler at
// the shutdown timeout; Shutdown waits for the cancelled handlers too. A
// handler that ignores its context keeps Shutdown waiting.) Call it once,
// also for a Worker that was never started.
func (w *Worker) Shutdown() {
	w.runner.Stop()
	if w.stopRecover != nil {
		w.stopRecover()
		<-w.recoverDone
	}
	w.srv.Shutdown()
	w.inflight.Wait()
	if err := w.runner.Close(); err != nil {
		w.log.Warn("close the lock's notice subscription", zap.Error(err))
	}
}

// CheckNotices makes sure that the Redis user may publish and subscribe to
// the lock's release notice channel (KeyPrefix+"lock:released"). When it
// may not, CheckNotices turns the notices off for this Worker (waiting
// tasks then poll with their random delays, which is slower but correct)
// and returns an error matching [ErrNoNotices] that names the channel the
// user's ACL needs. Other errors are Redis's. Call it before Start; later
// calls only report.
func (w *Worker) CheckNotices(ctx context.Context) error {
	if err := w.runner.CheckNotices(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// Ping reports whether the Worker's server is running and Redis answers.
func (w *Worker) Ping() error {
	if err := w.srv.Ping(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// IsFailure reports whether a handler error counts against the task's
// failure budget: waiting (for the lock or the turn), a lost lease, a stale
// fence and a dead worker's expired asynq lease do not. It is the engine's
// rule (keyorder.IsFailure; orders.ErrStaleFence
// matches keyorder.ErrStaleFence).
func IsFailure(err error) bool { return keyorder.IsFailure(err) }
