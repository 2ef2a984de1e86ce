package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// report is everything one run measured; it is also the JSON output.
type report struct {
	Started      time.Time  `json:"started"`
	GoVersion    string     `json:"go_version"`
	RedisVersion string     `json:"redis_version"`
	CPUs         int        `json:"cpus"`
	Workloads    []workload `json:"workloads"`
	// LoadAvg is /proc/loadavg at the start and at the end: other work on
	// the host skews every figure but the per-task counts.
	LoadAvg  [2]string       `json:"load_avg"`
	Results  []result        `json:"results"`
	Accept   []acceptResult  `json:"acceptance,omitempty"`
	Tokens   []tokenResult   `json:"tokens,omitempty"`
	Replicas []replicaResult `json:"replicas,omitempty"`
	Cluster  []clusterResult `json:"cluster,omitempty"`
	// Tracing is what tracing costs per task, (bt) against (b).
	Tracing []tracingCost `json:"tracing,omitempty"`
	// VsAW is (b)'s cost per task against (a+w)'s, plain asynq making
	// the same store write.
	VsAW  []awCost      `json:"vs_aw,omitempty"`
	Flood []floodResult `json:"flood,omitempty"`
	// FloodPlain is the flood's plain baseline: plain asynq at
	// concurrency 1 on the flood's changes.
	FloodPlain *floodPlain `json:"flood_plain,omitempty"`
	Targets    []target    `json:"targets,omitempty"`
}

// target is one of the goals the bench checks, met or not, or not judged
// (NA says why: the run gave too few samples).
type target struct {
	Name string  `json:"name"`
	Got  float64 `json:"got"`
	Want string  `json:"want"`
	Met  bool    `json:"met"`
	NA   string  `json:"not_judged,omitempty"`
}

// find returns the row of system sys on contention kind and workload w, or
// nil.
func (rep *report) find(sys, kind string, w workload) *result {
	return rep.findName(sys + "-" + kind + "-" + w.Name())
}

func (rep *report) findName(name string) *result {
	for i := range rep.Results {
		if rep.Results[i].Scenario == name {
			return &rep.Results[i]
		}
	}
	return nil
}

// rtSlack is how far (b)'s worker round trips per task may exceed (b0)'s
// over n tasks and still count as "no more". asynq tries its queues in a
// weighted random order, one dequeue round trip each, so the order_modify
// tasks cost 1 + p dequeues on average, p the chance that the empty
// order_exchange queue is tried first, with a standard deviation of
// sqrt(p(1-p)/n) per task; the slack is three of those, plus 0.01 for
// asynq's forwarder and heartbeat, which run per second, not per task.
func rtSlack(n int) float64 {
	q := worker.DefaultQueues()
	p := float64(q[tasks.QueueExchange]) / float64(q[tasks.QueueExchange]+q[tasks.QueueModify])
	return 0.01 + 3*math.Sqrt(p*(1-p)/float64(max(n, 1)))
}

// minHandoffs is how many hand-offs to a waiting task a hand-off p99 needs
// to be judged.
const minHandoffs = 100

