package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orderworker/orderworker/internal/benchkit"
)

// report is everything one run measured; it is also the JSON output.
type report struct {
	Started      time.Time `json:"started"`
	GoVersion    string    `json:"go_version"`
	RedisVersion string    `json:"redis_version"`
	CPUs         int       `json:"cpus"`
	Concurrency  int       `json:"concurrency"`
	WorkMs       float64   `json:"work_ms"`
	// LoadAvg is /proc/loadavg at the start and at the end: other work on
	// the host skews every figure but the per-task counts.
	LoadAvg  [2]string       `json:"load_avg"`
	Results  []result        `json:"results"`
	Tokens   []tokenResult   `json:"tokens,omitempty"`
	Replicas []replicaResult `json:"replicas,omitempty"`
	Targets  []target        `json:"targets,omitempty"`
}

// target is one of the goals the bench checks, met or not.
type target struct {
	Name string  `json:"name"`
	Got  float64 `json:"got"`
	Want string  `json:"want"`
	Met  bool    `json:"met"`
}

func (rep *report) find(name string) *result {
	for i := range rep.Results {
		if rep.Results[i].Scenario == name {
			return &rep.Results[i]
		}
	}
	return nil
}

// ratios fills in each row's ratio to (a) on the same contention, and the
// targets.
func (rep *report) ratios() {
	for i := range rep.Results {
		r := &rep.Results[i]
		_, kind, _ := strings.Cut(r.Scenario, "-")
		if a := rep.find(sysPlain + "-" + kind); a != nil && a.TasksPerS > 0 {
			r.RatioToA = r.TasksPerS / a.TasksPerS
		}
	}
	if b := rep.find("b-uncontended"); b != nil && b.RatioToA > 0 {
		rep.Targets = append(rep.Targets, target{"(b)/(a) uncontended", b.RatioToA, ">= 0.85", b.RatioToA >= 0.85})
	}
	b := rep.find("b-contended")
	if b != nil && b.RatioToA > 0 {
		rep.Targets = append(rep.Targets, target{"(b)/(a) contended", b.RatioToA, ">= 0.65", b.RatioToA >= 0.65})
	}
	if b != nil && b.Handoffs > 0 {
		rep.Targets = append(rep.Targets, target{"(b) hand-off p99 ms", b.HandoffP99, "<= 10", b.HandoffP99 <= 10})
		if c := rep.find("c-contended"); c != nil && c.Handoffs > 0 && b.HandoffP99 > 0 {
			x := c.HandoffP99 / b.HandoffP99
			rep.Targets = append(rep.Targets, target{"(c)/(b) hand-off p99", x, ">= 50x", x >= 50})
		}
	}
}

