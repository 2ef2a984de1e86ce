package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
	"github.com/orderworker/orderworker/worker/keyorder/internal/runctx"
)

// ErrStaleFence is for a store to wrap when it refuses a write whose fence
// is older than one it has seen (see [Run].Fence): the run lost its key to
// a newer holder. A [Runner] counts it as no failure, like [ErrLost].
var ErrStaleFence = errors.New("keyorder: stale fence")

// RunnerConfig tunes a [Runner]. Key is required; the rest defaults.
type RunnerConfig struct {
	// Key returns the key of a task: the string its Client.Enqueue was
	// given (1 to MaxKeyLen bytes, without braces). An error archives the
	// task with the reason (asynq.SkipRetry).
	Key func(*asynq.Task) (string, error)
	// Wait is how long a task waits for its key's lock and its turn before
	// it goes back to its queue (no retry spent). Defaults to DefaultWait.
	Wait Wait
	// TTL is the lease of a key's lock, renewed every TTL/3 while the
	// handler runs. Defaults to DefaultTTL (30 s).
	TTL time.Duration
	// GapWait is how long the head of a key's sequence waits for its task
	// before the Runner asks asynq whether it will come, and skips it when
	// it will not. The head is looked at when a task behind it comes back
	// from its park: keep the Clients' ClientConfig.ParkFor at most
	// GapWait. Defaults to DefaultGapWait (30 s).
	GapWait time.Duration
	// RetryDelay is the backoff of a failed task after n failures, chosen
	// when it fails (the tasks behind it wait as long). Defaults to
	// asynq.DefaultRetryDelayFunc.
	RetryDelay asynq.RetryDelayFunc
	// BusyRetryMin and BusyRetryMax bound the random delay after which a
	// task that only waited runs again. Default 100 ms and 1 s.
	BusyRetryMin, BusyRetryMax time.Duration
	// Locate returns where the task of a position of key waits: the queues
	// to look in, in order, and its task ID, given the position's label;
	// ok is false for a label that names no task. The Runner looks a task
	// up there to wake it, to tell the fate of a head, to run it in a
	// hold, and for the actions. It must be safe for concurrent use.
	// Defaults to reading a [Client]'s label (taskLabel): its one queue. A
	// program whose labels say less (a key's tasks spread over shard
	// queues, say) gives its own.
	Locate Locate
	// DrainMax and DrainFor are the quantum of a hold of a hot key's lock
	// (turns.Drain), described here for every layer that sets it: after
	// a task of a key succeeds in its turn, when the key's next task is
	// parked, the Runner keeps the lock, takes that task out of its queue
	// itself and runs it in the same hold, with the same fence, as its own
	// run (its end recorded in asynq as asynq's processor would), up to
	// DrainMax tasks (the first included) or DrainFor of time, whichever
	// comes first. Then, when another task waits in the server's queues
	// or more than half its slots are in use, it releases the lock and
	// sends the key's next task to the back of its queue, so that other
	// keys' tasks go first; otherwise the hold goes on for another
	// quantum. Whatever waits, a hold ends once half its first task's
	// time (its asynq Timeout or Deadline) is spent. A hot key then costs
	// about one round trip per task instead of a trip through its queue.
	// A DrainMax of 1 turns the drain off. Defaults to DefaultDrainMax
	// (100) and DefaultDrainFor (1 s).
	DrainMax int
	DrainFor time.Duration
	// OnHold, when set, is called as each hold of a key's lock ends (see
	// DrainMax), on the goroutine of the hold's first run, with what the
	// hold did: for metrics (how many tasks a hold runs, how often holds
	// yield). It must not block. Defaults to nil.
	OnHold func(HoldDone)
	// WaitReplicas is how many replicas of the key's master must have the
	// key's state (its lock, fence and positions) before a run's handler
	// runs, so that a failover cannot hand out again a fence or a position
	// a store has seen; a run not confirmed within WaitTimeout (each WAIT)
	// ends with an error matching [ErrNotReplicated], which is no failure.
	// It costs a round trip per run. Default 0 (no wait) and
	// DefaultWaitTimeout.
	WaitReplicas int
	WaitTimeout  time.Duration
	// Logger receives the skips and what goes wrong after a run (the run's
	// outcome stands either way), and a warning for each task whose key's
	// sequence does not exist ([Report].SequenceGone). Defaults to
	// discarding, except that warning: without a Logger it goes to
	// slog.Default, at most once a minute, since a Client and a Runner on
	// two key prefixes lose every task's order without another sign. A
	// program on zap gives a *slog.Logger over its zap core (package
	// go.uber.org/zap/exp/zapslog, or a handler of its own).
	Logger *slog.Logger
	// KeyField names the key in the log lines of the key's turns (see
	// turnsConfig.KeyField). Defaults to "key".
	KeyField string
	// OnWait, when set, is called once per run that finds its key held
	// (or not yet in its turn) and starts waiting (lockConfig.OnWait). It
	// must not block. Defaults to nil.
	OnWait func(key, meta, holder string)

	// The hooks below let a program join every run, asynq's and a
	// hold's, without composing the run itself. Each is optional, is
	// called on the run's goroutine, and must be safe for concurrent use.

	// Admit, when set, reads each task before it waits for its turn,
	// with the run's context (inside Observe): it may check the task
	// against the program's own rules and say how it waits and what its
	// position's label is ([Admission]). An error archives the task with
	// the reason (asynq.SkipRetry is added when missing) and notes it in
	// the key's sequence log when the key is known; with
	// Admission.Abandon, the task's position is also used up at once, so
	// that its key's next task goes on without waiting for the gap check.
	Admit func(ctx context.Context, t *asynq.Task) (Admission, error)
	// Observe, when set, wraps each run (see [Report]): it must call run
	// once, with ctx or a context derived from it, and return its error
	// (or another: what asynq gets). For the log line, metrics and span
	// of each run; the hold's runs (see DrainMax) are observed one by
	// one, as asynq's are.
	Observe func(ctx context.Context, t *asynq.Task, rep *Report, run func(context.Context) error) error
	// Phase, when set, is called as a run starts waiting for its key's
	// lock and turn (PhaseLock; in a hold it is granted at once) and as
	// it starts to end (PhaseEnd: the release that passes the turn on),
	// and returns the context of the phase (a span's, say) and the
	// function that ends it, with the phase's error. rep holds what the
	// run learned so far.
	Phase func(ctx context.Context, p Phase, rep *Report) (context.Context, func(error))
	// HeadDue, when set, says how long a head of key's sequence waits for
	// its task, which exists and is due only later (info: in asynq's
	// scheduled or retry set), where the Runner waits until
	// info.NextProcessAt. It may move the task (bring it forward, say)
	// and return 0. An error is Redis's, and the gap check runs again.
	HeadDue func(ctx context.Context, key string, te *TurnError, info *asynq.TaskInfo) (time.Duration, error)
	// Failure, when set, says what becomes of a task's key when the
	// task fails past its failure budget ([ErrOutOfBudget]) in its turn:
	// [FailureContinue] archives the task and the key's next task runs;
	// [FailureHalt] archives it too, but halts the key: nothing behind
	// it runs until an operator acts ([Runner.Retry], [Runner.Skip]),
	// and [Runner.Blocked] lists it as [BlockedHalted]. Under FailureHalt
	// an archived head (however it came to be archived) is never skipped
	// by the gap check: it halts its key too. A rejection of the
	// handler's own (asynq.SkipRetry) is an outcome, not a failure past
	// its budget: the turn passes on under either policy. Defaults to
	// FailureContinue for every task, asynq's own behaviour and the
	// engine's before the policy existed.
	Failure func(*asynq.Task) FailurePolicy
	// HoldLocate, when set, is where a hold looks for the parked task of
	// the key's next position (see DrainMax), given its label; ok false
	// keeps a hold from taking it (a position held by another key's
	// task, say), and it then runs from its queue. Defaults to Locate.
	HoldLocate Locate
}