// ratios fills in each row's ratios to (a) and, for (b), to (b0), on the
// same contention and workload, and the targets.
func (rep *report) ratios() {
	for i := range rep.Results {
		r := &rep.Results[i]
		prefix := r.Scenario[:strings.IndexByte(r.Scenario, '-')]
		rest := strings.TrimPrefix(r.Scenario, prefix)
		if a := rep.findName(sysPlain + rest); a != nil && a.TasksPerS > 0 {
			r.RatioToA = r.TasksPerS / a.TasksPerS
		}
		if b0 := rep.findName(sysUnordered + rest); b0 != nil && prefix == sysOW && b0.TasksPerS > 0 {
			r.RatioToB0 = r.TasksPerS / b0.TasksPerS
		}
		if b := rep.findName(sysOW + rest); b != nil && prefix == sysTraced && b.TasksPerS > 0 {
			r.RatioToB = r.TasksPerS / b.TasksPerS
		}
		if aw := rep.findName(sysPlainW + rest); aw != nil && (prefix == sysOW || prefix == sysTraced) && aw.TasksPerS > 0 {
			r.RatioToAW = r.TasksPerS / aw.TasksPerS
		}
	}
	add := func(name string, got float64, want string, met bool) {
		rep.Targets = append(rep.Targets, target{Name: name, Got: got, Want: want, Met: met})
	}
	handoff := func(name string, r *result, limit float64) {
		t := target{Name: name, Got: r.HandoffP99, Want: "<= " + strconv.FormatFloat(limit, 'f', -1, 64), Met: r.HandoffP99 <= limit}
		if r.Handoffs < minHandoffs {
			t.Met, t.NA = false, fmt.Sprintf("only %d hand-offs to a waiting task (of %d), fewer than %d", r.Handoffs, r.HandoffsAll, minHandoffs)
		}
		rep.Targets = append(rep.Targets, t)
	}
	for _, w := range rep.Workloads {
		tag := " [" + w.Name() + "]"
		bu, bc := rep.find(sysOW, uncontended, w), rep.find(sysOW, contended, w)
		if w == standard {
			// The targets of the 10 ms rows, from before ordering.
			if bu != nil && bu.RatioToA > 0 {
				add("(b)/(a) uncontended"+tag, bu.RatioToA, ">= 0.85", bu.RatioToA >= 0.85)
			}
			if bc != nil && bc.RatioToA > 0 {
				add("(b)/(a) contended"+tag, bc.RatioToA, ">= 0.65", bc.RatioToA >= 0.65)
			}
			if bc != nil && bc.HandoffsAll > 0 {
				handoff("(b) hand-off p99 ms"+tag, bc, 10)
				if c := rep.find(sysSeed, contended, w); c != nil && c.Handoffs > 0 && bc.HandoffP99 > 0 {
					x := c.HandoffP99 / bc.HandoffP99
					add("(c)/(b) hand-off p99"+tag, x, ">= 50x", x >= 50)
				}
			}
		}
		if w == standard && bu != nil && bu.RatioToA > 0 {
			// The cost issue's: what the hot path's savings must not lose.
			add("(b)/(a) uncontended, kept"+tag, bu.RatioToA, ">= 0.95", bu.RatioToA >= 0.95)
		}
		if w.Work == 0 {
			// The cost per task at zero work, against plain asynq.
			if a := rep.find(sysPlain, uncontended, w); a != nil && bu != nil && a.RedisCPUPerTask > 0 && a.WorkerCPUPerTask > 0 {
				x := bu.RedisCPUPerTask / a.RedisCPUPerTask
				add("(b)/(a) Redis CPU per task uncontended"+tag, x, "<= 1.50", x <= 1.5)
				x = bu.WorkerCPUPerTask / a.WorkerCPUPerTask
				add("(b)/(a) worker CPU per task uncontended"+tag, x, "<= 1.40", x <= 1.4)
			}
			if bu != nil && bu.RatioToA > 0 {
				add("(b)/(a) uncontended"+tag, bu.RatioToA, ">= 0.70", bu.RatioToA >= 0.7)
			}
			if bc != nil && bc.RatioToA > 0 {
				add("(b)/(a) contended"+tag, bc.RatioToA, ">= 0.80", bc.RatioToA >= 0.8)
			}
		}
		if bc != nil && bc.HandoffsAll > 0 {
			handoff("(b) hot hand-off p99 ms"+tag, bc, 5)
		}
		if bc != nil && bc.RatioToB0 > 0 {
			add("(b)/(b0) hot throughput"+tag, bc.RatioToB0, ">= 1.00", bc.RatioToB0 >= 1)
		}
		if bc != nil && bc.RoundTripsPerTask > 0 {
			// The hot orders' issue: a change of a hot order costs the
			// worker little more than a plain asynq task that writes.
			add(fmt.Sprintf("(b) worker round trips/change, %d hot orders", bc.Orders)+tag, bc.RoundTripsPerTask, "<= 2.50", bc.RoundTripsPerTask <= 2.5)
		}
		if w.Work == 0 {
			for _, kind := range []string{uncontended, contended} {
				b, aw := rep.find(sysOW, kind, w), rep.find(sysPlainW, kind, w)
				if b != nil && aw != nil && aw.RedisCPUPerTask > 0 {
					x := b.RedisCPUPerTask / aw.RedisCPUPerTask
					add("(b)/(a+w) Redis CPU per change "+kind+tag, x, "<= 1.50", x <= 1.5)
				}
			}
		}
		for _, kind := range []string{uncontended, contended} {
			b, b0 := rep.find(sysOW, kind, w), rep.find(sysUnordered, kind, w)
			if b != nil && b0 != nil {
				slack := rtSlack(min(b.Tasks, b0.Tasks))
				add("(b) worker round trips/task "+kind+tag, b.RoundTripsPerTask,
					fmt.Sprintf("<= %.2f (b0)+%.2f", b0.RoundTripsPerTask, slack), b.RoundTripsPerTask <= b0.RoundTripsPerTask+slack)
			}
			if b != nil && b.OrderPairs > 0 {
				add("(b) inversions "+kind+tag, float64(b.Inversions), "0", b.Inversions == 0)
			}
		}
	}
	for _, kind := range []string{uncontended, contended} {
		raw, prod := rep.findAccept(acceptRaw, kind), rep.findAccept(acceptProducer, kind)
		if raw == nil || prod == nil {
			continue
		}
		add(fmt.Sprintf("producer/raw enqueue rate, %d goroutines, %s", prod.Goroutines, kind), prod.RatioToRaw, ">= 0.80", prod.RatioToRaw >= 0.8)
		add("producer round trips/change "+kind, prod.RoundTripsPerChange,
			fmt.Sprintf("<= %.2f (raw+1)", raw.RoundTripsPerChange+1), prod.RoundTripsPerChange <= raw.RoundTripsPerChange+1)
	}
	rep.Tracing = rep.tracingCosts()
	rep.VsAW = rep.awCosts()
	rep.Targets = append(rep.Targets, floodTargets(rep.Flood)...)
}

