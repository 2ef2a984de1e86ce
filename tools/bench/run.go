package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
)

// settings are the bench's flags. They are flags only: a measuring tool
// reads no environment, except in -as-worker mode (see asworker.go).
type settings struct {
	RedisURL     string
	Tasks        int
	Hot          int
	HotTasks     int
	SeedHotTasks int
	Concurrency  int
	Work         time.Duration
	Workloads    []string
	Systems      []string
	// TracedWorkloads are the workloads (by name) of (bt), or "all".
	TracedWorkloads []string
	Contention      []string
	Only            []string
	Accept          bool
	AcceptTasks     int
	AcceptRounds    int
	AcceptCallers   int
	JSON            string
	CPUProfile      string
	Replicas        []string
	ReplicaTasks    int
	ReplicaWork     time.Duration
	ReplicaPlain    bool
	Timeout         time.Duration
	Verbose         bool
	AsWorker        string
	ReplicasAlone   bool

	Cluster            bool
	ClusterShards      []string
	ClusterTasks       int
	ClusterWork        time.Duration
	ClusterConcurrency int

	Flood            bool
	FloodTasks       int
	FloodWork        time.Duration
	FloodQuiet       int
	FloodConcurrency int
	FloodReplicas    int
}

// declare declares the flags into c. It returns whether -work or
// -concurrency was given, to call after Parse.
func declare(s *config.Set, c *settings) (workGiven func() bool) {
	s.String(&c.RedisURL, "redis-url", "", "", "Redis to measure on, database included; it must be empty and is flushed between scenarios. Default: spawn a dedicated redis-server")
	s.Int(&c.Tasks, "tasks", "", 10000, "tasks of the uncontended scenarios, each on an order of its own").Check(config.Positive[int])
	s.Int(&c.Hot, "hot", "", 10, "hot orders of the contended scenarios and of the contended acceptance runs").Check(config.Positive[int])
	s.Int(&c.HotTasks, "hot-tasks", "", 10000, "tasks of the contended scenarios (a), (b0) and (b), spread round-robin over the hot orders").Check(config.Positive[int])
	s.Int(&c.SeedHotTasks, "seed-hot-tasks", "", 3000, "tasks of the contended scenarios of (c), fewer to bound the run: its waiters sleep 0-1000 ms between checks").Check(config.Positive[int])
	s.StringList(&c.Workloads, "workloads", "", defaultWorkloads, "the workloads of the rows, each <work>:<concurrency>: simulated handler work per task (inside the lock for (b0), (b) and (c); (a) sleeps it too) and tasks one worker runs at once")
	conc := s.Int(&c.Concurrency, "concurrency", "", 20, "tasks one worker runs at once in the workload -work:-concurrency, which replaces -workloads when either flag is given; also the concurrency of each -replicas process").Check(config.Positive[int])
	work := s.Duration(&c.Work, "work", "", 10*time.Millisecond, "simulated handler work per task in the workload -work:-concurrency, which replaces -workloads when either flag is given").Check(config.NonNegative[time.Duration])
	s.StringList(&c.Systems, "systems", "", allSystems, "the systems to measure: a (plain asynq), b0 (orderworker, ordering off), b (orderworker), bt (orderworker traced at full sampling, exported over OTLP HTTP to a receiver in the bench), c (seed-style lock)").Check(subsetOf(allSystems...))
	s.StringList(&c.TracedWorkloads, "bt-workloads", "", []string{"work0"}, "the workloads on which (bt) runs, by name (work0, work10ms, ...; all for every one): by default the zero-work rows, where the worker's own CPU is the limit and tracing's cost shows")
	s.StringList(&c.Contention, "contention", "", []string{uncontended, contended}, "the contentions to measure: uncontended (an order per task), contended (-hot orders); the acceptance runs follow it too").Check(subsetOf(uncontended, contended))
	s.StringList(&c.Only, "only", "", nil, "run only these scenarios, e.g. b-contended-work0,b0-contended-work0 (names as in the table; within -systems, -contention and -workloads)")
	s.Bool(&c.Accept, "accept", "", true, "measure the acceptance cost: the producer's enqueue rate against raw asynq's")
	s.Int(&c.AcceptTasks, "accept-tasks", "", 5000, "changes of each acceptance run").Check(config.Positive[int])
	s.Int(&c.AcceptRounds, "accept-rounds", "", 3, "acceptance runs of each system on each contention, alternating raw asynq and the producer").Check(config.Positive[int])
	s.Int(&c.AcceptCallers, "accept-goroutines", "", 8, "goroutines that enqueue at once in the acceptance runs").Check(config.Positive[int])
	s.String(&c.JSON, "json", "", "", "also write the results as JSON to this file")
	s.String(&c.CPUProfile, "cpuprofile", "", "", "write a CPU profile of each in-process scenario's measured phase to this path plus \".<scenario>\", and of the first round of each acceptance run plus \".accept-<raw|producer>-<contention>\"")
	s.StringList(&c.Replicas, "replicas", "", nil, "also measure throughput with this many worker processes each, e.g. 1,2,4 (built from cmd/worker)")
	s.Bool(&c.ReplicasAlone, "replicas-only", "", false, "with -replicas: skip the in-process scenarios")
	s.Int(&c.ReplicaTasks, "replica-tasks", "", 20000, "tasks of each replica run, each on an order of its own").Check(config.Positive[int])
	s.Duration(&c.ReplicaWork, "replica-work", "", 10*time.Millisecond, "simulated work per task in the replica runs (WORKER_SIMULATE_WORK)").Check(config.NonNegative[time.Duration])
	s.Bool(&c.ReplicaPlain, "replica-plain", "", true, "with -replicas: also run plain asynq processes, for the ratio")
	s.Duration(&c.Timeout, "timeout", "", 3*time.Minute, "give up on a scenario that has not finished after this long").Check(config.Positive[time.Duration])
	s.Bool(&c.Verbose, "v", "", false, "print each scenario's commands per task by command, and its round trips by command")
	s.Bool(&c.Cluster, "cluster", "", false, "measure on a local Redis Cluster of 3 masters with a replica each instead (make bench-cluster): commands and Redis CPU per task on each master, with each count of -cluster-shards")
	s.StringList(&c.ClusterShards, "cluster-shards", "", []string{"1", "3"}, "with -cluster: the queue shard counts to measure, one run each")
	s.Int(&c.ClusterTasks, "cluster-tasks", "", 20000, "with -cluster: tasks of each run, each on an order of its own").Check(config.Positive[int])
	s.Duration(&c.ClusterWork, "cluster-work", "", 0, "with -cluster: simulated work per task, inside the lock").Check(config.NonNegative[time.Duration])
	s.Int(&c.ClusterConcurrency, "cluster-concurrency", "", 50, "with -cluster: tasks the worker runs at once").Check(config.Positive[int])
	s.Bool(&c.Flood, "flood", "", true, "run the flood: (b) drains one order's -flood-tasks changes while -flood-quiet other orders' changes come in, against the serial limit, the same changes through plain asynq at concurrency 1 making the same store write, and a baseline of the quiet orders alone")
	s.Int(&c.FloodTasks, "flood-tasks", "", 2000, "changes of the flood's one order").Check(config.Positive[int])
	s.Duration(&c.FloodWork, "flood-work", "", 5*time.Millisecond, "simulated work per change in the flood (inside the lock)").Check(config.Positive[time.Duration])
	s.Int(&c.FloodQuiet, "flood-quiet", "", 100, "quiet orders of the flood, one change each").Check(config.Positive[int])
	s.Int(&c.FloodConcurrency, "flood-concurrency", "", 20, "tasks the flood's workers run at once, in all (shared among -flood-replicas processes)").Check(config.Positive[int])
	s.Int(&c.FloodReplicas, "flood-replicas", "", 2, "also run the flood with this many cmd/worker processes; 0 skips it").Check(config.NonNegative[int])
	s.String(&c.AsWorker, "as-worker", "", "", "internal: run as a plain asynq worker process for -replicas (reads REDIS_URL, WORKER_CONCURRENCY, WORKER_SIMULATE_WORK)").Check(config.OneOf("", "plain"))
	return func() bool { return work.Source() == config.FromFlag || conc.Source() == config.FromFlag }
}

