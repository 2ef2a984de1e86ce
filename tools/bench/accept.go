package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
)

// The systems of the acceptance runs.
const (
	acceptRaw      = "raw asynq Client.Enqueue"
	acceptProducer = "producer.EnqueueModify"
)

// acceptResult is what accepting changes cost one system on one contention,
// summed over its rounds: the rate at which AcceptCallers goroutines got
// their changes accepted, and the round trips, commands and CPU per change.
type acceptResult struct {
	System     string  `json:"system"`
	Contention string  `json:"contention"`
	Orders     int     `json:"orders"`
	Goroutines int     `json:"goroutines"`
	Changes    int     `json:"changes"`
	Seconds    float64 `json:"seconds"`
	PerS       float64 `json:"changes_per_s"`
	// RatioToRaw is the producer's rate over raw asynq's on the same
	// contention.
	RatioToRaw float64 `json:"ratio_to_raw,omitempty"`
	// RoundTripsPerChange is what the enqueuing client sent (a pipeline is
	// one) per change.
	RoundTripsPerChange float64          `json:"round_trips_per_change"`
	RoundTrips          map[string]int64 `json:"round_trips"`
	CmdsPerChange       float64          `json:"redis_cmds_per_change"`
	// ClientCPUPerChange is the bench process's CPU (the callers run in
	// it) per change, in µs; RedisCPUPerChange the server's.
	ClientCPUPerChange float64 `json:"client_cpu_us_per_change"`
	RedisCPUPerChange  float64 `json:"redis_cpu_us_per_change"`
	// P50Ms and P99Ms are the latency of one call.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

func (rep *report) findAccept(system, contention string) *acceptResult {
	for i := range rep.Accept {
		if a := &rep.Accept[i]; a.System == system && a.Contention == contention {
			return a
		}
	}
	return nil
}

// acceptRun is one run's raw measurements.
type acceptRun struct {
	took      time.Duration
	rt        int64
	rtBy      map[string]int64
	cmds      int64
	clientCPU time.Duration
	redisCPU  time.Duration
	lat       []time.Duration
}

// measureAccept measures the producer's enqueue rate against raw asynq's,
// side by side: for each contention, -accept-rounds rounds of one run of
// each (which goes first alternates), each run on a flushed database.
func measureAccept(ctx context.Context, opts *redisconn.Options, c settings, out io.Writer) ([]acceptResult, error) {
	var results []acceptResult
	for _, kind := range []string{uncontended, contended} {
		if !slices.Contains(c.Contention, kind) {
			continue
		}
		orders := c.AcceptTasks
		if kind == contended {
			orders = c.Hot
		}
		fmt.Fprintf(out, "running acceptance, %s: %d rounds of %d changes over %d orders, %d goroutines, raw asynq and the producer ...\n",
			kind, c.AcceptRounds, c.AcceptTasks, orders, c.AcceptCallers)
		runs := map[string][]acceptRun{}
		for round := range c.AcceptRounds {
			order := []string{acceptRaw, acceptProducer}
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, sys := range order {
				r, err := runAccept(ctx, opts, c, sys, kind, orders, round)
				if err != nil {
					return nil, fmt.Errorf("%s %s round %d: %w", sys, kind, round, err)
				}
				runs[sys] = append(runs[sys], r)
			}
		}
		raw := summarizeAccept(acceptRaw, kind, orders, c.AcceptCallers, runs[acceptRaw])
		prod := summarizeAccept(acceptProducer, kind, orders, c.AcceptCallers, runs[acceptProducer])
		if raw.PerS > 0 {
			prod.RatioToRaw = prod.PerS / raw.PerS
		}
		results = append(results, raw, prod)
	}
	return results, nil
}

func summarizeAccept(sys, kind string, orders, callers int, runs []acceptRun) acceptResult {
	a := acceptResult{System: sys, Contention: kind, Orders: orders, Goroutines: callers, RoundTrips: map[string]int64{}}
	var took, clientCPU, redisCPU time.Duration
	var rt, cmds int64
	var lat []time.Duration
	for _, r := range runs {
		a.Changes += len(r.lat)
		took += r.took
		rt += r.rt
		cmds += r.cmds
		clientCPU += r.clientCPU
		redisCPU += r.redisCPU
		lat = append(lat, r.lat...)
		for k, v := range r.rtBy {
			a.RoundTrips[k] += v
		}
	}
	n := float64(a.Changes)
	a.Seconds = took.Seconds()
	a.PerS = n / a.Seconds
	a.RoundTripsPerChange = float64(rt) / n
	a.CmdsPerChange = float64(cmds) / n
	a.ClientCPUPerChange = float64(clientCPU) / float64(time.Microsecond) / n
	a.RedisCPUPerChange = float64(redisCPU) / float64(time.Microsecond) / n
	slices.Sort(lat)
	a.P50Ms, a.P99Ms = ms(benchkit.Quantile(lat, 0.5)), ms(benchkit.Quantile(lat, 0.99))
	return a
}

// runAccept enqueues -accept-tasks modifies with -accept-goroutines
// goroutines through one system on a flushed database: to an order each
// (uncontended) or round-robin over the hot orders, after a warm-up that
// loads the scripts and publishes the queue.
func runAccept(ctx context.Context, opts *redisconn.Options, c settings, sys, kind string, orders, round int) (acceptRun, error) {
	var r acceptRun
	admin := opts.NewClient()
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		return r, err
	}
	rdb := opts.NewClient()
	defer rdb.Close()
	hook := benchkit.NewCountHook()
	rdb.AddHook(hook)
	p, err := producer.New(rdb, producer.Config{})
	if err != nil {
		return r, err
	}
	defer p.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	enqueue := func(ctx context.Context, m tasks.ModifyPayload) error {
		if sys == acceptProducer {
			_, err := p.Enqueue(ctx, m)
			return err
		}
		t, topts, err := rawTask(m)
		if err != nil {
			return err
		}
		_, err = client.EnqueueContext(ctx, t, topts...)
		return err
	}
	change := func(ev, orderNo string, i int) tasks.ModifyPayload {
		addr := "address " + strconv.Itoa(i)
		return tasks.ModifyPayload{EventID: ev, OrderNo: orderNo, Changes: tasks.Changes{Address: &addr}}
	}
	if err := benchkit.ForEach(ctx, 4*c.AcceptCallers, c.AcceptCallers, func(ctx context.Context, i int) error {
		return enqueue(ctx, change("warm-"+strconv.Itoa(i), "W"+strconv.Itoa(i), i))
	}); err != nil {
		return r, fmt.Errorf("warm-up: %w", err)
	}

	rt0, rtBy0 := hook.RoundTrips(), hook.ByName()
	before, err := benchkit.CommandStats(ctx, admin)
	if err != nil {
		return r, err
	}
	redisCPU0, err := benchkit.RedisCPU(ctx, admin)
	if err != nil {
		return r, err
	}
	path := c.CPUProfile
	if round > 0 {
		path = "" // profile the first round only
	}
	stopProfile, err := startProfile(path, "accept-"+map[string]string{acceptRaw: "raw", acceptProducer: "producer"}[sys]+"-"+kind)
	if err != nil {
		return r, err
	}
	defer stopProfile()
	r.lat = make([]time.Duration, c.AcceptTasks)
	cpu0 := benchkit.SelfCPU()
	start := time.Now()
	err = benchkit.ForEach(ctx, c.AcceptTasks, c.AcceptCallers, func(ctx context.Context, i int) error {
		no := fmt.Sprintf("U%07d", i)
		if kind == contended {
			no = "H" + strconv.Itoa(i%orders)
		}
		t0 := time.Now()
		err := enqueue(ctx, change(fmt.Sprintf("acc%d-%d", round, i), no, i))
		r.lat[i] = time.Since(t0)
		return err
	})
	r.took = time.Since(start)
	r.clientCPU = benchkit.SelfCPU() - cpu0
	stopProfile()
	if err != nil {
		return r, err
	}
	r.rt = hook.RoundTrips() - rt0
	r.rtBy = hook.ByName()
	for k, v := range rtBy0 {
		r.rtBy[k] -= v
	}
	after, err := benchkit.CommandStats(ctx, admin)
	if err != nil {
		return r, err
	}
	d := benchkit.Delta(before, after)
	delete(d, "info")
	r.cmds = benchkit.Sum(d)
	redisCPU, err := benchkit.RedisCPU(ctx, admin)
	if err != nil {
		return r, err
	}
	r.redisCPU = redisCPU - redisCPU0
	return r, nil
}

