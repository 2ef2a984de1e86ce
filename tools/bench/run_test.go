package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/tasks"
	"github.com/stretchr/testify/require"
)

// The bench itself is run by `make bench`; these tests only check its
// bookkeeping and stay well under a second.

func TestScenarios(t *testing.T) {
	c := settings{Tasks: 100, Hot: 10, HotTasks: 50, SeedHotTasks: 20, Systems: allSystems, Contention: []string{uncontended, contended},
		TracedWorkloads: []string{"work0"}}
	ws, err := parseWorkloads(defaultWorkloads)
	require.NoError(t, err)
	require.Equal(t, []workload{standard, {Work: 0, Concurrency: 100}}, ws)
	var names []string
	for _, sc := range scenarios(c, ws) {
		names = append(names, sc.Name)
		if sc.Name == "c-contended-work0" {
			require.Equal(t, 20, sc.Tasks)
			require.NotEmpty(t, sc.Note)
			require.Equal(t, 100, sc.Workload.Concurrency)
		}
	}
	require.Equal(t, []string{
		"a-uncontended-work10ms", "aw-uncontended-work10ms", "b0-uncontended-work10ms", "b-uncontended-work10ms", "c-uncontended-work10ms",
		"a-contended-work10ms", "aw-contended-work10ms", "b0-contended-work10ms", "b-contended-work10ms", "c-contended-work10ms",
		"a-uncontended-work0", "aw-uncontended-work0", "b0-uncontended-work0", "b-uncontended-work0", "bt-uncontended-work0", "c-uncontended-work0",
		"a-contended-work0", "aw-contended-work0", "b0-contended-work0", "b-contended-work0", "bt-contended-work0", "c-contended-work0",
	}, names, "(bt) on -bt-workloads only")
	c.Only = []string{"bt-uncontended-work10ms"}
	require.NoError(t, checkOnly(c, ws), "-only may name (bt) on any workload")
	require.Len(t, scenarios(c, ws), 1)
	c.Only, c.TracedWorkloads = nil, []string{allWorkloads}
	require.Len(t, scenarios(c, ws), 24)

	c.Systems, c.Contention, c.Only = []string{sysUnordered, sysOW}, []string{contended}, []string{"b-contended-work0", "b-uncontended-work0"}
	names = nil
	for _, sc := range scenarios(c, ws) {
		names = append(names, sc.Name)
	}
	require.Equal(t, []string{"b-contended-work0"}, names)
	require.Error(t, checkOnly(c, ws), "b-uncontended-work0 is outside -contention")
	c.Only = []string{"b-contended-work0"}
	require.NoError(t, checkOnly(c, ws))

	require.Equal(t, "H3", orderNo(scenario{Contended: true, Orders: 10}, 13))
	require.Equal(t, "U000013", orderNo(scenario{Orders: 100}, 13))
	i, ok := eventIndex(eventID(scenario{Name: "b0-contended-work0"}, 42))
	require.True(t, ok)
	require.Equal(t, int64(42), i)
}

func TestParseWorkloadsRefuses(t *testing.T) {
	tests := []struct{ name, in string }{
		{"no concurrency", "10ms"},
		{"zero concurrency", "10ms:0"},
		{"negative work", "-1ms:20"},
		{"not a duration", "ten:20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWorkloads([]string{tt.in})
			require.Error(t, err)
		})
	}
	_, err := parseWorkloads([]string{"10ms:20", "10ms:100"})
	require.Error(t, err, "two workloads of one work time would share their scenario names")
}