// subsetOf checks that every item of a list is one of allowed.
func subsetOf(allowed ...string) func([]string) error {
	return func(list []string) error {
		for _, v := range list {
			if !slices.Contains(allowed, v) {
				return fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
			}
		}
		return nil
	}
}

// checkOnly refuses an -only name that is no scenario of the run, which
// would otherwise measure nothing without a word.
func checkOnly(c settings, workloads []workload) error {
	all := c
	all.Only, all.TracedWorkloads = nil, []string{allWorkloads}
	var names []string
	for _, sc := range scenarios(all, workloads) {
		names = append(names, sc.Name)
	}
	for _, n := range c.Only {
		if !slices.Contains(names, n) {
			return fmt.Errorf("-only: %q is no scenario of this run (%s)", n, strings.Join(names, ", "))
		}
	}
	return nil
}

// workloadsOf returns the workloads to measure: -work:-concurrency when
// either was given, else -workloads.
func workloadsOf(c settings, workGiven bool) ([]workload, error) {
	if workGiven {
		return []workload{{Work: c.Work, Concurrency: c.Concurrency}}, nil
	}
	return parseWorkloads(c.Workloads)
}

// run is the bench: it parses the flags, gets a Redis, runs the scenarios
// and prints the table (and the JSON).
func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	var c settings
	s := config.NewSet("bench", nil)
	workGiven := declare(s, &c)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil
		}
		return err
	}
	if c.AsWorker != "" {
		return runPlainWorker(ctx, getenv)
	}
	if c.Cluster {
		return runClusterMode(ctx, c, out)
	}
	replicas, err := parseReplicas(c.Replicas)
	if err != nil {
		return err
	}
	workloads, err := workloadsOf(c, workGiven())
	if err != nil {
		return err
	}
	if err := checkOnly(c, workloads); err != nil {
		return err
	}

	opts, stopRedis, err := redisFor(ctx, c.RedisURL, out)
	if err != nil {
		return err
	}
	defer stopRedis()

	rep := report{
		Started:   time.Now().UTC(),
		GoVersion: runtime.Version(),
		CPUs:      runtime.NumCPU(),
		Workloads: workloads,
	}
	rep.LoadAvg[0] = loadAvg()
	admin := opts.NewClient()
	defer admin.Close()
	if v, err := admin.InfoMap(ctx, "server").Result(); err == nil {
		rep.RedisVersion = v["Server"]["redis_version"]
	}
	if !c.ReplicasAlone || len(replicas) == 0 {
		for _, sc := range scenarios(c, workloads) {
			fmt.Fprintf(out, "running %s: %d tasks over %d orders, %s ...\n", sc.Name, sc.Tasks, sc.Orders, sc.Workload)
			r, err := runScenario(ctx, opts, c, sc)
			if err != nil {
				return fmt.Errorf("%s: %w", sc.Name, err)
			}
			rep.Results = append(rep.Results, r)
		}
		if c.Accept {
			ar, err := measureAccept(ctx, opts, c, out)
			if err != nil {
				return fmt.Errorf("acceptance: %w", err)
			}
			rep.Accept = ar
		}
		if c.Flood {
			fp, fr, err := measureFlood(ctx, opts, c, out)
			if err != nil {
				return fmt.Errorf("flood: %w", err)
			}
			rep.Flood, rep.FloodPlain = fr, &fp
		}
		rep.LoadAvg[1] = loadAvg()
		rep.ratios()
		rep.print(out, c)
	}
	if !c.ReplicasAlone || len(replicas) == 0 {
		fmt.Fprintln(out, "\nrunning the token waiters ...")
		tr, err := measureTokens(ctx, opts)
		if err != nil {
			return fmt.Errorf("tokens: %w", err)
		}
		rep.Tokens = tr
		printTokens(out, tr)
	}
	if len(replicas) > 0 {
		rr, err := runReplicas(ctx, opts, c, replicas, out)
		if err != nil {
			return fmt.Errorf("replicas: %w", err)
		}
		rep.Replicas = rr
		printReplicas(out, c, rr)
	}
	return writeJSON(c.JSON, rep, out)
}