func printAccept(out io.Writer, rs []acceptResult) {
	fmt.Fprintf(out, "\nacceptance: modifies enqueued by %d goroutines at once, rounds alternating, each on a flushed database\n\n", rs[0].Goroutines)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contention\torders\tsystem\tchanges\tchanges/s\tvs raw\tround trips/change\tredis cmds/change\tclient CPU µs/change\tredis CPU µs/change\tcall p50 ms\tp99 ms\t")
	for _, a := range rs {
		ratio := "-"
		if a.RatioToRaw > 0 {
			ratio = f2(a.RatioToRaw)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.0f\t%s\t%.2f\t%.1f\t%.0f\t%.0f\t%s\t%s\t\n",
			a.Contention, a.Orders, a.System, a.Changes, a.PerS, ratio, a.RoundTripsPerChange, a.CmdsPerChange,
			a.ClientCPUPerChange, a.RedisCPUPerChange, f2(a.P50Ms), f2(a.P99Ms))
	}
	_ = tw.Flush()
	fmt.Fprint(out, `
  raw asynq: tasks.NewTask of the payload without a position, Client.EnqueueContext with task ID = event ID
         and the producer's queue, retry, timeout and retention (what (b0)'s tasks are); the producer:
         Enqueue's one script on one Redis: the event claim, the position and the same task.
  changes/s: changes over the runs' wall time; round trips: the enqueuing client's (a pipeline is one);
         client CPU: the bench process's, where the goroutines run; redis CPU: the server's.
`)
}