// FailurePolicy says what becomes of a key whose head's task fails past
// its failure budget (see [RunnerConfig].Failure).
type FailurePolicy string

// The failure policies.
const (
	// FailureContinue archives the task and passes its key's turn on: the
	// next task of the key runs. The zero FailurePolicy means it.
	FailureContinue FailurePolicy = "continue"
	// FailureHalt archives the task and halts its key in the same script
	// that releases the key's lock: the task stays its key's head, no
	// task behind it runs, and the key is listed as [BlockedHalted] with
	// the task's last error ([Pause].Halted names its position), until an
	// operator retries the head in its place ([Runner.Retry]) or skips it
	// ([Runner.Skip]).
	FailureHalt FailurePolicy = "halt"
)

// halts reports whether t's key halts when t fails past its budget.
func (r *Runner) halts(t *asynq.Task) bool {
	return r.cfg.Failure != nil && r.cfg.Failure(t) == FailureHalt
}

// Admission is what [RunnerConfig].Admit says of a task before its turn.
type Admission struct {
	// Key is the task's key; "" has the Runner read it with
	// RunnerConfig.Key.
	Key string
	// Label is the label its position was reserved under; "" for a
	// [Client]'s (taskLabel of its queue and ID). A task without a
	// position is noted under it when it is archived.
	Label string
	// Wait is how the task waits for its key's lock and its turn; zero
	// fields keep RunnerConfig.Wait's.
	Wait Wait
	// Abandon, with Admit's error, uses the task's position up at once
	// (see RunnerConfig.Admit); its Report is then Final.
	Abandon bool
}

// Phase is a phase of a run, for [RunnerConfig].Phase.
type Phase int

// The phases of a run.
const (
	// PhaseLock is the wait for the key's lock and turn.
	PhaseLock Phase = iota + 1
	// PhaseEnd is the run's end: the turn passes on, or stays.
	PhaseEnd
)

// Report is what a Runner learns of one run, for [RunnerConfig].Observe
// (read it after run returns) and Phase. The Runner writes it on the
// run's goroutine only.
type Report struct {
	// Started is when the run began.
	Started time.Time
	// Queue and TaskID name the task; Retried and MaxRetry are asynq's:
	// its failures before this run, and its MaxRetry.
	Queue, TaskID     string
	Retried, MaxRetry int
	// Held is 0 for a run that asynq started, and n for one that a hold
	// took out of its queue after n runs (see RunnerConfig.DrainMax);
	// Prev is then the position the hold ran before.
	Held int
	Prev Turn
	// Key and Pos are the task's, once read (Pos 0: no position).
	Key string
	Pos int64
	// Locked says the run took its key's lock, with Fence and Mode.
	Locked bool
	Fence  int64
	Mode   Mode
	// SequenceGone says the lock was granted without order because the
	// key's sequence does not exist: it expired or
	// was lost, or the Client that enqueued the task used another key
	// prefix. A program counts it (its metrics) from Observe.
	SequenceGone bool
	// Lock says how the lock and the turn were waited for, over every
	// round of the run; Skipped counts the heads it skipped before its
	// turn (their tasks never came).
	Lock    leaseStats
	Skipped int
	// Final says the run's work is done for good (applied, archived or
	// revoked, or its position abandoned): its turn passed on.
	Final bool
}

