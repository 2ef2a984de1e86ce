package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// The cluster mode (-cluster, make bench-cluster) measures how the Redis
// work of orderworker spreads over the masters of a local Redis Cluster
// (redisproc: 3 masters with a replica each, slots split evenly), with
// each queue shard count of -cluster-shards in turn, in one run: system
// (b), the producer's tasks with their positions, one per order.
//
// Per master it reads INFO commandstats and INFO cpu before and after the
// measured phase (from starting the worker to the last task done), and
// reports commands and CPU per task and the master's share of the masters'
// CPU. The target: with 3 shards on 3 masters, no master carries more than
// clusterShareTarget of it. Absolute rates on a small shared machine, where
// six redis-servers and the worker share the cores, are not the figure.

// clusterShareTarget is the largest share of the masters' Redis CPU one
// master may carry with 3 shards on 3 masters.
const clusterShareTarget = 0.40

// clusterMaster is one master's figures in one cluster run.
type clusterMaster struct {
	Addr string `json:"addr"`
	// Orders is how many of the run's orders have their keys on it;
	// Queues are the run's queues whose keys are on it.
	Orders int      `json:"orders"`
	Queues []string `json:"queues"`
	// CmdsPerTask is its INFO commandstats calls over the measured phase
	// per task (commands run inside scripts included; the monitor's INFO
	// and ZCARD left out); Commands by command.
	CmdsPerTask float64                     `json:"redis_cmds_per_task"`
	Commands    map[string]benchkit.CmdStat `json:"redis_commands"`
	// CPUPerTask is its CPU time (INFO cpu, user + system) per task, in
	// µs; Share its part of the masters' CPU.
	CPUPerTask float64 `json:"redis_cpu_us_per_task"`
	Share      float64 `json:"share_of_masters_cpu"`
	// ReplicaCPUPerTask is its replica's CPU per task, in µs.
	ReplicaCPUPerTask float64 `json:"replica_cpu_us_per_task"`
}

