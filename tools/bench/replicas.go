package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// replicaResult is one run of -replicas: k worker processes of one system.
type replicaResult struct {
	Replicas int    `json:"replicas"`
	System   string `json:"system"`
	Tasks    int    `json:"tasks"`
	// TasksPerS is tasks over the time from spawning the processes to the
	// last task completed (process start-up included); SteadyPerS is the
	// rate between the 10% and 90% completion marks.
	TasksPerS   float64 `json:"tasks_per_s"`
	SteadyPerS  float64 `json:"steady_tasks_per_s"`
	RatioToA    float64 `json:"steady_ratio_to_a,omitempty"`
	CmdsPerTask float64 `json:"redis_cmds_per_task"`
	// PeakRSSMaxKiB and PeakRSSSumKiB are the largest and the sum of the
	// processes' VmHWM, read just before they were stopped.
	PeakRSSMaxKiB int64 `json:"peak_rss_max_kib"`
	PeakRSSSumKiB int64 `json:"peak_rss_sum_kib"`
	// WorkerCPUPerTask is the processes' CPU time (user + system, all of
	// them, start-up included) per task, in µs; RedisCPUPerTask the
	// server's over the same time.
	WorkerCPUPerTask float64 `json:"worker_cpu_us_per_task"`
	RedisCPUPerTask  float64 `json:"redis_cpu_us_per_task"`
	Archived         int64   `json:"archived"`
}

// runReplicas measures k worker processes for each k in counts: cmd/worker
// with WORKER_SIMULATE_WORK (b) and, unless disabled, this binary in
// -as-worker=plain mode (a), on uncontended orders.
func runReplicas(ctx context.Context, opts *redisconn.Options, c settings, counts []int, out io.Writer) ([]replicaResult, error) {
	dir, err := os.MkdirTemp("", "bench-replicas-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(out, "\nbuilding %s ...\n", benchkit.WorkerPackage)
	bin, err := benchkit.BuildWorker(ctx, dir)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var results []replicaResult
	for _, k := range counts {
		var plain *replicaResult
		for _, sys := range []string{sysPlain, sysOW} {
			if sys == sysPlain && !c.ReplicaPlain {
				continue
			}
			sc := scenario{Name: fmt.Sprintf("replicas%d-%s", k, sys), System: sys, Tasks: c.ReplicaTasks, Orders: c.ReplicaTasks}
			fmt.Fprintf(out, "running %d × %s: %d tasks, %v work ...\n", k, systemNames[sys], sc.Tasks, c.ReplicaWork)
			// Replicas cannot share :9090.
			cmd, args := bin, []string{"-ops-addr", "127.0.0.1:0"}
			if sys == sysPlain {
				cmd, args = self, []string{"-as-worker", "plain"}
			}
			r, err := runReplicaSet(ctx, opts, c, sc, k, dir, cmd, args)
			if err != nil {
				return nil, fmt.Errorf("%s: %w (logs in %s)", sc.Name, err, dir)
			}
			if sys == sysPlain {
				plain = &r
			} else if plain != nil && plain.SteadyPerS > 0 {
				r.RatioToA = r.SteadyPerS / plain.SteadyPerS
			}
			results = append(results, r)
		}
	}
	return results, nil
}

func runReplicaSet(ctx context.Context, opts *redisconn.Options, c settings, sc scenario, k int, dir, bin string, args []string) (replicaResult, error) {
	r := replicaResult{Replicas: k, System: systemNames[sc.System], Tasks: sc.Tasks}
	admin := opts.NewClient()
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		return r, err
	}
	if sc.System != sysPlain {
		store, err := redisstore.New(admin, redisstore.Config{Prefix: prefix})
		if err != nil {
			return r, err
		}
		if err := seedOrders(ctx, store, sc); err != nil {
			return r, err
		}
	}
	if err := enqueue(ctx, admin, sc); err != nil {
		return r, err
	}
	before, err := benchkit.CommandStats(ctx, admin)
	if err != nil {
		return r, err
	}
	redisCPU0, err := benchkit.RedisCPU(ctx, admin)
	if err != nil {
		return r, err
	}
	env := []string{
		"REDIS_URL=" + redisURL(opts), "KEY_PREFIX=" + prefix,
		"WORKER_CONCURRENCY=" + strconv.Itoa(c.Concurrency),
		"WORKER_SIMULATE_WORK=" + c.ReplicaWork.String(),
		"LOG_LEVEL=warn", "LOG_FORMAT=console",
	}
	start := time.Now()
	var procs []*benchkit.Process
	defer func() {
		for _, p := range procs {
			p.Kill()
		}
	}()
	for i := range k {
		p, err := benchkit.Start(bin, args, env, filepath.Join(dir, fmt.Sprintf("%s-%d.log", sc.Name, i)))
		if err != nil {
			return r, err
		}
		procs = append(procs, p)
	}
	wctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, fmt.Errorf("not finished after %v", c.Timeout))
	samples, err := benchkit.WaitFinished(wctx, admin, singleQueues, int64(sc.Tasks), 5*time.Millisecond)
	cancel()
	if err != nil {
		return r, err
	}
	end := samples[len(samples)-1].At
	after, err := benchkit.CommandStats(ctx, admin)
	if err != nil {
		return r, err
	}
	redisCPU, err := benchkit.RedisCPU(ctx, admin)
	if err != nil {
		return r, err
	}
	var workerCPU time.Duration
	for _, p := range procs {
		cpu, err := p.CPU()
		if err != nil {
			return r, fmt.Errorf("worker pid %d: %w", p.Pid(), err)
		}
		workerCPU += cpu
		m, err := p.Memory()
		if err != nil {
			return r, fmt.Errorf("worker pid %d: %w", p.Pid(), err)
		}
		r.PeakRSSMaxKiB = max(r.PeakRSSMaxKiB, m.HWM)
		r.PeakRSSSumKiB += m.HWM
	}
	for _, p := range procs {
		if err := p.Stop(30 * time.Second); err != nil {
			return r, fmt.Errorf("worker pid %d: %w", p.Pid(), err)
		}
	}
	procs = nil
	n := float64(sc.Tasks)
	r.TasksPerS = n / end.Sub(start).Seconds()
	r.SteadyPerS = benchkit.Window(samples, int64(sc.Tasks), 0.1, 0.9)
	d := benchkit.Delta(before, after)
	delete(d, "info")
	delete(d, "zcard")
	r.CmdsPerTask = float64(benchkit.Sum(d)) / n
	r.WorkerCPUPerTask = float64(workerCPU) / float64(time.Microsecond) / n
	r.RedisCPUPerTask = float64(redisCPU-redisCPU0) / float64(time.Microsecond) / n
	_, r.Archived, _ = asynqredis.Finished(ctx, admin, singleQueues)
	return r, nil
}

