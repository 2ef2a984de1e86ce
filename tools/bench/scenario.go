package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/telemetry"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The systems under measurement.
const (
	sysPlain     = "a"  // plain asynq, a handler that only sleeps the work time
	sysPlainW    = "aw" // plain asynq whose handler sleeps the work time and makes (b)'s store write, fenced, without lock or order
	sysUnordered = "b0" // orderworker with ordering off: the same worker, tasks enqueued without a position
	sysOW        = "b"  // orderworker: worker.New with the order lock and the Redis store, tasks from the producer
	sysTraced    = "bt" // (b) with tracing on at full sampling, producer and worker, exported over OTLP HTTP
	sysSeed      = "c"  // the seed-style lock (EXISTS then SET) around the same store write
)

// allSystems are the systems in the order of the table: (bt) right after
// (b), so that the two run side by side.
var allSystems = []string{sysPlain, sysPlainW, sysUnordered, sysOW, sysTraced, sysSeed}

var systemNames = map[string]string{
	sysPlain:     "(a) asynq, no-op handler",
	sysPlainW:    "(a+w) asynq + store write",
	sysUnordered: "(b0) orderworker, ordering off",
	sysOW:        "(b) orderworker",
	sysTraced:    "(bt) orderworker, traced",
	sysSeed:      "(c) seed-style lock",
}

// The contention of a scenario, as named in the table and in -contention.
const (
	uncontended = "uncontended" // every task on an order of its own
	contended   = "contended"   // the tasks spread round-robin over -hot orders
)

// prefix is the key prefix of the order store and the locks in every
// scenario (each scenario starts on a flushed database).
const prefix = "ow:"

// singleQueues are the queues of the scenarios on one Redis node: one per
// task type, unsharded.
var singleQueues = benchkit.Queues(tasks.Shards{})

// workload is what every task of a row costs the worker: the simulated work
// per task, and how many tasks one worker runs at once.
type workload struct {
	Work        time.Duration
	Concurrency int
}

// Name names the workload in scenario names: "work10ms", "work0".
func (w workload) Name() string {
	if w.Work == 0 {
		return "work0"
	}
	return "work" + w.Work.String()
}

// MarshalJSON writes the workload as its name, work in ms and concurrency.
func (w workload) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name        string  `json:"name"`
		WorkMs      float64 `json:"work_ms"`
		Concurrency int     `json:"concurrency"`
	}{w.Name(), ms(w.Work), w.Concurrency})
}

func (w workload) String() string {
	return fmt.Sprintf("%v of work per task, concurrency %d", w.Work, w.Concurrency)
}

// standard is the workload of docs/performance.md's first table and of the
// throughput targets against plain asynq.
var standard = workload{Work: 10 * time.Millisecond, Concurrency: 20}

// defaultWorkloads is -workloads' default: the standard rows, and rows of
// zero work at concurrency 100, where the worker's own cost shows.
var defaultWorkloads = []string{"10ms:20", "0:100"}

// parseWorkloads reads -workloads: "<work>:<concurrency>" each.
func parseWorkloads(list []string) ([]workload, error) {
	var out []workload
	for _, s := range list {
		ws, cs, ok := strings.Cut(strings.TrimSpace(s), ":")
		if ws == "0" {
			ws = "0s"
		}
		work, err := time.ParseDuration(ws)
		n, cerr := strconv.Atoi(cs)
		if !ok || err != nil || cerr != nil || work < 0 || n <= 0 {
			return nil, fmt.Errorf("-workloads: %q is not <work>:<concurrency>, e.g. 10ms:20 or 0:100", s)
		}
		w := workload{Work: work, Concurrency: n}
		for _, o := range out {
			if o.Name() == w.Name() {
				return nil, fmt.Errorf("-workloads: %q: two workloads of %v work", s, work)
			}
		}
		out = append(out, w)
	}
	return out, nil
}

// scenario is one system on one workload and contention.
type scenario struct {
	Name      string
	System    string
	Contended bool
	Workload  workload
	Tasks     int
	Orders    int
	Note      string
}