// clusterResult is one run of the cluster mode: one shard count.
type clusterResult struct {
	Shards      int     `json:"shards"`
	Tasks       int     `json:"tasks"`
	WorkMs      float64 `json:"work_ms"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	TasksPerS   float64 `json:"tasks_per_s"`
	Archived    int64   `json:"archived"`
	// WorkerCPUPerTask is the bench process's CPU per task, in µs.
	WorkerCPUPerTask float64 `json:"worker_cpu_us_per_task"`
	// RoundTripsPerTask is what the worker's client sent (a pipeline is
	// one), per task; RoundTrips by call (see benchkit.CallName).
	RoundTripsPerTask float64          `json:"round_trips_per_task"`
	RoundTrips        map[string]int64 `json:"round_trips"`
	Masters           []clusterMaster  `json:"masters"`
	// MaxShare is the largest master's share of the masters' CPU.
	MaxShare float64 `json:"max_share"`
}

// runCluster starts a local cluster and measures each shard count of
// c.ClusterShards on it.
func runCluster(ctx context.Context, c settings, out io.Writer) ([]clusterResult, error) {
	var counts []int
	for _, s := range c.ClusterShards {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > tasks.MaxShards {
			return nil, fmt.Errorf("-cluster-shards: %q is not a shard count from 1 to %d", s, tasks.MaxShards)
		}
		counts = append(counts, n)
	}
	fmt.Fprintf(out, "starting a local Redis Cluster of %d masters with a replica each ...\n", redisproc.ClusterMasters)
	cl, err := redisproc.StartCluster()
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	opts, err := redisconn.Parse(cl.URL())
	if err != nil {
		return nil, err
	}
	var results []clusterResult
	for _, n := range counts {
		fmt.Fprintf(out, "running %d shard(s): %d tasks, each on an order of its own, %v of work, concurrency %d ...\n",
			n, c.ClusterTasks, c.ClusterWork, c.ClusterConcurrency)
		r, err := runClusterShards(ctx, cl, opts, c, n)
		if err != nil {
			return nil, fmt.Errorf("%d shards: %w", n, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// nodeStats are one node's counters at one moment.
type nodeStats struct {
	cmds map[string]benchkit.CmdStat
	cpu  time.Duration
}

// readNodes reads the counters of every node of addrs.
func readNodes(ctx context.Context, clients []*redis.Client) ([]nodeStats, error) {
	out := make([]nodeStats, len(clients))
	for i, c := range clients {
		cmds, err := benchkit.CommandStats(ctx, c)
		if err != nil {
			return nil, err
		}
		cpu, err := benchkit.RedisCPU(ctx, c)
		if err != nil {
			return nil, err
		}
		out[i] = nodeStats{cmds: cmds, cpu: cpu}
	}
	return out, nil
}

// replicaOf returns the address of a master's replica, from its INFO
// replication.
func replicaOf(ctx context.Context, master *redis.Client) (string, error) {
	info, err := master.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		var ip, port string
		for f := range strings.SplitSeq(strings.TrimSpace(strings.TrimPrefix(line, "slave0:")), ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		return ip + ":" + port, nil
	}
	return "", fmt.Errorf("master %s has no replica", master.Options().Addr)
}

// runClusterShards measures n shards on the cluster: it flushes every
// master, seeds one order per task, enqueues the tasks through the
// producer, then starts a worker and measures until every task is done.
func runClusterShards(ctx context.Context, cl *redisproc.Cluster, opts *redisconn.Options, c settings, n int) (clusterResult, error) {
	shards := tasks.Shards{Count: n}
	r := clusterResult{Shards: n, Tasks: c.ClusterTasks, WorkMs: ms(c.ClusterWork), Concurrency: c.ClusterConcurrency}
	var masters, replicas []*redis.Client
	for _, addr := range cl.Masters() {
		m := redis.NewClient(&redis.Options{Addr: addr})
		defer m.Close()
		if err := m.FlushAll(ctx).Err(); err != nil {
			return r, err
		}
		raddr, err := replicaOf(ctx, m)
		if err != nil {
			return r, err
		}
		rc := redis.NewClient(&redis.Options{Addr: raddr})
		defer rc.Close()
		masters, replicas = append(masters, m), append(replicas, rc)
	}

	admin := opts.NewClient()
	defer admin.Close()
	store, err := redisstore.New(admin, redisstore.Config{Prefix: prefix})
	if err != nil {
		return r, err
	}
	sc := scenario{Name: fmt.Sprintf("cluster-shards%d", n), System: sysOW, Tasks: c.ClusterTasks, Orders: c.ClusterTasks}
	if err := seedOrders(ctx, store, sc); err != nil {
		return r, err
	}
	if err := enqueueWith(ctx, admin, sc, shards); err != nil {
		return r, err
	}
	queues := benchkit.Queues(shards)
	for _, addr := range cl.Masters() {
		m := clusterMaster{Addr: addr}
		for _, q := range queues {
			if cl.MasterOf(asynqredis.QueueKey(q)) == addr {
				m.Queues = append(m.Queues, q)
			}
		}
		for i := range sc.Orders {
			if cl.MasterOf("{"+orderNo(sc, i)+"}") == addr {
				m.Orders++
			}
		}
		r.Masters = append(r.Masters, m)
	}

	// The measured phase. The monitor polls the finished counts every
	// 20 ms, a ZCARD pipeline per master; its commands are left out of the
	// counts (its CPU is not: a few µs per poll).
	monitor := opts.NewClient()
	defer monitor.Close()
	before, err := readNodes(ctx, masters)
	if err != nil {
		return r, err
	}
	beforeReplicas, err := readNodes(ctx, replicas)
	if err != nil {
		return r, err
	}
	selfCPU0 := benchkit.SelfCPU()
	rdb := opts.NewClient()
	defer rdb.Close()
	hook := benchkit.NewCountHook()
	rdb.AddHook(hook)
	wstore, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	if err != nil {
		return r, err
	}
	w, err := worker.New(rdb, wstore, worker.Config{
		Kinds:       storehook.Kinds(nil, storehook.Delay(c.ClusterWork)),
		KeyPrefix:   prefix,
		Concurrency: c.ClusterConcurrency,
		Shards:      shards,
		ID:          sc.Name,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := w.Start(); err != nil {
		return r, err
	}
	wctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, fmt.Errorf("not finished after %v", c.Timeout))
	samples, err := benchkit.WaitFinished(wctx, monitor, queues, int64(sc.Tasks), 20*time.Millisecond)
	cancel()
	if err != nil {
		w.Shutdown()
		return r, err
	}
	end := samples[len(samples)-1].At
	r.RoundTrips = hook.ByName()
	r.RoundTripsPerTask = float64(hook.RoundTrips()) / float64(sc.Tasks)
	after, err := readNodes(ctx, masters)
	if err != nil {
		w.Shutdown()
		return r, err
	}
	afterReplicas, err := readNodes(ctx, replicas)
	selfCPU := benchkit.SelfCPU() - selfCPU0
	w.Shutdown()
	if err != nil {
		return r, err
	}

	tasksN := float64(sc.Tasks)
	r.Seconds = end.Sub(start).Seconds()
	r.TasksPerS = tasksN / r.Seconds
	r.WorkerCPUPerTask = float64(selfCPU) / float64(time.Microsecond) / tasksN
	_, r.Archived, _ = asynqredis.Finished(ctx, admin, queues)
	var total time.Duration
	for i := range r.Masters {
		total += after[i].cpu - before[i].cpu
	}
	for i := range r.Masters {
		m := &r.Masters[i]
		m.Commands = benchkit.Delta(before[i].cmds, after[i].cmds)
		for name := range m.Commands {
			if name == "info" || name == "zcard" || strings.HasPrefix(name, "cluster") {
				delete(m.Commands, name) // the monitor's and the clients' topology reads
			}
		}
		m.CmdsPerTask = float64(benchkit.Sum(m.Commands)) / tasksN
		cpu := after[i].cpu - before[i].cpu
		m.CPUPerTask = float64(cpu) / float64(time.Microsecond) / tasksN
		m.ReplicaCPUPerTask = float64(afterReplicas[i].cpu-beforeReplicas[i].cpu) / float64(time.Microsecond) / tasksN
		if total > 0 {
			m.Share = float64(cpu) / float64(total)
		}
		r.MaxShare = max(r.MaxShare, m.Share)
	}
	return r, nil
}

// clusterTarget is the target of the cluster mode, from the run with 3
// shards; ok is false when the run had no such count.
func clusterTarget(results []clusterResult) (target, bool) {
	for _, r := range results {
		if r.Shards == redisproc.ClusterMasters {
			return target{
				Name: fmt.Sprintf("largest master's share of the masters' Redis CPU, %d shards on %d masters", r.Shards, redisproc.ClusterMasters),
				Got:  r.MaxShare, Want: fmt.Sprintf("≤ %.0f %%", 100*clusterShareTarget), Met: r.MaxShare <= clusterShareTarget,
			}, true
		}
	}
	return target{}, false
}

// printCluster writes the cluster mode's table, the shares side by side,
// and its target.
func printCluster(out io.Writer, results []clusterResult) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintf(out, "\nCluster: %d masters with a replica each (slots split evenly), orderworker (b), %d tasks each on an order of its own, %.0f ms of work, concurrency %d\n\n",
		redisproc.ClusterMasters, results[0].Tasks, results[0].WorkMs, results[0].Concurrency)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shards\tmaster\torders\tqueues on it\tRedis cmds/task\tRedis CPU µs/task\tshare of masters' CPU\treplica CPU µs/task\t")
	for _, r := range results {
		for i, m := range r.Masters {
			fmt.Fprintf(tw, "%d\tm%d %s\t%d\t%s\t%.1f\t%.1f\t%.0f %%\t%.1f\t\n", r.Shards, i+1, m.Addr, m.Orders,
				cmp.Or(strings.Join(m.Queues, " "), "–"), m.CmdsPerTask, m.CPUPerTask, 100*m.Share, m.ReplicaCPUPerTask)
		}
	}
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shards\ttasks/s\tmasters' Redis cmds/task\tmasters' Redis CPU µs/task\tlargest master's share\tworker round trips/task\tworker CPU µs/task\tarchived\t")
	for _, r := range results {
		var cpu, cmds float64
		for _, m := range r.Masters {
			cpu += m.CPUPerTask
			cmds += m.CmdsPerTask
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.1f\t%.0f %%\t%.2f\t%.0f\t%d\t\n", r.Shards, r.TasksPerS, cmds, cpu, 100*r.MaxShare, r.RoundTripsPerTask, r.WorkerCPUPerTask, r.Archived)
	}
	tw.Flush()
	if t, ok := clusterTarget(results); ok {
		verdict := "not met"
		if t.Met {
			verdict = "met"
		}
		fmt.Fprintf(out, "\ntarget: %s %s: got %.0f %%, %s\n", t.Name, t.Want, 100*t.Got, verdict)
	}
	// The shares side by side, for the ratios of one run.
	slices.SortFunc(results, func(a, b clusterResult) int { return cmp.Compare(a.Shards, b.Shards) })
	var parts []string
	for _, r := range results {
		parts = append(parts, fmt.Sprintf("%d shard(s) %.0f %%", r.Shards, 100*r.MaxShare))
	}
	fmt.Fprintf(out, "largest master's share, side by side: %s\n", strings.Join(parts, ", "))
}
