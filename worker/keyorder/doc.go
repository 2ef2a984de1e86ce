// Package keyorder runs asynq tasks one key at a time, in the order they
// were accepted: an engine for any asynq (github.com/hibiken/asynq v0.25.1)
// user whose tasks must not interleave per key (an account's postings, an
// order's changes, a device's commands) and must apply in order.
//
// It knows keys, positions, tasks and fences, never what a key stands for.
// examples/ledger posts entries per account on it alone.
//
// # Use
//
// Name the key space with a [Sequencer] (its Redis keys' prefix, the
// sequences' retention, the cap on a key's waiting positions); enqueue
// with a [Client] built on it instead of asynq's Client, naming the key;
// wrap the handlers with a [Runner] built on it; give the asynq server the
// Runner's [Runner.ServerConfig]; read the fence in the handler with
// [RunFrom]; stop with [Runner.Shutdown]:
//
//	seq, _ := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: "ledger:"})
//	c, _ := keyorder.NewClient(seq, keyorder.ClientConfig{})
//	c.Enqueue(ctx, "acct-42", asynq.NewTask("ledger:post", payload), asynq.Queue("ledger"))
//
//	r, _ := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: accountOf, Logger: slog.Default()})
//	mux := asynq.NewServeMux()
//	mux.Handle("ledger:post", r.Handler(asynq.HandlerFunc(post)))
//	srv := asynq.NewServerFromRedisClient(rdb, r.ServerConfig(asynq.Config{Queues: map[string]int{"ledger": 1}}))
//	srv.Start(mux)
//	defer r.Shutdown(srv)
//
// The example of [Runner] is a whole program (the tests compile it; it
// needs a Redis to run). examples/ledger is a module on the engine alone,
// with a fence-checking store, tests, and a program to run against any
// Redis (go run ./cmd/ledger there).
//
// # Stopping
//
// A program stops in one order, which [Runner.Shutdown] is: the Runner's
// holds end before their next task ([Runner.Stop]), so that none outlives
// the server's ShutdownTimeout (asynq would put its first task back, to
// run again); then the asynq server shuts down; then the Runner closes its
// subscription ([Runner.Close]). A [Client] holds nothing to stop. The
// Redis client, which every part shares, is the program's to close last.
//
// # Logging and testing
//
// Every part takes a *slog.Logger (log/slog); without one it logs
// nothing, except the warning that a key's sequence does not exist (a
// Client and a Runner on two prefixes, or an expired sequence), which a
// Runner sends to slog.Default at most once a minute, and [Report] counts
// ([Report].SequenceGone). Package keyordertest runs a handler with a
// [Run] in its context, without asynq or Redis, for unit tests.
//
// # Guarantees
//
//   - Order of acceptance. Each Enqueue takes the next position of its
//     key's sequence, in Redis, in the script that enqueues the task: a
//     task enqueued after another one's Enqueue returned runs after it,
//     whatever the hosts' clocks say and however many processes enqueue.
//     The Runner runs position n only once n−1 was applied, archived or
//     skipped.
//   - One at a time per key. A task runs under its key's lock: acquire and
//     release are owner-checked scripts, and the lease renews itself every
//     TTL/3 while the handler runs. A handler whose lease is lost has its
//     context cancelled with cause [ErrLost].
//   - Fencing. Every hold of a key's lock has a fencing token strictly
//     greater than any handed out for the key before, even after the key
//     was idle and its lock expired ([Run].Fence); the tasks a hold runs
//     one after another share its fence. A store that refuses an older
//     fence than it has seen ([ErrStaleFence]), and takes an equal one, is
//     safe from a holder that stalled past its lease; the lock alone cannot
//     be (see Limits). A store that outlives a failover of Redis (one that
//     lost the newest fences and positions) tells what it has seen
//     ([StoreAhead]), and the run moves the key above it and runs again.
//   - Waiting is free. A task whose turn has not come waits, woken by the
//     release of the task before it, or goes back to its queue parked and
//     is called back when its turn comes. Neither spends a retry, whatever
//     asynq.MaxRetry the task carries (even 0).
//   - Failures block their key, boundedly. A failing task keeps its turn
//     and backs off; the tasks behind it wait. Past its failure budget
//     (asynq.MaxRetry) it is archived with the reason, and the next runs;
//     or, under [FailureHalt] ([RunnerConfig].Failure), its key halts: it
//     stays the head and nothing behind it runs until an operator retries
//     or skips it.
//   - No position is lost. A position whose task will never come (its
//     enqueue failed, it was deleted, archived before its turn) is skipped
//     once the Runner is sure, after [RunnerConfig].GapWait, and the skip
//     is logged in the key's sequence; an archived head of a task under
//     FailureHalt is never skipped: it halts its key.
//   - Operators act per key: [Runner.Hold], [Runner.Resume],
//     [Runner.Skip] and [Runner.Retry], and [Runner.Blocked] lists the keys
//     that do not move, and why, without scanning the keyspace. A program with
//     rules of its own reads the head ([Runner.Head]), checks it, and acts
//     on what it read ([Runner.SkipHead], [Runner.RetryHead]).
//   - Redis Cluster: every script touches one key's slot (the keys carry
//     the hash tag {key}); on a Cluster, Enqueue takes the position and
//     then enqueues, in two round trips.
//
// # Limits
//
// A lease is time-based: a holder that stalls (GC pause, network partition)
// past its TTL can still believe it holds the lock for up to TTL/3 before
// the renewal notices. A single Redis can also lose a lock on failover to a
// replica that had not yet received it. Neither can be fixed by the lock
// alone, which is why every write downstream must carry the fencing token
// and the store must refuse a token older than one it has seen.
//
// asynq delivers at least once: a task whose run ended but whose end asynq
// did not record (its worker died just after) runs again, after its turn
// ([Run].Mode is then ModePassed). Handlers must be idempotent; a store
// that applies each task ID once is (examples/ledger's does).
//
// Order is per key: keys run concurrently and in no order among each other.
// A task enqueued with asynq's own Client carries no position and runs
// under its key's lock, unordered. So does a task whose key has no
// sequence: it expired (SeqConfig.Retention) or was lost, or the Client
// that enqueued it was built on a Sequencer of another Prefix than the
// Runner's (two programs configured apart; one program that builds both
// on one Sequencer cannot); the Runner logs a warning for each
// (Report.SequenceGone), to slog.Default once a minute without a Logger. A key is serial by design: its tasks run no
// faster than one handler after another.
//
// # What it costs
//
// Measured against plain asynq in one run (BenchmarkRunner, two cores):
// see the figures in docs/engine.md. Per task, the Runner adds the lock's
// acquire and release scripts (the turn check rides in them) to asynq's
// own round trips, and Enqueue is one script, as asynq's Client's enqueue
// is. A task behind its key's head is parked; when its turn comes while
// the task before it succeeds, the Runner keeps the key's lock and runs it
// in the same hold ([RunnerConfig].DrainMax), taking it out
// of asynq in the round trip that passes the turn on: a hot key's tasks
// then cost about one round trip each, and run about as fast as plain
// asynq runs unordered tasks. A parked task whose predecessor failed, or
// whose hold yielded to other keys, is called back through its queue
// instead. A store on the engine's Redis goes one step further: its commit
// script also passes the turn on ([Run].Commit).
//
// # Joining every run
//
// A program with more to do than a handler joins the Runner's runs
// through [RunnerConfig]'s hooks rather than composing a run itself:
// Admit (its checks before the turn, the position's label, the wait),
// Observe (around each run, a hold's included, with a [Report] of what
// the run did: for the log line, metrics and spans), Phase (the lock and
// the end of a run), HeadDue (a head whose task is due later), HoldLocate
// (what a hold may take), OnHold and OnWait.
//
// # The parts
//
// [Client] and [Runner] are built on one [Sequencer], the key space, which
// owns the sequence: reserving a position at acceptance (the Client),
// passing the turn on and handing the lock off (the lock's scripts, the
// Runner, a store's [Commit]) all take their keys from it.
//
//   - [Sequencer]: the key space, and the per-key sequence of positions,
//     with its log, its pause and its status. Its Lua is the engine's
//     alone: a position is reserved and its task enqueued together only by
//     the Client's one script ([Client.EnqueueAtOnce], which also takes a
//     producer's claim and a linked position), and passed on only by the
//     engine's lock scripts and a store's commit through [Commit].
//   - The lock, behind the package line: per key, with fencing tokens,
//     self-renewing leases and waiting woken by release notices (one
//     shared Pub/Sub subscription per Runner, fanned out to its local
//     waiters). A test that must hold a key by hand takes it with
//     keyordertest.NewLocker.
//   - The Runner's turns, behind the package line: they take a turn
//     (waiting, parking a position too far back, skipping a head whose
//     task will never come, which they learn from asynq's queues: the gap
//     check, with [RunnerConfig].HeadDue's word on a head due later), pass
//     it on when the work ends, settle the positions of holders that end
//     without their turn, and decide what asynq gets (a wait spends no
//     retry, a failure backs off within its budget and is archived past
//     it, with [ErrOutOfBudget]). A hold of a hot key runs the key's parked
//     tasks under the lock that their predecessor's commit kept.
//   - [Commit]: the hook a store on the lock's own Redis is handed with a
//     write, to check the lock's newest fence and pass the turn on in its
//     commit script ([CommitLua]).
package keyorder