// HoldDone describes a hold of a key's lock that ended, for
// [RunnerConfig].OnHold.
type HoldDone struct {
	// Key is the key held.
	Key string
	// Runs counts the hold's runs, its first included.
	Runs int
	// Yielded says the hold ended with a task of the key still to run,
	// sent back to its queue: its quantum was spent while others waited
	// or the server was busy, half its first task's time was spent, or
	// the Runner stopped. A hold that ends with the key's tasks, with a
	// failure, or with a task it could not take did not yield.
	Yielded bool
	// Took is how long the hold lasted, from its first run's start.
	Took time.Duration
}

// clientLabel is RunnerConfig.Locate's default: a [Client]'s label.
func clientLabel(_, label string) ([]string, string, bool) {
	queue, id, ok := parseLabel(label)
	if !ok {
		return nil, "", false
	}
	return []string{queue}, id, true
}

// Runner runs asynq tasks enqueued by a [Client] one key at a time, in the
// order of their positions, each under its key's lock with a fencing token
// ([RunFrom]). Wrap the handlers with [Runner.Handler], and give the asynq
// server [Runner.ServerConfig]: a task that waits for its turn then spends
// no retry, and a failing task blocks the tasks behind it while it backs
// off, then is archived past its failure budget, and the next one runs
// (or, under [FailureHalt], its key halts: see RunnerConfig.Failure).
//
// A hot key's tasks run in holds of its lock (see RunnerConfig.DrainMax):
// the handler of the task that took the lock goes on with the key's next
// tasks, parked behind it, each run with the handler that ran its type
// before in this Runner ([Run].Held says so). Wrapping asynq's ServeMux
// as a whole (srv.Run(r.Handler(mux))) lets a hold run every type, with
// the mux's middleware; a task of a type not yet run goes back to its
// queue and runs from there, and what wraps the Runner's handler sees only
// a hold's first task. asynq
// counts a hold as the run of its first task: a hold ends at half that
// task's timeout, and a shutdown that cancels it puts that task back in
// its queue, to run again as a passed position (ModePassed).
//
// A Runner is safe for concurrent use. It owns one Pub/Sub subscription
// (the release notices) from its first run to Close; its Sequencer's
// Redis client stays the caller's to close.
type Runner struct {
	rdb   redis.UniversalClient
	l     *locker
	turns *turns
	// headSeq reads the sequences one position deep, for Head and Blocked.
	headSeq *Sequencer
	// tasks finds the tasks of positions in the queues, for the Turns, Head
	// and Blocked.
	tasks *queueTasks
	insp  *asynq.Inspector
	cfg   RunnerConfig
	hold  holdConfig

	handlers    sync.Map     // task type -> the handler that ran it, for the holds
	seen        sync.Map     // queue -> true: the queues tasks came from
	served      atomic.Value // []string: the server's queues, from ServerConfig
	concurrency atomic.Int64 // the server's Concurrency, from ServerConfig
	slots       atomic.Int64 // runs that asynq started and that have not ended
	stopping    atomic.Bool  // Stop: the holds end before their next task
}

// NewRunner returns a Runner of seq's keys, on seq's Redis: it runs the
// tasks that Clients built on a Sequencer of the same SeqConfig.Prefix
// enqueued (the same one, in a program that does both). It returns an
// error when seq or cfg.Key is nil or a setting is out of range, and when
// the program links another asynq release than v0.25.1, whose private
// Redis layout the Runner reads and writes.
func NewRunner(seq *Sequencer, cfg RunnerConfig) (*Runner, error) {
	if !seq.valid() || cfg.Key == nil {
		return nil, errors.New("keyorder: NewRunner needs a Sequencer from NewSequencer and RunnerConfig.Key")
	}
	if err := asynqwire.CheckVersion(); err != nil {
		return nil, fmt.Errorf("keyorder: %w", err)
	}
	if cfg.DrainMax < 0 || cfg.DrainFor < 0 {
		return nil, fmt.Errorf("keyorder: RunnerConfig: DrainMax %d and DrainFor %v must not be negative", cfg.DrainMax, cfg.DrainFor)
	}
	cfg.Wait = cfg.Wait.or(DefaultWait)
	if err := cfg.Wait.validate(); err != nil {
		return nil, err
	}
	if cfg.Locate == nil {
		cfg.Locate = clientLabel
	}
	l, err := newLocker(seq, lockConfig{TTL: cfg.TTL, Logger: cfg.Logger, OnWait: cfg.OnWait,
		WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout})
	if err != nil {
		return nil, err
	}
	tasks, err := newQueueTasks(seq.rdb, queueTasksConfig{Key: cfg.Key, Locate: cfg.Locate, Logger: cfg.Logger, KeyField: cfg.KeyField})
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	r := &Runner{rdb: seq.rdb, l: l, tasks: tasks, insp: tasks.insp, cfg: cfg, headSeq: seq.paged(1)}
	r.turns, err = newTurns(l, runnerTasks{r}, turnsConfig{GapWait: cfg.GapWait, Logger: cfg.Logger, KeyField: cfg.KeyField,
		RetryDelay: cfg.RetryDelay, BusyRetryMin: cfg.BusyRetryMin, BusyRetryMax: cfg.BusyRetryMax})
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("%w (RunnerConfig)", err)
	}
	r.cfg.Logger = cmp.Or(r.cfg.Logger, discard) // the Turns took a nil one: loud when a sequence is gone
	holdLocate := cfg.HoldLocate
	if holdLocate == nil {
		holdLocate = cfg.Locate
	}
	r.hold = holdConfig{
		Max: cfg.DrainMax, For: cfg.DrainFor, Locate: holdLocate, Run: r.runHeld,
		Busy: r.busy, Queues: r.queues, Stopping: r.stopping.Load,
	}
	return r, nil
}