// scenarios is the matrix the run measures: every workload × contention ×
// system, narrowed by -systems, -contention and -only, in table order;
// (bt) only on the workloads of -bt-workloads, unless -only names it.
func scenarios(c settings, workloads []workload) []scenario {
	var out []scenario
	for _, w := range workloads {
		for _, kind := range []string{uncontended, contended} {
			if !slices.Contains(c.Contention, kind) {
				continue
			}
			for _, sys := range allSystems {
				if !slices.Contains(c.Systems, sys) {
					continue
				}
				if sys == sysTraced && len(c.Only) == 0 && !tracedOn(c.TracedWorkloads, w) {
					continue
				}
				sc := scenario{System: sys, Contended: kind == contended, Workload: w, Tasks: c.Tasks, Orders: c.Tasks}
				sc.Name = sys + "-" + kind + "-" + w.Name()
				if len(c.Only) > 0 && !slices.Contains(c.Only, sc.Name) {
					continue
				}
				if sc.Contended {
					sc.Tasks, sc.Orders = c.HotTasks, c.Hot
					if sys == sysSeed && c.SeedHotTasks < c.HotTasks {
						sc.Tasks = c.SeedHotTasks
						sc.Note = fmt.Sprintf("%d tasks, not %d, to bound the run: the seed's waiters sleep 0-1000 ms between checks (-seed-hot-tasks)", c.SeedHotTasks, c.HotTasks)
					}
				}
				out = append(out, sc)
			}
		}
	}
	return out
}

// allWorkloads is -bt-workloads' value for every workload.
const allWorkloads = "all"

// tracedOn reports whether (bt) runs on workload w: list (-bt-workloads)
// names it, or is "all".
func tracedOn(list []string, w workload) bool {
	return slices.Contains(list, allWorkloads) || slices.Contains(list, w.Name())
}

// orderNo names order i of a scenario.
func orderNo(sc scenario, i int) string {
	if sc.Contended {
		return "H" + strconv.Itoa(i%sc.Orders)
	}
	return fmt.Sprintf("U%06d", i%sc.Orders)
}

// eventID names the event of task i of a scenario; eventIndex reads i back.
func eventID(sc scenario, i int) string { return sc.Name + "-" + strconv.Itoa(i) }

func eventIndex(ev string) (int64, bool) {
	i := strings.LastIndexByte(ev, '-')
	n, err := strconv.ParseInt(ev[i+1:], 10, 64)
	return n, i >= 0 && err == nil
}