func (rep *report) print(out io.Writer, c settings) {
	fmt.Fprintf(out, "\norderworker bench: %s, redis %s, %d CPUs, concurrency %d, work %v per task; load average %s at the start, %s at the end\n\n",
		rep.GoVersion, rep.RedisVersion, rep.CPUs, c.Concurrency, c.Work, rep.LoadAvg[0], rep.LoadAvg[1])
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\ttasks\torders\ttasks/s\tvs (a)\thand-offs\thand-off p50 ms\tp99 ms\tlock wait p50 ms\tp99 ms\tmax ms\tredis cmds/task\tscripts/task\tround trips/task\tworker CPU µs/task\tredis CPU µs/task\tpeak RSS MiB\tΔRSS MiB\tpeak heap MiB\tno-lock runs\toverlaps\t")
	for _, r := range rep.Results {
		ratio, p50, p99 := "-", "-", "-"
		w50, w99, wmax := "-", "-", "-"
		if r.Scenario[0] != 'a' {
			w50, w99, wmax = f2(r.LockWaitP50), f2(r.LockWaitP99), f2(r.LockWaitMax)
		}
		if r.RatioToA > 0 && r.System != systemNames[sysPlain] {
			ratio = f2(r.RatioToA)
		}
		handoffs := "-"
		if r.HandoffsAll > 0 {
			handoffs = strconv.Itoa(r.Handoffs) + "/" + strconv.Itoa(r.HandoffsAll)
		}
		if r.Handoffs > 0 {
			p50, p99 = f2(r.HandoffP50), f2(r.HandoffP99)
		}
		bypass, overlaps := "-", "-"
		if r.Scenario[0] == 'c' {
			bypass = strconv.FormatInt(r.SeedBypasses, 10)
		}
		if r.Scenario[0] != 'a' {
			overlaps = strconv.Itoa(r.Overlaps)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.2f\t%.2f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Scenario, r.Tasks, r.Orders, r.TasksPerS, ratio, handoffs, p50, p99, w50, w99, wmax,
			r.CmdsPerTask, r.ScriptsPerTask, r.RoundTripsPerTask, r.WorkerCPUPerTask, r.RedisCPUPerTask,
			mib(r.PeakRSSKiB), mib(r.PeakRSSDeltaKiB), mib(int64(r.PeakHeapKiB)), bypass, overlaps)
	}
	_ = tw.Flush()
	fmt.Fprintln(out)
	for _, r := range rep.Results {
		if r.Note != "" {
			fmt.Fprintf(out, "note: %s: %s\n", r.Scenario, r.Note)
		}
		if r.Archived > 0 {
			fmt.Fprintf(out, "note: %s: %d tasks archived (failed for good)\n", r.Scenario, r.Archived)
		}
	}
	fmt.Fprint(out, `
  a/b/c: (a) plain asynq whose handler only sleeps the work time; (b) worker.New with the order lock
         and the Redis store, the work slept inside the lock before the store write; (c) the seed's
         lock (EXISTS then SET, 0-1000 ms random sleeps, 5 s deadline then no lock) around the same.
         All modifies of the address, enqueued by the producer before the measured phase.
  tasks/s: tasks over the time from starting the worker to the last task completed.
  hand-off: release to the next holder, from the order histories: per order, ended_at of one entry
         (the store commit, Redis TIME) to started_at of the next (its worker had the lock; same host
         clock), so it includes the holder's release round trip. Counted only when the next holder
         was already waiting at the commit (its started_at minus its lock wait is earlier), so a
         newcomer that grabs the lock on arrival does not count; hand-offs shows waiters/all pairs.
         Uncontended orders have none.
  lock wait: per task, from asking for the order's lock to having it (for (c), or to giving up at its
         5 s deadline); for (b) the worker's own lock_wait of each run (a busy run counts its full wait).
  redis cmds/task: INFO commandstats delta / tasks, commands run inside scripts included (the bench's
         own INFO and ZCARD polls left out); scripts/task: the EVALSHA among them.
  round trips/task: what the worker's go-redis client sent (a pipeline is one) / tasks.
  worker CPU: user+system CPU of the bench process (the workers run in it) over the measured phase / tasks;
         redis CPU: the server's, from INFO cpu.
  peak RSS: VmHWM of the bench process (workers run in it) over the measured phase, reset at its
         start; ΔRSS is that peak minus the RSS at the start. peak heap: Go heap objects, sampled every 10 ms.
  no-lock runs: tasks (c) ran without the lock after its 5 s deadline, as the seed did.
  overlaps: critical sections on one order that overlapped in time, from the histories.
`)
	if len(rep.Targets) > 0 {
		fmt.Fprintln(out, "\ntargets:")
		for _, t := range rep.Targets {
			mark := "MISS"
			if t.Met {
				mark = "ok"
			}
			fmt.Fprintf(out, "  %-24s %8.2f  want %-8s %s\n", t.Name, t.Got, t.Want, mark)
		}
	}
	if c.Verbose {
		for _, r := range rep.Results {
			fmt.Fprintf(out, "\n%s: redis commands/task (µs/task, by time; EVALSHA's time includes its commands'): %s\n", r.Scenario, cmdsPerTask(r.Commands, r.Tasks))
			fmt.Fprintf(out, "%s: round trips/task: %s\n", r.Scenario, perTask(r.RoundTrips, r.Tasks))
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