func (rep *report) print(out io.Writer, c settings) {
	fmt.Fprintf(out, "\norderworker bench: %s, redis %s, %d CPUs; load average %s at the start, %s at the end\n",
		rep.GoVersion, rep.RedisVersion, rep.CPUs, rep.LoadAvg[0], rep.LoadAvg[1])
	for _, w := range rep.Workloads {
		rep.printWorkload(out, w)
	}
	fmt.Fprintln(out)
	for _, r := range rep.Results {
		if r.Note != "" {
			fmt.Fprintf(out, "note: %s: %s\n", r.Scenario, r.Note)
		}
		if r.Archived > 0 {
			fmt.Fprintf(out, "note: %s: %d tasks archived (failed for good)\n", r.Scenario, r.Archived)
		}
	}
	fmt.Fprint(out, legend)
	rep.printOrderingTrips(out)
	rep.printAWCost(out)
	rep.printHolds(out)
	rep.printTracingCost(out)
	printFlood(out, rep.FloodPlain, rep.Flood)
	if len(rep.Accept) > 0 {
		printAccept(out, rep.Accept)
	}
	if len(rep.Targets) > 0 {
		fmt.Fprintln(out, "\ntargets (ratios from this run):")
		for _, t := range rep.Targets {
			mark := "not met"
			switch {
			case t.NA != "":
				mark = "not judged: " + t.NA
			case t.Met:
				mark = "met"
			}
			fmt.Fprintf(out, "  %-56s %8.2f  want %-18s %s\n", t.Name, t.Got, t.Want, mark)
		}
	}
	if c.Verbose {
		for _, r := range rep.Results {
			fmt.Fprintf(out, "\n%s: redis commands/task (µs/task, by time; EVALSHA's time includes its commands'): %s\n", r.Scenario, cmdsPerTask(r.Commands, r.Tasks))
			fmt.Fprintf(out, "%s: round trips/task: %s\n", r.Scenario, perTask(r.RoundTrips, r.Tasks))
		}
		for _, a := range rep.Accept {
			fmt.Fprintf(out, "\naccept %s %s: round trips/change: %s\n", a.Contention, a.System, perTask(a.RoundTrips, a.Changes))
		}
	}
}

