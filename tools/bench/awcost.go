package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// awCost is (b)'s cost per task against (a+w)'s, plain asynq whose handler
// makes the same store write without lock or order, on one workload and
// contention: what ordering costs over a fair baseline.
type awCost struct {
	Workload   string `json:"workload"`
	Contention string `json:"contention"`
	// Throughput is (b)'s tasks/s over (a+w)'s; the others are (b)'s per
	// task over (a+w)'s.
	Throughput float64 `json:"throughput_ratio"`
	RoundTrips float64 `json:"round_trips_ratio"`
	Cmds       float64 `json:"redis_cmds_ratio"`
	RedisCPU   float64 `json:"redis_cpu_ratio"`
	WorkerCPU  float64 `json:"worker_cpu_ratio"`
	// BRoundTrips and AWRoundTrips are the two round trips per task.
	BRoundTrips  float64 `json:"b_round_trips_per_task"`
	AWRoundTrips float64 `json:"aw_round_trips_per_task"`
}

func ratioOf(x, y float64) float64 {
	if y == 0 {
		return 0
	}
	return x / y
}

// awCosts returns (b) against (a+w) for each workload and contention
// measured with both.
func (rep *report) awCosts() []awCost {
	var out []awCost
	for _, w := range rep.Workloads {
		for _, kind := range []string{uncontended, contended} {
			b, aw := rep.find(sysOW, kind, w), rep.find(sysPlainW, kind, w)
			if b == nil || aw == nil {
				continue
			}
			out = append(out, awCost{
				Workload: w.Name(), Contention: kind,
				Throughput:  ratioOf(b.TasksPerS, aw.TasksPerS),
				RoundTrips:  ratioOf(b.RoundTripsPerTask, aw.RoundTripsPerTask),
				Cmds:        ratioOf(b.CmdsPerTask, aw.CmdsPerTask),
				RedisCPU:    ratioOf(b.RedisCPUPerTask, aw.RedisCPUPerTask),
				WorkerCPU:   ratioOf(b.WorkerCPUPerTask, aw.WorkerCPUPerTask),
				BRoundTrips: b.RoundTripsPerTask, AWRoundTrips: aw.RoundTripsPerTask,
			})
		}
	}
	return out
}

// printAWCost prints rep.VsAW.
func (rep *report) printAWCost(out io.Writer) {
	if len(rep.VsAW) == 0 {
		return
	}
	fmt.Fprintln(out, "\n(b)'s cost against (a+w), plain asynq making the same store write without lock or order:")
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tcontention\ttasks/s\tround trips/task\t(b)\t(a+w)\tredis cmds/task\tredis CPU/task\tworker CPU/task\t")
	for _, c := range rep.VsAW {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t\n", c.Workload, c.Contention, f2(c.Throughput), f2(c.RoundTrips),
			c.BRoundTrips, c.AWRoundTrips, f2(c.Cmds), f2(c.RedisCPU), f2(c.WorkerCPU))
	}
	_ = tw.Flush()
	fmt.Fprintln(out, "\n  ratios are (b)/(a+w): tasks/s (below 1: slower), round trips, commands and CPU per task (above 1: more).")
}

// printHolds prints the holds of the rows of the worker that drained.
func (rep *report) printHolds(out io.Writer) {
	header := false
	for _, r := range rep.Results {
		if r.Holds == 0 && r.HoldsYielded == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(out, "\nholds that drained (the worker's orderworker_hold_changes and orderworker_holds_yielded_total):")
			header = true
		}
		fmt.Fprintf(out, "  %-28s %6d holds, %6.1f changes/hold, %5d yielded (of %d tasks)\n", r.Scenario, r.Holds, r.ChangesPerHold, r.HoldsYielded, r.Tasks)
	}
}