func TestRatiosAndTargets(t *testing.T) {
	zero := workload{Work: 0, Concurrency: 100}
	rep := report{Workloads: []workload{standard, zero}, Results: []result{
		{Scenario: "a-uncontended-work10ms", TasksPerS: 1000},
		{Scenario: "b0-uncontended-work10ms", Tasks: 10000, TasksPerS: 950, RoundTripsPerTask: 4.70},
		{Scenario: "b-uncontended-work10ms", Tasks: 10000, TasksPerS: 900, RoundTripsPerTask: 4.71},
		{Scenario: "a-contended-work10ms", Contended: true, TasksPerS: 1000},
		{Scenario: "b0-contended-work10ms", Contended: true, Tasks: 10000, TasksPerS: 400, RoundTripsPerTask: 6},
		{Scenario: "aw-contended-work10ms", Contended: true, Tasks: 10000, TasksPerS: 800, RoundTripsPerTask: 3},
		{Scenario: "b-contended-work10ms", Contended: true, Tasks: 10000, Orders: 10, TasksPerS: 500, Handoffs: 900, HandoffsAll: 990, HandoffP99: 2, RoundTripsPerTask: 5, OrderPairs: 90},
		{Scenario: "c-contended-work10ms", Contended: true, TasksPerS: 50, Handoffs: 10, HandoffP99: 800},
		{Scenario: "a-uncontended-work0", TasksPerS: 1000, WorkerCPUPerTask: 100, RedisCPUPerTask: 100},
		{Scenario: "b-uncontended-work0", Tasks: 10000, TasksPerS: 750, WorkerCPUPerTask: 130, RedisCPUPerTask: 160},
		{Scenario: "a-contended-work0", Contended: true, TasksPerS: 1000},
		{Scenario: "b0-contended-work0", Contended: true, Tasks: 10000, TasksPerS: 1000, RoundTripsPerTask: 6},
		{Scenario: "aw-uncontended-work0", Tasks: 10000, TasksPerS: 900, RedisCPUPerTask: 120},
		{Scenario: "aw-contended-work0", Contended: true, Tasks: 10000, TasksPerS: 900, RedisCPUPerTask: 50},
		{Scenario: "b-contended-work0", Contended: true, Tasks: 10000, Orders: 10, TasksPerS: 900, RedisCPUPerTask: 100, Handoffs: 10, HandoffsAll: 990, HandoffP99: 2, RoundTripsPerTask: 6.1, OrderPairs: 90, Inversions: 1},
		{Scenario: "bt-uncontended-work0", Tasks: 10000, TasksPerS: 600, WorkerCPUPerTask: 169, RedisCPUPerTask: 160, SpansPerTask: 4},
	}, Accept: []acceptResult{
		{System: acceptRaw, Contention: contended, PerS: 1000, RoundTripsPerChange: 1},
		{System: acceptProducer, Contention: contended, PerS: 700, RatioToRaw: 0.7, RoundTripsPerChange: 2, Goroutines: 8},
	}}
	rep.ratios()
	require.InDelta(t, 0.9, rep.findName("b-uncontended-work10ms").RatioToA, 1e-9)
	require.InDelta(t, 1.25, rep.findName("b-contended-work10ms").RatioToB0, 1e-9)
	require.Zero(t, rep.findName("b0-contended-work10ms").RatioToB0)
	require.InDelta(t, 0.8, rep.findName("bt-uncontended-work0").RatioToB, 1e-9)
	require.InDelta(t, 0.625, rep.findName("b-contended-work10ms").RatioToAW, 1e-9)
	require.Zero(t, rep.findName("aw-contended-work10ms").RatioToAW)
	require.Len(t, rep.VsAW, 3, "(b) against (a+w) where both ran")
	require.Equal(t, contended, rep.VsAW[0].Contention)
	require.InDelta(t, 5.0/3, rep.VsAW[0].RoundTrips, 1e-9)
	require.Zero(t, rep.findName("bt-uncontended-work0").RatioToB0)
	require.Len(t, rep.Tracing, 1, "(bt) against (b) where both ran")
	tc := rep.Tracing[0]
	require.Equal(t, "work0", tc.Workload)
	require.Equal(t, uncontended, tc.Contention)
	require.InDelta(t, 0.8, tc.Throughput, 1e-9)
	require.InDelta(t, 1.3, tc.WorkerCPU, 1e-9)
	require.InDelta(t, 39, tc.WorkerCPUUs, 1e-9)
	require.InDelta(t, 1, tc.RedisCPU, 1e-9)
	met := map[string]bool{}
	for _, tg := range rep.Targets {
		met[tg.Name] = tg.Met
		if tg.Name == "(b) hot hand-off p99 ms [work0]" {
			require.Contains(t, tg.NA, "only 10 hand-offs", "a p99 of 10 samples is not judged")
		}
	}
	require.Equal(t, map[string]bool{
		"(b)/(a) uncontended [work10ms]": true, "(b)/(a) contended [work10ms]": false,
		"(b)/(a) uncontended, kept [work10ms]":           false,
		"(b)/(a) Redis CPU per task uncontended [work0]": false, "(b)/(a) worker CPU per task uncontended [work0]": true,
		"(b)/(a) uncontended [work0]": true, "(b)/(a) contended [work0]": true,
		"(b) hand-off p99 ms [work10ms]": true, "(c)/(b) hand-off p99 [work10ms]": true,
		"(b) hot hand-off p99 ms [work10ms]": true, "(b)/(b0) hot throughput [work10ms]": true,
		"(b) worker round trips/task uncontended [work10ms]":      true,
		"(b) worker round trips/task contended [work10ms]":        true,
		"(b) inversions contended [work10ms]":                     true,
		"(b) hot hand-off p99 ms [work0]":                         false,
		"(b)/(b0) hot throughput [work0]":                         false,
		"(b) worker round trips/task contended [work0]":           false,
		"(b) inversions contended [work0]":                        false,
		"(b) worker round trips/change, 10 hot orders [work10ms]": false,
		"(b) worker round trips/change, 10 hot orders [work0]":    false,
		"(b)/(a+w) Redis CPU per change uncontended [work0]":      true,
		"(b)/(a+w) Redis CPU per change contended [work0]":        false,
		"producer/raw enqueue rate, 8 goroutines, contended":      false,
		"producer round trips/change contended":                   true,
	}, met)
}