// Stop ends the Runner's holds (see RunnerConfig.DrainMax) before their
// next task, and starts none: call it before the asynq server's Shutdown,
// so that a hold does not outlive the server's ShutdownTimeout (asynq
// would then put the hold's first task back in its queue, to run again).
// A task that a hold had taken and not run goes back to the front of its
// queue. Stop is safe to call more than once, and from any goroutine.
// [Runner.Shutdown] calls it in its order; a program that stops its
// server itself calls it first.
func (r *Runner) Stop() { r.stopping.Store(true) }

// CheckNotices makes sure that the Redis user may publish and subscribe to
// the Runner's release notice channel (SeqConfig.Prefix+"released"),
// which wakes the tasks that wait for a key's lock or turn. When it may
// not, it turns the notices off for this Runner (waiters then poll with
// their random delays, which is slower but correct) and returns an error
// matching [ErrNoNotices] that names the channel the user's ACL needs.
// Call it before the asynq server starts; later calls only report.
func (r *Runner) CheckNotices(ctx context.Context) error { return r.l.CheckNotices(ctx) }

// Close stops the Runner's holds and its subscription, once the asynq
// server has shut down ([Runner.Shutdown] does both, in order). Close is
// safe to call more than once. The Redis client stays the caller's.
func (r *Runner) Close() error {
	r.Stop()
	return r.l.Close()
}

// Shutdown stops the Runner and srv, the asynq server that runs its
// handlers, in the one right order: the Runner's holds end before their
// next task ([Runner.Stop]), then srv shuts down (srv.Shutdown: it waits
// up to its Config.ShutdownTimeout for the tasks in flight), then the
// Runner's subscription closes ([Runner.Close]), whose error it returns. A
// nil srv (a Runner that runs no server) only closes. It is the whole of
// a program's stop, in place of those three calls; the Redis client stays
// the caller's. Call it once, after srv.Start.
func (r *Runner) Shutdown(srv *asynq.Server) error {
	r.Stop()
	if srv != nil {
		srv.Shutdown()
	}
	return r.Close()
}

// ServerConfig returns c with the Runner's IsFailure and RetryDelayFunc,
// which the asynq server running its handlers must use. The Runner also
// reads c's Queues and Concurrency (asynq's defaults when unset), for its
// holds (see RunnerConfig.DrainMax): a Runner never given the server's
// config counts the queues its tasks came from as the server's, and the
// server as never busy.
func (r *Runner) ServerConfig(c asynq.Config) asynq.Config {
	c.IsFailure = IsFailure
	c.RetryDelayFunc = r.turns.RetryDelay
	queues := slices.Sorted(maps.Keys(c.Queues))
	if len(queues) == 0 {
		queues = []string{"default"} // asynq's default
	}
	r.served.Store(queues)
	r.concurrency.Store(int64(cmp.Or(c.Concurrency, runtime.NumCPU())))
	return c
}

// queues returns the queues of the server, for the holds: those of
// ServerConfig, or else those its tasks came from.
func (r *Runner) queues() []string {
	if qs, ok := r.served.Load().([]string); ok {
		return qs
	}
	var qs []string
	r.seen.Range(func(q, _ any) bool {
		qs = append(qs, q.(string))
		return true
	})
	return qs
}

// busy reports whether more than half of the server's slots are in use.
func (r *Runner) busy() bool {
	n := r.concurrency.Load()
	return n > 0 && 2*r.slots.Load() > n
}

// IsFailure is asynq's Config.IsFailure for tasks run by a Runner: a task
// that waited for its turn or its key's lock, or lost its key mid-run
// ([ErrLost], [ErrStaleFence]), or whose write the replicas did not
// confirm ([ErrNotReplicated]), or whose key's Redis was unreachable
// before its turn (a connection refused, reset or timed out; a Cluster
// or a replica between two masters), did not fail.
func IsFailure(err error) bool {
	var u *unavailableError
	switch {
	case errors.As(err, &u):
		return false
	case errors.Is(err, ErrBusy), errors.Is(err, ErrNotYourTurn), errors.Is(err, ErrLost),
		errors.Is(err, ErrStaleFence), errors.Is(err, ErrNotReplicated), errors.Is(err, asynq.ErrLeaseExpired):
		return false
	}
	return true
}

