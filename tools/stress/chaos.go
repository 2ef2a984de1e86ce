package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
)

// workerPool runs the worker processes, one per slot, each with its logs
// in a file of its own per start (worker<slot>.<start>.log). It is safe for
// concurrent use.
type workerPool struct {
	bin string
	dir string
	env []string
	c   settings
	// url, when set, is the REDIS_URL of slot's workers (its link's
	// proxy, see nemesis.go), in place of env's.
	url func(slot int) string
	// extraEnv, when set, adds to the environment of slot's workers
	// (the order store's, with -store http).
	extraEnv func(slot int) []string

	mu      sync.Mutex
	procs   []*benchkit.Process
	logs    []string       // the log file of each slot's running process
	pids    map[string]int // the process of each log file
	starts  []int
	killed  map[*benchkit.Process]bool
	crashes []string       // logs of workers that exited on their own
	calm    bool           // the chaos is over: every worker works at the normal pace
	slots   map[string]int // the slot of each log file

	trouble troubleLog // the nemeses aimed at each slot (stall.go)
}

func (p *workerPool) startAll() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.procs = make([]*benchkit.Process, p.c.Workers)
	p.logs = make([]string, p.c.Workers)
	p.pids = map[string]int{}
	p.slots = map[string]int{}
	p.starts = make([]int, p.c.Workers)
	p.killed = map[*benchkit.Process]bool{}
	for slot := range p.c.Workers {
		if err := p.start(slot); err != nil {
			return err
		}
	}
	return nil
}

// start starts the worker of slot; p.mu is held.
func (p *workerPool) start(slot int) error {
	concurrency, work := p.c.Concurrency, p.c.Work
	if slot == 0 && p.c.SlowWork > 0 && !p.calm {
		concurrency, work = p.c.SlowConcurrency, p.c.SlowWork
	}
	env := append(slices.Clone(p.env),
		"WORKER_CONCURRENCY="+strconv.Itoa(concurrency),
		"WORKER_SIMULATE_WORK="+work.String())
	if p.url != nil {
		env = append(env, "REDIS_URL="+p.url(slot)) // the last one wins
	}
	if p.extraEnv != nil {
		env = append(env, p.extraEnv(slot)...)
	}
	p.starts[slot]++
	log := filepath.Join(p.dir, fmt.Sprintf("worker%d.%d.log", slot, p.starts[slot]))
	proc, err := benchkit.Start(p.bin, workerArgs, env, log)
	if err != nil {
		return err
	}
	p.procs[slot], p.logs[slot] = proc, log
	p.pids[log] = proc.Pid()
	p.slots[log] = slot
	go p.watch(proc, log)
	return nil
}

// watch records a worker that exits without being killed or stopped.
func (p *workerPool) watch(proc *benchkit.Process, log string) {
	<-proc.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.killed[proc] {
		p.crashes = append(p.crashes, fmt.Sprintf("%s (%v)", log, proc.Err()))
	}
}

// kill SIGKILLs the worker of slot and starts a new one in its place.
func (p *workerPool) kill(slot int) error {
	p.mu.Lock()
	proc := p.procs[slot]
	p.mu.Unlock()
	return p.killProc(slot, proc)
}

// killProc SIGKILLs proc, the worker of slot, and starts a new one in its
// place unless another kill of proc did already (the chaos's kills and the
// hot-order phase's may meet on one worker).
func (p *workerPool) killProc(slot int, proc *benchkit.Process) error {
	p.mu.Lock()
	p.killed[proc] = true
	p.mu.Unlock()
	// A killed holder's orders wait for its lock's TTL and its tasks'
	// asynq leases (30 s) to end.
	p.trouble.add(slot, "SIGKILL", p.c.LockTTL+35*time.Second)
	proc.Kill()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.procs[slot] != proc {
		return nil
	}
	return p.start(slot)
}

// current returns the running worker of slot and its log file.
func (p *workerPool) current(slot int) (*benchkit.Process, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procs[slot], p.logs[slot]
}

// slotOf returns the slot of the process that wrote the log file path.
func (p *workerPool) slotOf(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slots[path]
}

// pidOf returns the process that wrote the log file path.
func (p *workerPool) pidOf(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pids[path]
}

// pause freezes the worker of slot with SIGSTOP for d (or until ctx ends),
// then continues it. A worker killed meanwhile is left alone.
func (p *workerPool) pause(ctx context.Context, slot int, d time.Duration) {
	proc, _ := p.current(slot)
	p.trouble.add(slot, "SIGSTOP", d+time.Second)
	pauseProc(ctx, proc, d)
}

// pauseProc freezes proc with SIGSTOP for d (or until ctx ends), then
// continues it.
func pauseProc(ctx context.Context, proc *benchkit.Process, d time.Duration) {
	if proc.Pause() != nil {
		return
	}
	select {
	case <-ctx.Done():
	case <-proc.Done():
	case <-time.After(d):
	}
	_ = proc.Resume()
}