// printWorkload prints the rows of one workload.
func (rep *report) printWorkload(out io.Writer, w workload) {
	fmt.Fprintf(out, "\n%s (%s):\n\n", w.Name(), w)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\ttasks\torders\ttasks/s\tvs (a)\tvs (a+w)\tvs (b0)\truns/task\thand-offs\thand-off p50 ms\tp99 ms\tlock wait p50 ms\tp99 ms\tmax ms\tredis cmds/task\tscripts/task\tround trips/task\tworker CPU µs/task\tredis CPU µs/task\tpeak RSS MiB\tΔRSS MiB\tpeak heap MiB\tno-lock runs\toverlaps\tout of order\t")
	for _, r := range rep.Results {
		if r.Workload != w.Name() {
			continue
		}
		sys := r.Scenario[:strings.IndexByte(r.Scenario, '-')]
		ratio, vsAW, vsB0, runs, p50, p99 := "-", "-", "-", "-", "-", "-"
		w50, w99, wmax := "-", "-", "-"
		if sys != sysPlain && sys != sysPlainW {
			w50, w99, wmax = f2(r.LockWaitP50), f2(r.LockWaitP99), f2(r.LockWaitMax)
			runs = f2(r.RunsPerTask)
		}
		if r.RatioToA > 0 && sys != sysPlain {
			ratio = f2(r.RatioToA)
		}
		if r.RatioToB0 > 0 {
			vsB0 = f2(r.RatioToB0)
		}
		if r.RatioToAW > 0 {
			vsAW = f2(r.RatioToAW)
		}
		handoffs := "-"
		if r.HandoffsAll > 0 {
			handoffs = strconv.Itoa(r.Handoffs) + "/" + strconv.Itoa(r.HandoffsAll)
		}
		if r.Handoffs > 0 {
			p50, p99 = f2(r.HandoffP50), f2(r.HandoffP99)
		}
		bypass, overlaps, order := "-", "-", "-"
		if sys == sysSeed {
			bypass = strconv.FormatInt(r.SeedBypasses, 10)
		}
		if sys != sysPlain && sys != sysPlainW {
			overlaps = strconv.Itoa(r.Overlaps)
		}
		if r.OrderPairs > 0 {
			order = strconv.Itoa(r.Inversions) + "/" + strconv.Itoa(r.OrderPairs)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.2f\t%.2f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Scenario, r.Tasks, r.Orders, r.TasksPerS, ratio, vsAW, vsB0, runs, handoffs, p50, p99, w50, w99, wmax,
			r.CmdsPerTask, r.ScriptsPerTask, r.RoundTripsPerTask, r.WorkerCPUPerTask, r.RedisCPUPerTask,
			mib(r.PeakRSSKiB), mib(r.PeakRSSDeltaKiB), mib(int64(r.PeakHeapKiB)), bypass, overlaps, order)
	}
	_ = tw.Flush()
}

const legend = `
  a/aw/b0/b/c: (a) plain asynq whose handler only sleeps the work time; (a+w) the same, then (b)'s store
         write (the Redis store's Modify, fence 1, without lock or order); (b) worker.New with the order lock
         and the Redis store, the work slept inside the lock before the store write, its tasks enqueued
         by the producer (with their position: applied in the order of acceptance); (b0) the same worker
         with ordering off: the same tasks enqueued with asynq's Client by hand, without a position
         (payload minus seq, task ID = event ID, the kind's queue), so it applies them in any order;
         (bt) is (b) with tracing on, producer and worker: an SDK tracer provider at full sampling
         (AlwaysSample, a BatchSpanProcessor with the SDK's defaults) exporting over OTLP HTTP to a
         receiver in the bench process that discards what it gets (its CPU counts as the worker's);
         on -bt-workloads only (work0 by default). (c) the seed's lock (EXISTS then SET, 0-1000 ms
         random sleeps, 5 s deadline then no lock) around the same work and write. All modifies of the
         address, enqueued before the measured phase, each order's tasks one after the other; (a), (a+w)
         and (b0) by hand without a position (the producer would park the changes behind an order's head).
  workloads: work<d> is d of simulated work per task at the concurrency shown (-workloads).
  tasks/s: tasks over the time from starting the worker to the last task completed; vs (a), vs (a+w),
         vs (b0): the same ratio to (a), and for (b) to (a+w) and (b0), on the same orders and workload.
  runs/task: handler runs per task: a task that goes back to its queue to wait runs again ((b): parked
         until its turn, (b0)/(b): the lock stayed held past its wait deadline).
  hand-off: release to the next holder, from the order histories: per order, ended_at of one entry
         (the store commit, Redis TIME) to started_at of the next (its worker had the lock; same host
         clock), so it includes the holder's release round trip. Counted only when the next holder
         was already waiting at the commit (its started_at minus its lock wait is earlier), so a
         newcomer that grabs the lock on arrival does not count; hand-offs shows waiters/all pairs.
         Uncontended orders have none.
  lock wait: per run, from asking for the order's lock to having it or going back to the queue (for (c),
         or to giving up at its 5 s deadline); for (b0)/(b) the worker's own lock_wait of each run.
  redis cmds/task: INFO commandstats delta / tasks, commands run inside scripts included (the bench's
         own INFO and ZCARD polls left out); scripts/task: the EVALSHA among them.
  round trips/task: what the worker's go-redis client sent (a pipeline is one) / tasks.
  worker CPU: user+system CPU of the bench process (the workers run in it) over the measured phase / tasks;
         redis CPU: the server's, from INFO cpu.
  peak RSS: VmHWM of the bench process (workers run in it) over the measured phase, reset at its
         start; ΔRSS is that peak minus the RSS at the start. peak heap: Go heap objects, sampled every 10 ms.
  no-lock runs: tasks (c) ran without the lock after its 5 s deadline, as the seed did.
  overlaps: critical sections on one order that overlapped in time, from the histories.
  out of order: inversions / consecutive changes of one order in the histories: for (b) a change applied
         after one with a later position (must be 0); for (b0) and (c) after one enqueued later.
`