// Run is what a handler wrapped by [Runner.Handler] learns of its run.
type Run struct {
	// Key is the task's key, Pos its position (0 for a task without one,
	// which runs under the lock but without order): the one to give the
	// store, lease.Seq, which is above every position the store applied
	// even when a failover lost some in Redis (see [StoreAhead]).
	Key string
	Pos int64
	// Fence is the fencing token of this hold of the key's lock: greater
	// than any token handed out for the key before. A store must refuse a
	// write whose fence is older than one it has seen (and wrap
	// ErrStaleFence), since a holder that stalled past its lease may
	// still be running. A store that also wraps a [*StoreAhead] with its
	// newest fence (or, refusing a position as passed, its newest
	// position) has the run caught up and run again at once, in the same
	// hold, with a fence (and a Pos) above it.
	Fence int64
	// Mode says how the lock was granted: [ModeTurn] in the position's
	// turn; [ModePassed] for a position already passed (the task ran
	// before and asynq runs it again: asynq delivers at least once, so a
	// handler must be idempotent, as a store that dedupes by task ID is);
	// [ModeFree] for a task without a position.
	Mode Mode
	// Held is 0 for a run that asynq started, and n for a run that the
	// hold of the key's lock took out of its queue after n runs (see
	// RunnerConfig.DrainMax): it runs with the same fence as they did.
	Held int
	// Record says the store should record Pos as the newest it applied:
	// true in the position's turn, and when the key's sequence is gone
	// (expired, or lost in a failover: the store's record then keeps an
	// older position from applying over a newer one); false for a
	// position the sequence had passed already (a run again), which the
	// store only checks.
	Record bool
	// Commit is the run's lease as the engine's hook for a store on the
	// lock's own Redis ([Commit]); a store that cannot use it ignores it.
	Commit Commit
}

// runKey is the context key of a handler's Run, shared with package
// keyordertest.
type runKey = runctx.Key

// RunFrom returns the [Run] of a handler's context, and false outside a
// Runner's handler.
func RunFrom(ctx context.Context) (Run, bool) {
	r, ok := ctx.Value(runKey{}).(Run)
	return r, ok
}

// Handler wraps next so that the tasks of one key run one at a time, in
// the order of their positions, under the key's lock:
//
//   - A task whose turn has not come waits (woken when its predecessor
//     finishes), or goes back to its queue, parked, to be called back when
//     its turn comes. Neither spends a retry.
//   - next runs with the lease kept alive; [RunFrom] gives it the key, the
//     position and the fence. When the lease is lost mid-run, next's
//     context is cancelled with cause [ErrLost].
//   - When next succeeds, is archived (asynq.SkipRetry, or past its
//     failure budget: asynq's MaxRetry) or revoked (asynq.RevokeTask: asynq
//     deletes the task), the turn passes to the next position. A run that
//     outlives its deadline fails too: a task past its budget so is
//     archived in its turn without running again. When next fails within its budget, the turn stays: the
//     tasks behind it wait while it backs off.
//   - When next succeeds in its turn and the key's next task is parked,
//     the turn passes on while the lock is kept, and that task, and those
//     after it, run in this hold before the handler returns (see
//     RunnerConfig.DrainMax and the Runner's doc).
//   - A head whose task will never come (deleted, never enqueued,
//     archived before its turn) is skipped after RunnerConfig.GapWait.
//   - A task without a position (enqueued by asynq's own Client) runs
//     under the lock, unordered. Its failure budget is its asynq MaxRetry
//     less one, as for a Client's task (whose asynq MaxRetry the Client
//     sets one above the budget asked for): one try is kept for a wait,
//     which asynq would otherwise archive once its retries are spent.
//
// A task whose key or position cannot be read is archived with the reason.
func (r *Runner) Handler(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		r.slots.Add(1)
		defer r.slots.Add(-1)
		rep := &Report{Started: time.Now()}
		rep.TaskID, _ = asynq.GetTaskID(ctx)
		rep.Queue, _ = asynq.GetQueueName(ctx)
		rep.Retried, _ = asynq.GetRetryCount(ctx)
		rep.MaxRetry, _ = asynq.GetMaxRetry(ctx)
		if _, ok := r.handlers.Load(t.Type()); !ok {
			r.handlers.Store(t.Type(), next)
		}
		if _, ok := r.seen.Load(rep.Queue); !ok {
			r.seen.Store(rep.Queue, true)
		}
		var kept *lease
		err := r.observe(ctx, t, rep, func(ctx context.Context) error {
			tr, lease, err := r.take(ctx, t, rep)
			if err != nil {
				return err
			}
			err = r.run(ctx, next, lease, rep, tr)
			if _, ok := lease.Kept(); ok {
				kept = lease
			}
			return err
		})
		if kept != nil {
			// The turn passed on while the lock was kept, for the key's
			// next task, parked: run it, and those after it, in this hold.
			runs, yielded := r.turns.Drain(ctx, kept, rep.Started, &r.hold)
			if r.cfg.OnHold != nil {
				r.cfg.OnHold(HoldDone{Key: rep.Key, Runs: runs, Yielded: yielded, Took: time.Since(rep.Started)})
			}
		}
		return err
	})
}

// observe runs run for t inside RunnerConfig.Observe.
func (r *Runner) observe(ctx context.Context, t *asynq.Task, rep *Report, run func(context.Context) error) error {
	if r.cfg.Observe == nil {
		return run(ctx)
	}
	return r.cfg.Observe(ctx, t, rep, run)
}

// noPhase is what phase returns without RunnerConfig.Phase.
func noPhase(error) {}