// runClusterMode is the run of -cluster: the cluster measurement alone,
// its table, its target and the JSON.
func runClusterMode(ctx context.Context, c settings, out io.Writer) error {
	rep := report{Started: time.Now().UTC(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU()}
	rep.LoadAvg[0] = loadAvg()
	rr, err := runCluster(ctx, c, out)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	rep.LoadAvg[1] = loadAvg()
	rep.Cluster = rr
	if t, ok := clusterTarget(rr); ok {
		rep.Targets = append(rep.Targets, t)
	}
	fmt.Fprintf(out, "\nload average: %s at the start, %s at the end; %d CPUs, %s\n", rep.LoadAvg[0], rep.LoadAvg[1], rep.CPUs, rep.GoVersion)
	printCluster(out, rr)
	return writeJSON(c.JSON, rep, out)
}

// writeJSON writes rep to path as JSON, when path is set.
func writeJSON(path string, rep report, out io.Writer) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwrote %s\n", path)
	return nil
}

func parseReplicas(list []string) ([]int, error) {
	var out []int
	for _, s := range list {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-replicas: %q is not a positive number", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// redisFor returns the options of the Redis to measure on: the given URL's
// (one node, whose database must be empty), or a redis-server spawned for
// the run.
func redisFor(ctx context.Context, url string, out io.Writer) (*redisconn.Options, func(), error) {
	if url != "" {
		opts, err := redisconn.Parse(url)
		if err != nil {
			return nil, nil, fmt.Errorf("-redis-url: %w", err)
		}
		if opts.Topology != redisconn.Single {
			return nil, nil, fmt.Errorf("-redis-url: the bench measures one Redis node, not a %s", opts.Topology)
		}
		c := opts.NewClient()
		defer c.Close()
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return nil, nil, fmt.Errorf("-redis-url: %w", err)
		}
		if n != 0 {
			return nil, nil, fmt.Errorf("-redis-url: database %d holds %d keys; the bench flushes it between scenarios, so give it an empty one", opts.Node.DB, n)
		}
		fmt.Fprintf(out, "redis: %s (given); note that commands per task count every client of that server\n", opts.Node.Addr)
		return opts, func() {}, nil
	}
	p, err := redisproc.Start()
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(out, "redis: dedicated redis-server on %s (persistence off)\n", p.Addr())
	opts, err := redisconn.Parse(p.URL())
	if err != nil {
		p.Stop()
		return nil, nil, err
	}
	return opts, p.Stop, nil
}