// result is one row of the table.
type result struct {
	Scenario    string  `json:"scenario"`
	System      string  `json:"system"`
	Contended   bool    `json:"contended"`
	Workload    string  `json:"workload"`
	WorkMs      float64 `json:"work_ms"`
	Concurrency int     `json:"concurrency"`
	Tasks       int     `json:"tasks"`
	Orders      int     `json:"orders"`
	Note        string  `json:"note,omitempty"`
	Seconds     float64 `json:"seconds"`
	TasksPerS   float64 `json:"tasks_per_s"`
	RatioToA    float64 `json:"ratio_to_a,omitempty"`
	RatioToB0   float64 `json:"ratio_to_b0,omitempty"`
	// RatioToB is (bt)'s tasks/s over (b)'s on the same orders and
	// workload: what tracing costs in throughput.
	RatioToB float64 `json:"ratio_to_b,omitempty"`
	// RatioToAW is (b)'s tasks/s over (a+w)'s: plain asynq making the
	// same store write, without lock or order.
	RatioToAW float64 `json:"ratio_to_aw,omitempty"`
	Completed int64   `json:"completed"`
	Archived  int64   `json:"archived"`
	// Runs counts the handler runs of (b0), (b) and (c), per task:
	// above 1 when tasks went back to their queue to wait (Parked: not
	// their turn yet, parked until it comes; Busy: the lock stayed held
	// past the wait deadline).
	RunsPerTask float64 `json:"runs_per_task,omitempty"`
	Parked      int64   `json:"parked_runs,omitempty"`
	Busy        int64   `json:"busy_runs,omitempty"`
	// Handoffs are the hand-offs to a task that was already waiting when
	// the lock was released (see benchkit.WaiterHandoffs); HandoffsAll
	// counts every two consecutive holders, including a newcomer that
	// took the lock without waiting.
	Handoffs      int     `json:"handoffs"`
	HandoffP50    float64 `json:"handoff_p50_ms"`
	HandoffP99    float64 `json:"handoff_p99_ms"`
	HandoffMax    float64 `json:"handoff_max_ms"`
	HandoffsAll   int     `json:"handoffs_all"`
	HandoffAllP50 float64 `json:"handoff_all_p50_ms"`
	HandoffAllP99 float64 `json:"handoff_all_p99_ms"`
	// LockWait* are the tasks' waits for their order's lock, from asking
	// to having it (or, for (c), to giving up at the deadline); for (b)
	// from the worker's own per-task lock_wait.
	LockWaitP50 float64 `json:"lock_wait_p50_ms"`
	LockWaitP99 float64 `json:"lock_wait_p99_ms"`
	LockWaitMax float64 `json:"lock_wait_max_ms"`
	// CmdsPerTask is INFO commandstats' calls (commands run inside scripts
	// included) over the measured phase, per task.
	CmdsPerTask float64 `json:"redis_cmds_per_task"`
	// ScriptsPerTask is the EVAL/EVALSHA calls of CmdsPerTask, per task.
	ScriptsPerTask float64 `json:"redis_scripts_per_task"`
	// RoundTripsPerTask is what the workers' client sent (a pipeline is
	// one), per task.
	RoundTripsPerTask float64                     `json:"round_trips_per_task"`
	Commands          map[string]benchkit.CmdStat `json:"redis_commands"`
	// WorkerCPUPerTask is the bench process's CPU time (user + system)
	// over the measured phase, per task, in µs: the workers run in it.
	// RedisCPUPerTask is the server's, from INFO cpu.
	WorkerCPUPerTask float64          `json:"worker_cpu_us_per_task"`
	RedisCPUPerTask  float64          `json:"redis_cpu_us_per_task"`
	RoundTrips       map[string]int64 `json:"round_trips"`
	// PeakRSSKiB is the bench process's VmHWM over the measured phase (it
	// was reset at its start); PeakRSSDeltaKiB is that over its RSS at the
	// start.
	PeakRSSKiB      int64  `json:"peak_rss_kib"`
	PeakRSSDeltaKiB int64  `json:"peak_rss_delta_kib"`
	PeakHeapKiB     uint64 `json:"peak_heap_kib"`
	// SeedBypasses is how often (c) gave up waiting after 5 s and ran
	// without the lock, as the seed did.
	SeedBypasses int64 `json:"seed_bypasses"`
	// Holds are the holds of (b0), (b) and (bt) that drained (ran an
	// order's next changes under the kept lock), from the worker's
	// orderworker_hold_changes; ChangesPerHold their mean changes (the
	// first included); HoldsYielded orderworker_holds_yielded_total.
	Holds          int64   `json:"holds,omitempty"`
	ChangesPerHold float64 `json:"changes_per_hold,omitempty"`
	HoldsYielded   int64   `json:"holds_yielded,omitempty"`
	// Overlaps counts critical sections on one order that overlapped,
	// from the histories; FenceErrors fences that did not increase.
	Overlaps    int `json:"overlaps"`
	FenceErrors int `json:"fence_errors"`
	// OrderPairs is how many consecutive changes of one order the histories
	// hold; Inversions how many of them were applied out of the order of
	// acceptance: for (b) by their position (seq), which must never
	// happen; for (b0) and (c), whose tasks have none, by the order they
	// were enqueued in (the enqueue sends an order's tasks one after the
	// other), which shows what ordering prevents.
	OrderPairs int `json:"order_pairs"`
	Inversions int `json:"inversions"`
	// The tracing of (bt), counted over the measured phase and the flush
	// that ends it: spans ended, spans exported (the difference the batch
	// processor dropped), and the OTLP request bodies' bytes and count.
	SpansPerTask       float64 `json:"spans_per_task,omitempty"`
	SpansDropped       int64   `json:"spans_dropped,omitempty"`
	ExportBytesPerTask float64 `json:"export_bytes_per_task,omitempty"`
	ExportRequests     int64   `json:"export_requests,omitempty"`
}