// tracingCost is what tracing at full sampling costs per task: (bt) against
// (b) on one workload and contention, side by side in one run.
type tracingCost struct {
	Workload   string `json:"workload"`
	Contention string `json:"contention"`
	// Throughput is (bt)'s tasks/s over (b)'s.
	Throughput float64 `json:"throughput_ratio"`
	// WorkerCPU and RedisCPU are (bt)'s CPU per task over (b)'s; the
	// worker's includes the span export and the in-process receiver.
	WorkerCPU float64 `json:"worker_cpu_ratio"`
	RedisCPU  float64 `json:"redis_cpu_ratio"`
	// Cmds and RoundTrips are (bt)'s Redis commands and worker round
	// trips per task over (b)'s: tracing adds none.
	Cmds       float64 `json:"redis_cmds_ratio"`
	RoundTrips float64 `json:"round_trips_ratio"`
	// WorkerCPUUs is (bt)'s worker CPU per task minus (b)'s, in µs.
	WorkerCPUUs  float64 `json:"worker_cpu_us_added"`
	SpansPerTask float64 `json:"spans_per_task"`
	SpansDropped int64   `json:"spans_dropped"`
	ExportBytes  float64 `json:"export_bytes_per_task"`
}

// tracingCosts returns the cost of tracing for each workload and contention
// measured with both (b) and (bt).
func (rep *report) tracingCosts() []tracingCost {
	var out []tracingCost
	ratio := func(x, y float64) float64 {
		if y == 0 {
			return 0
		}
		return x / y
	}
	for _, w := range rep.Workloads {
		for _, kind := range []string{uncontended, contended} {
			b, bt := rep.find(sysOW, kind, w), rep.find(sysTraced, kind, w)
			if b == nil || bt == nil {
				continue
			}
			out = append(out, tracingCost{
				Workload: w.Name(), Contention: kind,
				Throughput:   ratio(bt.TasksPerS, b.TasksPerS),
				WorkerCPU:    ratio(bt.WorkerCPUPerTask, b.WorkerCPUPerTask),
				RedisCPU:     ratio(bt.RedisCPUPerTask, b.RedisCPUPerTask),
				Cmds:         ratio(bt.CmdsPerTask, b.CmdsPerTask),
				RoundTrips:   ratio(bt.RoundTripsPerTask, b.RoundTripsPerTask),
				WorkerCPUUs:  bt.WorkerCPUPerTask - b.WorkerCPUPerTask,
				SpansPerTask: bt.SpansPerTask, SpansDropped: bt.SpansDropped, ExportBytes: bt.ExportBytesPerTask,
			})
		}
	}
	return out
}

// printTracingCost prints rep.Tracing: (bt) against (b).
func (rep *report) printTracingCost(out io.Writer) {
	if len(rep.Tracing) == 0 {
		return
	}
	fmt.Fprintln(out, "\ntracing's cost per task: (bt), traced at full sampling, over (b), side by side in this run:")
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tcontention\ttasks/s\tworker CPU/task\t(µs added)\tredis CPU/task\tredis cmds/task\tround trips/task\tspans/task\tdropped\tOTLP bytes/task\t")
	for _, t := range rep.Tracing {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%+.0f\t%s\t%s\t%s\t%.2f\t%d\t%.0f\t\n", t.Workload, t.Contention,
			f2(t.Throughput), f2(t.WorkerCPU), t.WorkerCPUUs, f2(t.RedisCPU), f2(t.Cmds), f2(t.RoundTrips),
			t.SpansPerTask, t.SpansDropped, t.ExportBytes)
	}
	_ = tw.Flush()
	fmt.Fprint(out, `
  ratios are (bt)/(b): tasks/s (below 1: slower), CPU, commands and round trips per task (above 1: more).
         One run each: the throughput and CPU ratios move by about as much as (b)/(b0)'s between runs.
  spans/task: spans ended (producer's not counted: they are exported before the measured phase);
         dropped: ended but not exported (the batch processor's queue full); OTLP bytes: request bodies.
`)
}