func TestParseReplicas(t *testing.T) {
	got, err := parseReplicas([]string{"1", " 2", "4"})
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 4}, got)
	_, err = parseReplicas([]string{"0"})
	require.Error(t, err)
}

func TestSleepHonoursContext(t *testing.T) {
	require.NoError(t, storehook.Sleep(t.Context(), time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, storehook.Sleep(ctx, time.Hour), context.Canceled)
}

func TestFloodFlags(t *testing.T) {
	parse := func(args ...string) settings {
		var c settings
		s := config.NewSet("bench", nil)
		declare(s, &c)
		require.NoError(t, s.Parse(args))
		return c
	}
	c := parse()
	require.True(t, c.Flood, "on by default, as make bench runs it")
	require.Equal(t, 2000, c.FloodTasks)
	require.Equal(t, 5*time.Millisecond, c.FloodWork)
	require.Equal(t, 100, c.FloodQuiet)
	require.Equal(t, 20, c.FloodConcurrency)
	require.Equal(t, 2, c.FloodReplicas)
	c = parse("-flood=false", "-flood-tasks", "50", "-flood-work", "1ms", "-flood-replicas", "0")
	require.False(t, c.Flood)
	require.Equal(t, 50, c.FloodTasks)
	require.Equal(t, time.Millisecond, c.FloodWork)
	require.Zero(t, c.FloodReplicas)
	var bad settings
	s := config.NewSet("bench", nil)
	declare(s, &bad)
	require.Error(t, s.Parse([]string{"-flood-replicas", "-1"}))
}

func TestFloodTargets(t *testing.T) {
	got := map[string]target{}
	for _, tg := range floodTargets([]floodResult{
		{Mode: "in process", DrainRatio: 0.9, OrderPairs: 1999, BaselineP99: 20, QuietP99: 30, RunsPerChange: 1.02, PlainRatio: 1.04},
		{Mode: "2 processes", DrainRatio: 0.5, OrderPairs: 1999, Inversions: 1, RunsPerChange: 1.5},
		{Mode: "3 processes", PlainRatio: 0.98},
	}) {
		got[tg.Name] = tg
	}
	require.Len(t, got, 15)
	require.True(t, got["drain / serial limit [flood, in process]"].Met)
	require.True(t, got["quiet p99 under flood / baseline p99 [flood, in process]"].Met)
	require.InDelta(t, 1.5, got["quiet p99 under flood / baseline p99 [flood, in process]"].Got, 1e-9)
	require.True(t, got["handler runs per change [flood, in process]"].Met)
	require.True(t, got["inversions [flood, in process]"].Met)
	require.False(t, got["drain / serial limit [flood, 2 processes]"].Met)
	require.False(t, got["inversions [flood, 2 processes]"].Met)
	require.NotEmpty(t, got["quiet p99 under flood / baseline p99 [flood, 2 processes]"].NA)
	require.False(t, got["handler runs per change [flood, 2 processes]"].Met)
	require.True(t, got["drain / plain asynq at concurrency 1 [flood, in process]"].Met)
	require.InDelta(t, 1.04, got["drain / plain asynq at concurrency 1 [flood, in process]"].Got, 1e-9)
	require.NotEmpty(t, got["drain / plain asynq at concurrency 1 [flood, 2 processes]"].NA, "no plain baseline, not judged")
	require.False(t, got["drain / plain asynq at concurrency 1 [flood, 3 processes]"].Met)
}

func TestParseHolds(t *testing.T) {
	h := parseHolds(`# HELP orderworker_hold_changes x
# TYPE orderworker_hold_changes histogram
orderworker_hold_changes_bucket{le="2"} 1
orderworker_hold_changes_sum 250
orderworker_hold_changes_count 3
orderworker_holds_yielded_total 2
orderworker_task_duration_seconds_count{outcome="ok",queue="order_modify",task_type="` + tasks.TypeModify + `"} 300
orderworker_task_duration_seconds_count{outcome="waiting",queue="order_modify",task_type="` + tasks.TypeModify + `"} 4
orderworker_task_duration_seconds_count{outcome="ok",queue="order_exchange",task_type="` + tasks.TypeExchange + `"} 9
`)
	require.Equal(t, holdStats{Holds: 3, Changes: 250, Yielded: 2, Runs: 304}, h)
	require.InDelta(t, 250.0/3, h.perHold(), 1e-9)
	require.Zero(t, holdStats{}.perHold())
}

// A small flood, in process, on a redis-server of its own: every change
// applied once, in order, in holds.
func TestFloodSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a redis-server")
	}
	p, err := redisproc.Start()
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	t.Cleanup(p.Stop)
	opts, err := redisconn.Parse(p.URL())
	require.NoError(t, err)
	c := settings{FloodTasks: 40, FloodWork: time.Millisecond, FloodQuiet: 5, FloodConcurrency: 4, Timeout: 30 * time.Second}
	r, err := runFlood(t.Context(), opts, c)
	require.NoError(t, err)
	require.Equal(t, 39, r.OrderPairs, "the whole flood is in the history")
	require.Zero(t, r.Inversions)
	require.Zero(t, r.Overlaps)
	require.InDelta(t, 1, r.RunsPerChange, 0.2)
	require.Positive(t, r.DrainSeconds)
	require.InDelta(t, 0.04, r.SerialSeconds, 1e-9)
	require.Positive(t, r.BaselineP99)
	require.Positive(t, r.QuietP99)
	require.Positive(t, r.Holds, "the flood drained in holds")
	require.Positive(t, r.Drained)
	require.Zero(t, r.Archived)
	require.InDelta(t, 1000*r.DrainSeconds/40-1, r.OverheadMs, 1e-9)
}

