// Package worker runs orderworker's tasks: the asynq server wiring, one
// handler per task type, and the middleware that runs every handler inside
// its order's lock.
//
// A task of either type takes the lock of its order (see internal/lock)
// before it runs, so no two tasks change one order at once, not even two
// modifies. While another task holds the order, a task waits by its type's
// policy (random delay between a min and a max, woken early by the release
// notice, until a deadline). Past the deadline it goes back to asynq with a
// short jittered delay; that is not counted as a failure and does not use up
// retries. A task never runs without its lock. The lock's fencing token
// reaches the store in the context (orders.WithWrite), so a handler whose
// lease was lost can never write: its context is cancelled, and a late write
// is refused by the store.
//
// worker reads no environment and parses no flags: cmd/worker does.
package worker

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Config tunes a Worker. The zero value is valid and means all defaults.
type Config struct {
	// Concurrency is how many tasks one Worker runs at once. Handlers mostly
	// wait on Redis or the order API, so it is well above the core count.
	// Defaults to 20.
	Concurrency int
	// Queues maps each queue to serve to its priority weight. Only the
	// queues of package tasks are known; another name is an error.
	// Defaults to {order_exchange: 6, order_modify: 3}: exchanges first.
	Queues map[string]int
	// StrictPriority serves a lower-priority queue only when the higher ones
	// are empty. Defaults to false (weighted).
	StrictPriority bool
	// ModifyWait is how a modify waits for its order's lock. Defaults to a
	// random 50–500 ms between attempts and a 5 s deadline.
	ModifyWait lock.Wait
	// ExchangeWait is how an exchange waits for its order's lock. Defaults
	// to a random 50–500 ms between attempts and a 10 s deadline.
	ExchangeWait lock.Wait
	// BusyRetryMin and BusyRetryMax bound the random delay before a task
	// runs again after it met its wait deadline, lost its lease or had its
	// write refused for a stale fence. Only the deadline is free: the other
	// two count against the task's retries. Defaults to 500ms and 2s.
	BusyRetryMin, BusyRetryMax time.Duration
	// ShutdownTimeout is how long Shutdown lets tasks in flight finish
	// before it cancels them; cancelled tasks go back to their queue and
	// their locks are released. Defaults to 25s, under the usual 30 s before
	// SIGKILL.
	ShutdownTimeout time.Duration
	// TaskCheckInterval is how long an idle Worker waits before it looks at
	// empty queues again. Defaults to 1s.
	TaskCheckInterval time.Duration
	// DelayedTaskCheckInterval is how often scheduled and retried tasks are
	// moved to their queue; it bounds how late a busy retry runs.
	// Defaults to 1s (asynq's own default is 5 s).
	DelayedTaskCheckInterval time.Duration
	// ID names this Worker in logs and in the order history. Defaults to
	// "<hostname>-<pid>-<random>".
	ID string
	// Metrics receives the worker's Prometheus series. Defaults to nil:
	// none are recorded.
	Metrics *Metrics
	// Logger receives the task log (one line per task) and asynq's own
	// logs. Defaults to a no-op logger.
	Logger *zap.Logger
}

// Default waiting policies, see Config.
var (
	DefaultModifyWait   = lock.Wait{MinDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond, Deadline: 5 * time.Second}
	DefaultExchangeWait = lock.Wait{MinDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond, Deadline: 10 * time.Second}
)

// DefaultQueues is the default queue weighting, see Config.Queues.
func DefaultQueues() map[string]int {
	return map[string]int{tasks.QueueExchange: 6, tasks.QueueModify: 3}
}

func (c Config) withDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, 20)
	if len(c.Queues) == 0 {
		c.Queues = DefaultQueues()
	}
	c.ModifyWait = orWait(c.ModifyWait, DefaultModifyWait)
	c.ExchangeWait = orWait(c.ExchangeWait, DefaultExchangeWait)
	c.BusyRetryMin = cmp.Or(c.BusyRetryMin, 500*time.Millisecond)
	c.BusyRetryMax = cmp.Or(c.BusyRetryMax, 2*time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 25*time.Second)
	c.TaskCheckInterval = cmp.Or(c.TaskCheckInterval, time.Second)
	c.DelayedTaskCheckInterval = cmp.Or(c.DelayedTaskCheckInterval, time.Second)
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = cmp.Or(host, "worker") + "-" + strconv.Itoa(os.Getpid()) + "-" + uuid.NewString()[:8]
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func orWait(w, d lock.Wait) lock.Wait {
	return lock.Wait{
		MinDelay: cmp.Or(w.MinDelay, d.MinDelay),
		MaxDelay: cmp.Or(w.MaxDelay, d.MaxDelay),
		Deadline: cmp.Or(w.Deadline, d.Deadline),
	}
}