// redisURL is the redis:// URL of opts, for the worker processes. opts
// names one node (see redisFor).
func redisURL(o *redisconn.Options) string {
	opts := o.Node
	u := url.URL{Scheme: "redis", Host: opts.Addr, Path: "/" + strconv.Itoa(opts.DB)}
	if opts.Password != "" {
		u.User = url.UserPassword(opts.Username, opts.Password)
	}
	return u.String()
}

func printReplicas(out io.Writer, c settings, rr []replicaResult) {
	fmt.Fprintf(out, "\nreplica scaling: %d tasks on distinct orders, %v simulated work, concurrency %d per process\n\n",
		c.ReplicaTasks, c.ReplicaWork, c.Concurrency)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "processes\tsystem\ttasks/s (10-90%)\ttasks/s (incl. start)\t(b)/(a)\tredis cmds/task\tworker CPU µs/task\tredis CPU µs/task\tpeak RSS/process MiB\tarchived\t")
	for _, r := range rr {
		ratio := "-"
		if r.RatioToA > 0 {
			ratio = f2(r.RatioToA)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%s\t%.1f\t%.0f\t%.0f\t%s\t%d\t\n",
			r.Replicas, r.System, r.SteadyPerS, r.TasksPerS, ratio, r.CmdsPerTask, r.WorkerCPUPerTask, r.RedisCPUPerTask, mib(r.PeakRSSMaxKiB), r.Archived)
	}
	_ = tw.Flush()
	fmt.Fprintln(out, "\n  processes: cmd/worker built once with go build (b), or this binary in -as-worker=plain mode (a).")
	fmt.Fprintln(out, "  worker CPU: all processes' user+system CPU (start-up included) / tasks; redis CPU: the server's, from INFO cpu.")
	fmt.Fprintln(out, "  peak RSS/process: the largest VmHWM of the processes, read before SIGTERM.")
}