// The flood's plain baseline, small, on a redis-server of its own: every
// change applied once, by plain asynq at concurrency 1.
func TestFloodPlainSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a redis-server")
	}
	p, err := redisproc.Start()
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	t.Cleanup(p.Stop)
	opts, err := redisconn.Parse(p.URL())
	require.NoError(t, err)
	c := settings{FloodTasks: 40, FloodWork: time.Millisecond, Timeout: 30 * time.Second}
	r, err := runFloodPlain(t.Context(), opts, c)
	require.NoError(t, err)
	require.Equal(t, 1, r.Concurrency)
	require.Equal(t, 40, r.History, "every change wrote the order's history")
	require.InDelta(t, 1, r.RunsPerChange, 1e-9)
	require.Zero(t, r.Archived)
	require.InDelta(t, 0.04, r.SerialSeconds, 1e-9)
	require.Positive(t, r.DrainSeconds)
	require.InDelta(t, r.SerialSeconds/r.DrainSeconds, r.DrainRatio, 1e-9)
	require.InDelta(t, 1000*r.DrainSeconds/40-1, r.OverheadMs, 1e-9)
	require.GreaterOrEqual(t, r.RunMs, 1.0, "a run sleeps the work")
}

func TestFloodAgainstPlain(t *testing.T) {
	rr := []floodResult{
		{Mode: "in process", Tasks: 2000, WorkMs: 5, DrainSeconds: 12.5},
		{Mode: "2 processes", Tasks: 2000, WorkMs: 5},
	}
	plain := floodPlain{Concurrency: 1, Tasks: 2000, WorkMs: 5, DrainSeconds: 14}
	againstPlain(plain, rr)
	require.InDelta(t, 1.12, rr[0].PlainRatio, 1e-9)
	require.Zero(t, rr[1].PlainRatio, "no drain, no ratio")

	_, drain, ratio, over := drainFigures(10*time.Second, 12500*time.Millisecond, 2000, 5)
	require.InDelta(t, 12.5, drain, 1e-9)
	require.InDelta(t, 0.8, ratio, 1e-9)
	require.InDelta(t, 1.25, over, 1e-9)

	var out strings.Builder
	printFlood(&out, &plain, rr)
	require.Contains(t, out.String(), "plain/drain")
	require.Contains(t, out.String(), "over work ms")
	require.Regexp(t, `(?m)^\s*plain asynq\s+1\s`, out.String(), "the plain baseline's row, at concurrency 1")
	require.Regexp(t, `(?m)^\s*in process\s.*\s1\.12\s`, out.String())
}