func (c Config) validate() error {
	known := []string{tasks.QueueExchange, tasks.QueueModify}
	for q, w := range c.Queues {
		if !slices.Contains(known, q) {
			return fmt.Errorf("worker: unknown queue %q (known: %v)", q, known)
		}
		if w <= 0 {
			return fmt.Errorf("worker: queue %q has weight %d, want > 0", q, w)
		}
	}
	for name, w := range map[string]lock.Wait{"modify": c.ModifyWait, "exchange": c.ExchangeWait} {
		if w.MinDelay < 0 || w.MaxDelay < w.MinDelay || w.Deadline <= 0 {
			return fmt.Errorf("worker: %s wait %+v: want 0 <= min <= max and deadline > 0", name, w)
		}
	}
	switch {
	case c.Concurrency < 0:
		return fmt.Errorf("worker: concurrency %d < 0", c.Concurrency)
	case c.BusyRetryMin < 0 || c.BusyRetryMax < c.BusyRetryMin:
		return fmt.Errorf("worker: busy retry %v–%v: want 0 <= min <= max", c.BusyRetryMin, c.BusyRetryMax)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("worker: negative shutdown timeout %v", c.ShutdownTimeout)
	}
	return nil
}

// Worker is an asynq server that applies order tasks to a store. Start it
// once and Shutdown it once.
type Worker struct {
	cfg      Config
	srv      *asynq.Server
	mux      *asynq.ServeMux
	lockr    *lock.Locker
	log      *zap.Logger
	inflight sync.WaitGroup // handler runs; asynq stops waiting for them at its shutdown timeout
}

// New returns a Worker that takes tasks from rdb, locks orders with locker
// and writes to store. The caller owns rdb and locker and closes them after
// Shutdown. It returns an error when cfg is invalid.
func New(rdb redis.UniversalClient, locker *lock.Locker, store orders.Store, cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if rdb == nil || locker == nil || store == nil {
		return nil, errors.New("worker: nil redis client, locker or store")
	}
	log := cfg.Logger.Named("worker").With(zap.String("worker_id", cfg.ID))
	w := &Worker{cfg: cfg, lockr: locker, log: log}
	w.srv = asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   maps.Clone(cfg.Queues),
		StrictPriority:           cfg.StrictPriority,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		TaskCheckInterval:        cfg.TaskCheckInterval,
		DelayedTaskCheckInterval: cfg.DelayedTaskCheckInterval,
		IsFailure:                IsFailure,
		RetryDelayFunc:           w.retryDelay,
		Logger:                   cfg.Logger.Named("asynq").Sugar(),
		LogLevel:                 asynq.WarnLevel,
	})
	w.mux = asynq.NewServeMux()
	w.mux.Use(w.logTasks, w.orderLock)
	w.mux.Handle(tasks.TypeModify, &ModifyHandler{Store: store})
	w.mux.Handle(tasks.TypeExchange, &ExchangeHandler{Store: store})
	return w, nil
}

// ID returns the Worker's ID, as written to the order history.
func (w *Worker) ID() string { return w.cfg.ID }

// Start starts fetching and running tasks. It returns an error when the
// server cannot start (for example Redis is unreachable).
func (w *Worker) Start() error {
	if err := w.srv.Start(w.mux); err != nil {
		return fmt.Errorf("worker: start: %w", err)
	}
	return nil
}

// Shutdown stops fetching, waits up to Config.ShutdownTimeout for tasks in
// flight, then cancels the rest; they go back to their queues. It returns
// once every handler has returned, which releases its order lock, so the
// caller may close the Redis client afterwards. (asynq itself stops waiting
// for a handler at the shutdown timeout; Shutdown waits for the cancelled
// handlers too. A handler that ignores its context keeps Shutdown waiting.)
func (w *Worker) Shutdown() {
	w.srv.Shutdown()
	w.inflight.Wait()
}

// Ping reports whether the Worker's server is running and Redis answers.
func (w *Worker) Ping() error {
	if err := w.srv.Ping(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// IsFailure reports whether a handler error counts against the task's
// retries. Lock contention (lock.ErrBusy) does not: the task did not run.
func IsFailure(err error) bool { return !errors.Is(err, lock.ErrBusy) }

// retryDelay gives a short random delay to a task that did not get to run
// or lost its order to another holder (lock contention: busy, lost lease,
// stale fence), and asynq's exponential backoff to everything else.
func (w *Worker) retryDelay(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, lock.ErrBusy) || errors.Is(err, lock.ErrLost) || errors.Is(err, orders.ErrStaleFence) {
		lo, hi := w.cfg.BusyRetryMin, w.cfg.BusyRetryMax
		return lo + rand.N(hi-lo+1)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// policy returns the lock wait of a task type.
func (w *Worker) policy(taskType string) lock.Wait {
	if taskType == tasks.TypeExchange {
		return w.cfg.ExchangeWait
	}
	return w.cfg.ModifyWait
}