// system is a running worker of one kind.
type system struct {
	stop    func()
	waits   *waits // the tasks' lock waits; nil for (a)
	bypass  func() int64
	hook    *benchkit.CountHook
	history bool // whether the store holds a history to analyse
	// traced is (bt)'s tracing, nil for the other systems; stop closes
	// it.
	traced *tracedExport
	// metrics is the worker's registry, nil for asynq's own servers.
	metrics *prometheus.Registry
}

// runScenario measures one scenario on a flushed database: it seeds the
// orders, enqueues the tasks, then starts the system and measures until
// every task is completed or archived.
func runScenario(ctx context.Context, opts *redisconn.Options, c settings, sc scenario) (result, error) {
	r := result{Scenario: sc.Name, System: systemNames[sc.System], Contended: sc.Contended,
		Workload: sc.Workload.Name(), WorkMs: ms(sc.Workload.Work), Concurrency: sc.Workload.Concurrency,
		Tasks: sc.Tasks, Orders: sc.Orders, Note: sc.Note}
	admin := opts.NewClient()
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		return r, err
	}
	store, err := redisstore.New(admin, redisstore.Config{Prefix: prefix})
	if err != nil {
		return r, err
	}
	if sc.System != sysPlain {
		if err := seedOrders(ctx, store, sc); err != nil {
			return r, err
		}
	}
	if err := enqueue(ctx, admin, sc); err != nil {
		return r, err
	}

	// The measured phase.
	monitor := opts.NewClient()
	defer monitor.Close()
	before, err := benchkit.CommandStats(ctx, monitor)
	if err != nil {
		return r, err
	}
	runtime.GC()
	peakRSSReset := benchkit.ResetPeakRSS() == nil
	memStart, _ := benchkit.ProcMemory(0)
	heap := startHeapWatch()
	defer heap()
	redisCPU0, err := benchkit.RedisCPU(ctx, monitor)
	if err != nil {
		return r, err
	}
	selfCPU0 := benchkit.SelfCPU()

	stopProfile, err := startProfile(c.CPUProfile, sc.Name)
	if err != nil {
		return r, err
	}
	defer stopProfile()
	rdb := opts.NewClient()
	defer rdb.Close()
	sys, err := startSystem(ctx, rdb, sc)
	if err != nil {
		return r, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, fmt.Errorf("not finished after %v", c.Timeout))
	samples, err := benchkit.WaitFinished(wctx, monitor, singleQueues, int64(sc.Tasks), 5*time.Millisecond)
	cancel()
	if err != nil {
		sys.stop()
		return r, err
	}
	end := samples[len(samples)-1].At
	var spans traceCounts
	if sys.traced != nil {
		// The spans still queued are exported now, inside the measured
		// CPU (not its time): every run's tracing is paid for.
		if err := sys.traced.Flush(ctx); err != nil {
			sys.stop()
			return r, fmt.Errorf("flush the spans: %w", err)
		}
		spans = sys.traced.counts()
	}
	rt := sys.hook.RoundTrips()
	rtBy := sys.hook.ByName()
	after, err := benchkit.CommandStats(ctx, monitor)
	if err != nil {
		sys.stop()
		return r, err
	}
	selfCPU := benchkit.SelfCPU() - selfCPU0
	redisCPU, err := benchkit.RedisCPU(ctx, monitor)
	if err != nil {
		sys.stop()
		return r, err
	}
	redisCPU -= redisCPU0
	mem, _ := benchkit.ProcMemory(0)
	r.PeakHeapKiB = heap() / 1024
	stopProfile()
	sys.stop()

	n := float64(sc.Tasks)
	r.Seconds = end.Sub(start).Seconds()
	r.TasksPerS = n / r.Seconds
	r.Completed, r.Archived, _ = asynqredis.Finished(ctx, admin, singleQueues)
	// The monitor's own commands: its INFO and its ZCARD polls (asynq runs
	// no ZCARD while processing).
	r.Commands = benchkit.Delta(before, after)
	delete(r.Commands, "info")
	delete(r.Commands, "zcard")
	r.CmdsPerTask = float64(benchkit.Sum(r.Commands)) / n
	r.ScriptsPerTask = float64(r.Commands["evalsha"].Calls+r.Commands["eval"].Calls) / n
	r.RoundTrips = rtBy
	r.WorkerCPUPerTask = float64(selfCPU) / float64(time.Microsecond) / n
	r.RedisCPUPerTask = float64(redisCPU) / float64(time.Microsecond) / n
	r.RoundTripsPerTask = float64(rt) / n
	if peakRSSReset {
		r.PeakRSSKiB, r.PeakRSSDeltaKiB = mem.HWM, mem.HWM-memStart.RSS
	}
	if sys.waits != nil {
		runs, parked, busy := sys.waits.runs()
		r.RunsPerTask, r.Parked, r.Busy = float64(runs)/n, parked, busy
		w := sys.waits.sorted()
		r.LockWaitP50 = ms(benchkit.Quantile(w, 0.50))
		r.LockWaitP99 = ms(benchkit.Quantile(w, 0.99))
		r.LockWaitMax = ms(benchkit.Quantile(w, 1))
	}
	if sys.bypass != nil {
		r.SeedBypasses = sys.bypass()
	}
	if sys.metrics != nil {
		h, err := gatherHolds(sys.metrics)
		if err != nil {
			return r, err
		}
		r.Holds, r.ChangesPerHold, r.HoldsYielded = h.Holds, h.perHold(), h.Yielded
	}
	if sys.traced != nil {
		r.SpansPerTask = float64(spans.ended) / n
		r.SpansDropped = spans.ended - spans.spans
		r.ExportBytesPerTask = float64(spans.bytes) / n
		r.ExportRequests = spans.posts
	}
	if sys.history {
		nos := make([]string, 0, sc.Orders)
		for i := range sc.Orders {
			nos = append(nos, orderNo(sc, i))
		}
		hist, err := benchkit.Histories(ctx, store, nos, 16)
		if err != nil {
			return r, err
		}
		a := benchkit.Analyze(hist)
		var h []time.Duration
		if sys.waits != nil {
			h = benchkit.WaiterHandoffs(hist, func(e orders.Entry) (time.Duration, bool) { return sys.waits.of(e.EventID) })
		}
		r.Handoffs, r.HandoffsAll = len(h), len(a.Handoffs)
		if sc.System == sysPlainW {
			// No lock: consecutive writes are no hand-offs.
			r.HandoffsAll = 0
		}
		r.HandoffP50 = ms(benchkit.Quantile(h, 0.50))
		r.HandoffP99 = ms(benchkit.Quantile(h, 0.99))
		r.HandoffMax = ms(benchkit.Quantile(h, 1))
		r.HandoffAllP50 = ms(benchkit.Quantile(a.Handoffs, 0.50))
		r.HandoffAllP99 = ms(benchkit.Quantile(a.Handoffs, 0.99))
		r.Overlaps = a.Count("overlap")
		r.FenceErrors = a.Count("fence")
		place := benchkit.BySeq
		if sc.System != sysOW && sc.System != sysTraced {
			place = func(e orders.Entry) (int64, bool) { return eventIndex(e.EventID) }
		}
		var inv []benchkit.Violation
		r.OrderPairs, inv = benchkit.Inversions(hist, place)
		r.Inversions = len(inv)
	}
	return r, nil
}