// calmDown ends the chaos phase for the slow worker: it is stopped with
// SIGTERM and started again at the normal pace, so that the drain does not
// wait for its long tasks (an order's changes run one after another, and
// each one it takes would hold the order for -slow-work).
func (p *workerPool) calmDown() error {
	p.mu.Lock()
	p.calm = true
	if p.c.SlowWork == 0 {
		p.mu.Unlock()
		return nil
	}
	proc := p.procs[0]
	p.killed[proc] = true
	p.mu.Unlock()
	if err := proc.Stop(p.c.ShutdownTimeout + 10*time.Second); err != nil {
		return fmt.Errorf("slow worker: exit after SIGTERM: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start(0)
}

// stopAll stops every worker with SIGTERM and waits for them.
func (p *workerPool) stopAll() error {
	p.mu.Lock()
	procs := slices.Clone(p.procs)
	for _, proc := range procs {
		p.killed[proc] = true
	}
	p.mu.Unlock()
	var errs []error
	for slot, proc := range procs {
		if err := proc.Stop(p.c.ShutdownTimeout + 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: exit after SIGTERM: %w", slot, err))
		}
	}
	return errors.Join(errs...)
}

// killAll kills whatever still runs; for the end of a failed run.
func (p *workerPool) killAll() {
	p.mu.Lock()
	procs := slices.Clone(p.procs)
	for _, proc := range procs {
		p.killed[proc] = true
	}
	p.mu.Unlock()
	for _, proc := range procs {
		select {
		case <-proc.Done():
		default:
			proc.Kill()
		}
	}
}

// crashed returns the logs of the workers that exited on their own.
func (p *workerPool) crashed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.crashes)
}

// chaos kills a random worker every KillEvery, freezes one every
// PauseEvery, and makes the Redis switches (a restart, failovers) at their
// times, until its context ends.
type chaos struct {
	pool     *workerPool
	switches []redisSwitch
	c        settings
	out      io.Writer

	kills    int
	pauses   int
	switched []switched // the Redis switches made; read once run returned
}

// run runs the chaos until chaosCtx ends. A Redis switch under way then is
// finished (under ctx, the run's).
func (ch *chaos) run(ctx, chaosCtx context.Context, seed int) (err error) {
	var wg sync.WaitGroup
	switchErr := make(chan error, 1)
	wg.Go(func() { switchErr <- ch.runSwitches(ctx, chaosCtx) })
	defer func() {
		wg.Wait()
		err = cmp.Or(err, <-switchErr)
	}()
	ctx = chaosCtx
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	var kill <-chan time.Time
	if ch.c.KillEvery > 0 {
		t := time.NewTicker(ch.c.KillEvery)
		defer t.Stop()
		kill = t.C
	}
	var pause <-chan time.Time
	if ch.c.PauseEvery > 0 {
		t := time.NewTicker(ch.c.PauseEvery)
		defer t.Stop()
		pause = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kill:
			if err := ch.pool.kill(rng.IntN(ch.c.Workers)); err != nil {
				return err
			}
			ch.kills++
		case <-pause:
			// The freeze runs beside the kills; a frozen worker may
			// also be killed.
			slot := rng.IntN(ch.c.Workers)
			ch.pauses++
			wg.Go(func() { ch.pool.pause(ctx, slot, ch.c.PauseFor) })
		}
	}
}

// runSwitches makes the Redis switches, each at its time into the chaos
// phase, one after another, until chaosCtx ends; one under way then is
// finished under ctx, within two minutes.
func (ch *chaos) runSwitches(ctx, chaosCtx context.Context) error {
	start := time.Now()
	for _, sw := range ch.switches {
		select {
		case <-chaosCtx.Done():
			return nil
		case <-time.After(time.Until(start.Add(sw.at))):
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		began := time.Since(start)
		detail, took, err := sw.do(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", sw.name, err)
		}
		s := switched{name: sw.name, detail: detail, began: began, took: took}
		if sw.promoted != nil {
			s.served = sw.promoted()
		}
		ch.switched = append(ch.switched, s)
		fmt.Fprintf(ch.out, "redis %v into the chaos: %s\n", time.Since(start).Round(100*time.Millisecond), s)
	}
	return nil
}

// queueCounts sums asynq's queue sizes over the order queues.
type queueCounts struct {
	Pending, Active, Scheduled, Retry, Archived, Completed int
}

func (q queueCounts) unfinished() int { return q.Pending + q.Active + q.Scheduled + q.Retry }

// orderQueues returns the order queues asynq knows of, the shard queues
// of any shard count included.
func orderQueues(insp *asynq.Inspector) ([]string, error) {
	all, err := insp.Queues()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(q string) bool { return tasks.Kinds().OfQueue(q) == nil }), nil
}

func counts(insp *asynq.Inspector) (queueCounts, error) {
	var sum queueCounts
	queues, err := orderQueues(insp)
	if err != nil {
		return sum, err
	}
	for _, name := range queues {
		qi, err := insp.GetQueueInfo(name)
		if err != nil {
			return sum, err
		}
		sum.Pending += qi.Pending
		sum.Active += qi.Active
		sum.Scheduled += qi.Scheduled
		sum.Retry += qi.Retry + qi.Aggregating
		sum.Archived += qi.Archived
		sum.Completed += qi.Completed
	}
	return sum, nil
}

// drain waits until no task is pending, active, scheduled or waiting for a
// retry, or until timeout. It reports whether the queues drained.
func drain(ctx context.Context, insp *asynq.Inspector, timeout time.Duration, out io.Writer) (bool, error) {
	fmt.Fprintf(out, "draining (up to %v; a killed worker's tasks come back a minute or two after their lease expires) ...\n", timeout)
	deadline := time.Now().Add(timeout)
	lastReport := time.Now()
	for {
		q, err := counts(insp)
		if err == nil && q.unfinished() == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(out, "drain: gave up after %v: %+v\n", timeout, q)
			return false, nil
		}
		if time.Since(lastReport) >= 15*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(out, "  drain: %d pending, %d active, %d scheduled, %d retry; %d completed, %d archived\n",
				q.Pending, q.Active, q.Scheduled, q.Retry, q.Completed, q.Archived)
		}
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-time.After(time.Second):
		}
	}
}