// scriptNames names the round trips the worker path makes, by CallName.
// asynq's scripts are named by the shapes of their first two keys
// (benchkit.KeyShape), which package asynqredis spells.
var scriptNames = map[string]string{
	evalsha(asynqredis.PendingKey(""), asynqredis.PausedKey("")):    "asynq dequeue (one per queue tried)",
	evalsha(asynqredis.ActiveKey(""), asynqredis.LeaseKey("")):      "asynq done",
	evalsha(asynqredis.TaskKey("", "*"), asynqredis.ActiveKey("")):  "asynq retry (back to the queue to wait)",
	evalsha(asynqredis.TaskKey("", "*"), asynqredis.PendingKey("")): "requeue front (wake a parked task)",
	evalsha(asynqredis.RetryKey(""), asynqredis.PendingKey("")):     "asynq forward (retry set to queue)",
	"evalsha ow:lock:{} ow:lock:{}:fence":                           "lock acquire",
	"evalsha ow:lock:{} ow:lock:{}:seq":                             "lock release",
	"evalsha ow:order:{} ow:order:{}:history":                       "store commit (with the release)",
}

func evalsha(key1, key2 string) string { return "evalsha " + key1 + " " + key2 }

func callLabel(name string) string {
	if s, ok := scriptNames[name]; ok {
		return s
	}
	return name
}

// printOrderingTrips prints, for each workload and contention measured with
// both (b) and (b0), the worker round trips per task that differ: what
// ordering adds to (or saves) the worker.
func (rep *report) printOrderingTrips(out io.Writer) {
	header := false
	for _, w := range rep.Workloads {
		for _, kind := range []string{uncontended, contended} {
			b, b0 := rep.find(sysOW, kind, w), rep.find(sysUnordered, kind, w)
			if b == nil || b0 == nil {
				continue
			}
			if !header {
				fmt.Fprintln(out, "\nworker round trips per task, (b) minus (b0): what ordering adds to the worker (calls that differ by 0.02 or more):")
				header = true
			}
			diff := map[string]float64{}
			for name, n := range b.RoundTrips {
				diff[name] += float64(n) / float64(b.Tasks)
			}
			for name, n := range b0.RoundTrips {
				diff[name] -= float64(n) / float64(b0.Tasks)
			}
			delete(diff, "handshake")
			names := benchkit.Top(diff, len(diff), func(v float64) int64 { return int64(math.Abs(v) * 1e6) })
			var parts []string
			for _, name := range names {
				if d := diff[name]; math.Abs(d) >= 0.02 {
					parts = append(parts, fmt.Sprintf("%s %+.2f", callLabel(name), d))
				}
			}
			if len(parts) == 0 {
				parts = []string{"none"}
			}
			fmt.Fprintf(out, "  %s %s: %.2f - %.2f = %+.2f: %s\n", kind, w.Name(), b.RoundTripsPerTask, b0.RoundTripsPerTask,
				b.RoundTripsPerTask-b0.RoundTripsPerTask, strings.Join(parts, ", "))
		}
	}
}

func perTask(calls map[string]int64, n int) string {
	var parts []string
	for _, name := range benchkit.Top(calls, 20, func(v int64) int64 { return v }) {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, float64(calls[name])/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// cmdsPerTask lists commands by Redis time: calls and µs per task.
func cmdsPerTask(stats map[string]benchkit.CmdStat, n int) string {
	var parts []string
	for _, name := range benchkit.Top(stats, 20, func(v benchkit.CmdStat) int64 { return v.Usec }) {
		st := stats[name]
		parts = append(parts, fmt.Sprintf("%s %.2f (%.1fµs)", name, float64(st.Calls)/float64(n), float64(st.Usec)/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// loadAvg returns the 1, 5 and 15 minute load averages of the host.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

func mib(kib int64) string {
	if kib == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(kib)/1024, 'f', 1, 64)
}