// startProfile starts a CPU profile to path.name when path is set. The
// returned func stops it; calling it again does nothing.
func startProfile(path, name string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path + "." + name)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		})
	}, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// startHeapWatch samples the Go heap (live and dead objects not yet swept,
// from runtime/metrics, which does not stop the world) every 10 ms until
// the returned func is called, which returns the highest value seen (again
// on later calls).
func startHeapWatch() func() uint64 {
	stop, done := make(chan struct{}), make(chan uint64, 1)
	go func() {
		var peak uint64
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				peak = max(peak, sample[0].Value.Uint64())
			}
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	var peak uint64
	return func() uint64 {
		once.Do(func() { close(stop); peak = <-done })
		return peak
	}
}

// seedOrders puts the scenario's orders into the store.
func seedOrders(ctx context.Context, store orders.Store, sc scenario) error {
	return benchkit.ForEach(ctx, sc.Orders, 16, func(ctx context.Context, i int) error {
		return store.Put(ctx, orders.Order{No: orderNo(sc, i), Address: "seeded", Items: []orders.Item{{SKU: "A", Qty: 1}}})
	})
}

// enqueue enqueues the scenario's tasks: modifies of the address, task i
// on order orderNo(sc, i), through the producer, or for (b0), (a) and
// (a+w) by hand without a position (see rawTask): the producer parks a
// change accepted behind unfinished changes of its order (asynq's retry
// set, for the change before it to call back), which plain asynq would
// only run once the park ends. The workload has no exchanges: an
// exchange closes its order, and the next modify of it would be rejected.
func enqueue(ctx context.Context, rdb redis.UniversalClient, sc scenario) error {
	return enqueueWith(ctx, rdb, sc, tasks.Shards{})
}