// phase starts phase p of rep's run (RunnerConfig.Phase).
func (r *Runner) phase(ctx context.Context, p Phase, rep *Report) (context.Context, func(error)) {
	if r.cfg.Phase == nil {
		return ctx, noPhase
	}
	return r.cfg.Phase(ctx, p, rep)
}

// admit reads t's key and position, and what RunnerConfig.Admit says of
// it, into rep and the run it returns. An error, which archives the task,
// says why it cannot run; it is noted in the key's sequence log (and the
// position used up, for Admission.Abandon) when the key is known.
func (r *Runner) admit(ctx context.Context, t *asynq.Task, rep *Report) (Wait, *taskRun, error) {
	var a Admission
	var err error
	if r.cfg.Admit != nil {
		a, err = r.cfg.Admit(ctx, t)
	}
	key := a.Key
	if key == "" && err == nil {
		key, err = r.cfg.Key(t)
		if err == nil {
			err = checkKey(key, "")
		}
		if err != nil {
			err = fmt.Errorf("keyorder: task %s: its key: %w", clip(rep.TaskID), err)
		}
	}
	pos, perr := payloadPos(t.Payload())
	if perr != nil && err == nil {
		err = fmt.Errorf("keyorder: task %s of %s: %w", clip(rep.TaskID), key, perr)
	}
	if err != nil && checkKey(key, "") != nil {
		// No key to note it under.
		if !errors.Is(err, asynq.SkipRetry) {
			err = fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		return Wait{}, nil, err
	}
	if a.Label == "" && pos > 0 {
		a.Label = taskLabel(rep.Queue, rep.TaskID)
	}
	rep.Key, rep.Pos = key, pos
	tr := &taskRun{Key: key, Meta: clip(t.Type() + " " + rep.TaskID), Label: a.Label, Task: t,
		Retried: rep.Retried, MaxRetry: rep.MaxRetry}
	if pos > 0 {
		tr.Turn = Turn{Pos: pos, Label: a.Label}
		tr.Halt = r.halts(t)
	}
	if err != nil {
		if !errors.Is(err, asynq.SkipRetry) {
			err = fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		if a.Abandon && pos > 0 {
			r.turns.Abandon(ctx, key, tr.Turn, "archived: "+err.Error())
			rep.Final = true
		} else if pos > 0 || a.Label != "" {
			r.turns.Note(ctx, key, pos, a.Label, "archived: "+err.Error())
		}
		return Wait{}, nil, err
	}
	return a.Wait.or(r.cfg.Wait), tr, nil
}

// take admits t and takes its key's lock in its turn, for the run of rep.
func (r *Runner) take(ctx context.Context, t *asynq.Task, rep *Report) (*taskRun, *lease, error) {
	w, tr, err := r.admit(ctx, t, rep)
	if err != nil {
		return nil, nil, err
	}
	pctx, end := r.phase(ctx, PhaseLock, rep)
	lease, taken, err := r.turns.TakeTask(pctx, tr, w)
	rep.Lock.Waited, rep.Skipped = taken.Waited, taken.Skipped
	if err == nil {
		st := lease.Stats()
		st.Waited += taken.Waited // waits of earlier rounds (a skipped head)
		rep.Locked, rep.Fence, rep.Mode, rep.Lock = true, lease.Fence(), lease.Mode(), st
		rep.SequenceGone = lease.sequenceGone()
	}
	end(err)
	return tr, lease, err
}

// handlerOf returns the handler that runs t in a hold: the one that ran
// its type before in this Runner, or else a ServeMux wrapped by the
// Runner that has a handler of its type.
func (r *Runner) handlerOf(t *asynq.Task) (asynq.Handler, bool) {
	if h, ok := r.handlers.Load(t.Type()); ok {
		return h.(asynq.Handler), true
	}
	var found asynq.Handler
	r.handlers.Range(func(_, h any) bool {
		if mux, ok := h.(*asynq.ServeMux); ok {
			if _, pattern := mux.Handler(t); pattern != "" {
				found = mux
				return false
			}
		}
		return true
	})
	return found, found != nil
}

// runHeld is the Runner's holdConfig.Run: it runs task t, which a hold
// took out of its queue for position held.Turn, with the handler that ran
// its type before, in the hold's lease, as a run of its own (observed).
func (r *Runner) runHeld(ctx context.Context, t *asynq.Task, held held) error {
	rep := &Report{Started: time.Now(), Queue: held.Queue, TaskID: held.ID, Retried: held.Retried,
		MaxRetry: held.MaxRetry, Held: held.Runs, Prev: held.lease.Turn()}
	return r.observe(ctx, t, rep, func(ctx context.Context) error {
		_, tr, err := r.admit(ctx, t, rep)
		if err != nil {
			return err
		}
		h, ok := r.handlerOf(t)
		switch {
		case !ok:
			err = fmt.Errorf("no handler of the Runner has run a %s task yet", clip(t.Type()))
		case tr.Key != held.lease.Key() || tr.Turn != held.Turn:
			err = fmt.Errorf("task of %s holds position %d, not %d of %s, which the hold passed on to", tr.Key, tr.Turn.Pos, held.Turn.Pos, held.lease.Key())
		default:
			err = held.lease.Next(held.Turn)
		}
		if err != nil {
			// Back to its queue, where it takes its turn as any task does.
			return r.turns.Later(fmt.Errorf("%w: %w", ErrNotYourTurn, err))
		}
		rep.Locked, rep.Fence, rep.Mode = true, held.lease.Fence(), ModeTurn
		_, end := r.phase(ctx, PhaseLock, rep) // granted in the hold: no wait
		end(nil)
		return r.run(ctx, h, held.lease, rep, tr)
	})
}

// run runs next inside lease and ends tr's run (turns.EndTask): the
// turn passes on when the task's work is done (applied or archived), and
// stays when the task will run again; the lock is kept when the key's next
// task is parked (see RunnerConfig.DrainMax).
func (r *Runner) run(ctx context.Context, next asynq.Handler, lease *lease, rep *Report, tr *taskRun) (err error) {
	if skip := tr.OutOfBudget(); skip != nil {
		// Failed past its budget already, by runs asynq counted without
		// us (a run that outlived its deadline): archived in its turn,
		// which passes on, rather than run again.
		next = asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return skip })
	}
	wctx := lease.Keep(ctx)
	lease.Drain(r.hold.Drains())
	defer func() {
		if v := recover(); v != nil {
			// A handler bug: a failure like any other, and the key's lock
			// is released now rather than at the end of its lease.
			r.cfg.Logger.Error("handler panicked", slog.String(r.keyField(), rep.Key), slog.String("task_id", rep.TaskID),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("keyorder: panic in the %s handler: %v", clip(tr.Task.Type()), v)
		}
		// When asynq's context for the run is done (its deadline, a
		// shutdown, a cancel), asynq decides what becomes of the task
		// without reading this error: the turn stays.
		pctx, end := r.phase(ctx, PhaseEnd, rep)
		err, rep.Final = r.turns.EndTask(pctx, wctx, lease, tr, err)
		end(err)
	}()
	run := Run{Key: rep.Key, Mode: lease.Mode(), Held: rep.Held, Commit: lease}
	tries := 0
	// A store that refuses the write with what it has seen that the
	// key's Redis lost in a failover has the run caught up and run again,
	// in this hold.
	return lease.WriteCaughtUp(wctx, func() error {
		if tries++; tries > 1 {
			r.cfg.Logger.Info("store ahead of the key's Redis; caught up", slog.String(r.keyField(), rep.Key),
				slog.Int64("fence", lease.Fence()), slog.Int64("seq", lease.Seq()))
		}
		run.Fence, run.Pos = lease.Fence(), lease.Seq()
		run.Record = lease.Mode() == ModeTurn || recordsOutOfTurn(lease, rep.Pos, time.Now())
		return next.ProcessTask(context.WithValue(wctx, runKey{}, run), tr.Task)
	}, func(a StoreAhead, cerr error) {
		r.cfg.Logger.Warn("store ahead of the key's Redis; not caught up", slog.String(r.keyField(), rep.Key),
			slog.Int64("store_fence", a.Fence), slog.Int64("store_seq", a.Pos), errAttr(cerr))
	})
}

// keyField names the key in the Runner's log lines.
func (r *Runner) keyField() string { return cmp.Or(r.cfg.KeyField, "key") }

// recordsOutOfTurn reports whether the position pos of a task that runs
// out of its turn is recorded by the store all the same (Run.Record):
// when its key's sequence is gone (expired, lost with a master of a
// Cluster, or deleted by a Redis user that may write the sequences), the
// key's tasks run in whatever order they come, and only the store's
// record of the newest position applied keeps an older one from applying
// over a newer one. A position further ahead than any sequence hands out
// (positions start at Redis TIME in µs: pos above the clock by more than
// an hour) is none the sequence handed out (a task enqueued by hand,
// which would hold every later task back), so it is only checked.
func recordsOutOfTurn(lease *lease, pos int64, now time.Time) bool {
	return lease.sequenceGone() && pos > 0 && pos <= now.Add(time.Hour).UnixMicro()
}

// runnerTasks is a Runner's taskSource: its queueTasks, with
// RunnerConfig.HeadDue for a head whose task is due later.
type runnerTasks struct{ r *Runner }

func (t runnerTasks) Wake(ctx context.Context, key string, labels []string) error {
	return t.r.tasks.Wake(ctx, key, labels)
}

func (t runnerTasks) headEnded(ctx context.Context, key string, te *TurnError) (string, error) {
	why, err := t.r.tasks.headEnded(ctx, key, te)
	if err != nil || why == "" || t.r.cfg.Failure == nil {
		return why, err
	}
	h := Head{Key: key, Label: te.Label}
	info, err := t.r.tasks.look(ctx, &h, false)
	if err != nil {
		return "", err
	}
	if halted, err := t.r.haltArchived(ctx, key, te, info); err != nil || halted {
		return "", err // not skipped: halted, or looked at again after GapWait
	}
	return why, nil
}

func (t runnerTasks) HeadFate(ctx context.Context, key string, te *TurnError) (string, time.Duration, error) {
	why, info, err := t.r.tasks.HeadTask(ctx, key, te)
	if err != nil {
		return "", 0, err
	}
	if why != "" {
		if halted, err := t.r.haltArchived(ctx, key, te, info); err != nil || halted {
			return "", t.r.turns.cfg.GapWait, err // the waiter parks: the key is halted
		}
		return why, 0, nil
	}
	_, later := taskFate(info)
	switch {
	case !later:
		return "", 0, nil // a pending, active or aggregating task: it comes
	case t.r.cfg.HeadDue == nil:
		return "", max(time.Until(info.NextProcessAt), time.Millisecond), nil
	}
	d, err := t.r.cfg.HeadDue(ctx, key, te, info)
	return "", d, err
}

// haltArchived halts key at te's head when its task, read as info, is
// archived and halts by RunnerConfig.Failure: the gap check never skips
// such a head. It is how a halt survives a crash, or an archive that did
// not come from the task's run (asynq's recoverer, an operator in
// asynqmon): the run's own halt, written in its release before asynq
// archives the task, is the usual way. It reports whether the key is
// to be left alone (halted now, or by the time of the read); false for a
// head that is not such a task.
func (r *Runner) haltArchived(ctx context.Context, key string, te *TurnError, info *asynq.TaskInfo) (bool, error) {
	if info == nil || info.State != asynq.TaskStateArchived || !r.halts(asynq.NewTask(info.Type, info.Payload)) {
		return false, nil
	}
	if p, perr := payloadPos(info.Payload); perr != nil || p != te.Head {
		return false, nil //nolint:nilerr // a task without this position: a gap, skipped as before
	}
	why := fmt.Sprintf("task %s was archived: %s", info.ID, clip(info.LastErr))
	done, err := r.l.Sequencer().halt(ctx, key, te.Head, te.Label, why)
	if err != nil {
		return false, err
	}
	if done {
		r.cfg.Logger.Warn("the head's task was found archived under the halt policy; key halted",
			slog.String(r.keyField(), key), slog.Int64("seq", te.Head), slog.String("task_id", info.ID), slog.String("reason", why))
	}
	return true, nil
}

// Created finishes the position that creator (a task's ID, described as
// by in the log) reserved in the sequence of key created (see
// [AtOnce].Link): created exists now, or, when err is not nil, never
// will. A failure is logged. See turns.Created.
func (r *Runner) Created(ctx context.Context, created, creator, by string, err error) {
	r.turns.Created(ctx, created, creator, by, err)
}

// NotCreated returns why key was to be created and was not ("" when its
// sequence logged no such outcome); see turns.NotCreated.
func (r *Runner) NotCreated(ctx context.Context, key string, creation func(label string) bool) (string, error) {
	return r.turns.NotCreated(ctx, key, creation)
}

// Skipped returns why position pos of key, reserved under label, was
// given up without its turn, or ""; see turns.Skipped.
func (r *Runner) Skipped(ctx context.Context, key string, pos int64, label string) (string, error) {
	return r.turns.Skipped(ctx, key, pos, label)
}

// taskFate reads, from its asynq state, the fate of the task that holds
// the head of a key's sequence, for a taskSource.HeadFate: why it will never
// take its turn (archived, or completed without passing it on), "" when
// it will; later says it runs only at info.NextProcessAt (scheduled, or
// backing off in the retry set). A pending, active or aggregating task
// comes.
func taskFate(info *asynq.TaskInfo) (why string, later bool) {
	switch info.State {
	case asynq.TaskStateArchived:
		return fmt.Sprintf("task %s was archived: %s", info.ID, clip(info.LastErr)), false
	case asynq.TaskStateCompleted:
		return fmt.Sprintf("task %s completed without passing its turn on", info.ID), false
	case asynq.TaskStateScheduled, asynq.TaskStateRetry:
		return "", true
	}
	return "", false
}

// Locate is where the task of a position of key waits, given its label:
// the queues to look in, in order, and its task ID; ok is false for a
// label that names no task (see RunnerConfig.Locate). nil means a
// [Client]'s labels (taskLabel).
type Locate = func(key, label string) (queues []string, taskID string, ok bool)

// Wake brings the parked tasks of positions of key, given by their labels
// in the order of their positions (a settlement's or a release's Wake), to
// the front of their queues on rdb, so that they run next rather than
// after the queues' backlog: the first ends up first in line. Each is
// looked for in the queues locate gives (nil: a Client's label); a task
// still active (on its way to its park) is tried again for a moment. A
// label that names no task, and a task no queue holds, are passed over.
// It returns the first Redis error, after trying every label; such a
// failure only costs the tasks their park delay. It is for a program that
// settles positions without a [Runner] (a producer that voids the
// positions of an enqueue refused): a Runner wakes its own
// ([Runner.Wake]).
func Wake(ctx context.Context, rdb redis.Scripter, locate Locate, key string, labels []string) error {
	if locate == nil {
		locate = clientLabel
	}
	return moveLabels(ctx, rdb, locate, key, labels, asynqwire.FrontInTransit)
}

// moveLabels moves the tasks of positions of key, given by their labels in
// the order of their positions, with to (to the front of their queues, or
// the back), so that the first ends up first in line: each is looked for
// in the queues locate gives, until one holds it. It returns the first
// Redis error, after trying every label.
func moveLabels(ctx context.Context, rdb redis.Scripter, locate Locate, key string, labels []string,
	to func(ctx context.Context, rdb redis.Scripter, queue, id string) (string, error)) error {
	var first error
	for _, label := range slices.Backward(labels) {
		queues, id, ok := locate(key, label)
		if !ok {
			continue
		}
		for _, queue := range queues {
			state, err := to(ctx, rdb, queue, id)
			if err != nil && first == nil {
				first = err
			}
			if err != nil || state != "" {
				break // found there (or failed): not in another queue
			}
		}
	}
	return first
}