// enqueueWith is enqueue with the producer's queue shards. For (bt) the
// producer is traced, so that each task carries its enqueue's trace
// context; its spans are exported before it returns, outside the measured
// phase.
func enqueueWith(ctx context.Context, rdb redis.UniversalClient, sc scenario, shards tasks.Shards) (err error) {
	cfg := producer.Config{Shards: shards}
	if sc.System == sysTraced {
		t, err := newTracedExport(ctx)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, t.Close(context.WithoutCancel(ctx))) }()
		cfg.TracerProvider = t.Provider()
	}
	p, err := producer.New(rdb, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	// In order, in batches of at most one task per order, so that every
	// order's tasks are enqueued one after the other (the order (b0) and
	// (c) are checked against) and the contended workload keeps every hot
	// order's tasks spread evenly through the queue.
	batch := min(64, sc.Orders)
	for from := 0; from < sc.Tasks; from += batch {
		to := min(from+batch, sc.Tasks)
		err := benchkit.ForEach(ctx, to-from, batch, func(ctx context.Context, j int) error {
			i := from + j
			addr := "address " + strconv.Itoa(i)
			m := tasks.ModifyPayload{EventID: eventID(sc, i), OrderNo: orderNo(sc, i), Changes: tasks.Changes{Address: &addr}}
			if sc.System == sysUnordered || sc.System == sysPlain || sc.System == sysPlainW {
				t, opts, err := rawTask(m)
				if err != nil {
					return err
				}
				_, err = client.EnqueueContext(ctx, t, opts...)
				return err
			}
			_, err := p.Enqueue(ctx, m)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rawTask is a modify as a system that enqueues into asynq by hand builds
// it, without a position: the producer's payload minus seq, task ID = event
// ID, the kind's queue, and the producer's default retry budget, timeout
// and retention. The worker applies such a task without order.
func rawTask(m tasks.ModifyPayload) (*asynq.Task, []asynq.Option, error) {
	m.Seq = 0
	t, err := tasks.NewTask(m)
	if err != nil {
		return nil, nil, err
	}
	return t, []asynq.Option{
		asynq.Queue(tasks.Modify.Queue),
		asynq.TaskID(m.EventID),
		asynq.MaxRetry(tasks.MaxRetry(producer.DefaultMaxRetry)),
		asynq.Timeout(producer.DefaultTimeout),
		asynq.Retention(producer.DefaultRetention),
	}, nil
}

// startSystem starts the scenario's system on rdb, which it instruments
// with a round-trip counter.
func startSystem(ctx context.Context, rdb redis.UniversalClient, sc scenario) (*system, error) {
	hook := benchkit.NewCountHook()
	rdb.AddHook(hook)
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	work := sc.Workload.Work
	switch sc.System {
	case sysOW, sysUnordered, sysTraced:
		// The same worker for all three: whether a task is ordered is up
		// to its payload; (bt)'s is traced.
		lw := newWaits()
		reg := prometheus.NewRegistry()
		m, err := worker.NewMetrics(reg)
		if err != nil {
			return nil, err
		}
		cfg := worker.Config{
			KeyPrefix:   prefix,
			Concurrency: sc.Workload.Concurrency,
			ID:          "bench-" + sc.System,
			OnDone:      lw.done,
			Metrics:     m,
		}
		var traced *tracedExport
		if sc.System == sysTraced {
			if traced, err = newTracedExport(ctx); err != nil {
				return nil, err
			}
			cfg.TracerProvider = traced.Provider()
			// As cmd/worker does: the Redis commands of a run are spans.
			if err := telemetry.InstrumentRedis(rdb, traced.Provider()); err != nil {
				_ = traced.Close(context.WithoutCancel(ctx))
				return nil, err
			}
		}
		closeTraced := func() {
			if traced != nil {
				_ = traced.Close(context.WithoutCancel(ctx))
			}
		}
		cfg.Kinds = storehook.Kinds(cfg.Kinds, storehook.Delay(work))
		w, err := worker.New(rdb, store, cfg)
		if err != nil {
			closeTraced()
			return nil, err
		}
		if err := w.Start(); err != nil {
			closeTraced()
			return nil, err
		}
		stop := func() {
			w.Shutdown()
			closeTraced()
		}
		return &system{hook: hook, history: true, waits: lw, stop: stop, traced: traced, metrics: reg}, nil
	case sysPlain, sysPlainW, sysSeed:
		mux := asynq.NewServeMux()
		var sl *seedLock
		switch sc.System {
		case sysPlain:
			noop := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return storehook.Sleep(ctx, work) })
			for _, k := range tasks.Kinds() {
				mux.Handle(k.Type, noop)
			}
		case sysPlainW:
			mux.Handle(tasks.TypeModify, plainWrite{store: store, work: work})
		default:
			sl = &seedLock{rdb: rdb, store: store, work: work, keyPrefix: prefix + "seedlock:", waits: newWaits()}
			mux.Handle(tasks.TypeModify, sl)
		}
		srv := asynq.NewServerFromRedisClient(rdb, plainConfig(sc.Workload.Concurrency))
		if err := srv.Start(mux); err != nil {
			return nil, err
		}
		s := &system{hook: hook, stop: srv.Shutdown, history: sc.System == sysPlainW}
		if sl != nil {
			s.history = true
			s.bypass = sl.bypasses.Load
			s.waits = sl.waits
		}
		return s, nil
	}
	return nil, fmt.Errorf("unknown system %q", sc.System)
}

// plainConfig is the asynq configuration of (a) and (c): worker.New's,
// without the order lock's retry policy.
func plainConfig(concurrency int) asynq.Config {
	return asynq.Config{
		Concurrency:              concurrency,
		Queues:                   worker.DefaultQueues(),
		TaskCheckInterval:        time.Second,
		DelayedTaskCheckInterval: time.Second,
		Logger:                   zap.NewNop().Sugar(),
		LogLevel:                 asynq.WarnLevel,
	}
}

// plainWrite is (a+w)'s handler: it sleeps the work time and makes (b)'s
// store write (the Redis store's Modify, fence 1 on every write, which the
// store accepts again and again, without the order's result, as the worker
// asks), without lock or order: what a plain asynq handler that writes the
// order costs, against which (b)'s cost of ordering shows.
type plainWrite struct {
	store orders.Modifier
	work  time.Duration
}

func (h plainWrite) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.Parse[tasks.ModifyPayload](t.Payload())
	if err != nil {
		return err
	}
	started := time.Now()
	if err := storehook.Sleep(ctx, h.work); err != nil {
		return err
	}
	wctx := orders.WithWrite(ctx, orders.Write{Fence: 1, Worker: "bench-aw", StartedAt: started, NoResult: true})
	_, err = h.store.Modify(wctx, p.EventID, p.OrderNo, orders.Changes{
		Address: p.Changes.Address, Remark: p.Changes.Remark, Items: p.Changes.Items,
	})
	if err != nil && orders.Permanent(err) {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}
