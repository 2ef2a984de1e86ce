package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/embedded"
	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/storehook"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

type settings struct {
	Hold       time.Duration
	Work       time.Duration
	Serve      bool
	Trace      bool
	TraceEvent string
	LogLevel   string
	Timeout    time.Duration
	OrderStore orderstore.Settings
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var c settings
	s := config.NewSet("demo", getenv)
	s.Duration(&c.Hold, "hold", "DEMO_HOLD", 1500*time.Millisecond, "how long the exchange works while holding its order").Check(config.Positive[time.Duration])
	s.Duration(&c.Work, "work", "DEMO_WORK", 200*time.Millisecond, "how long each modify works while holding its order").Check(config.Positive[time.Duration])
	s.Bool(&c.Serve, "serve", "DEMO_SERVE", false, "keep the worker and the embedded Redis running after the scenario, until interrupted")
	s.Bool(&c.Trace, "trace", "DEMO_TRACE", false, "trace the scenario's changes with OpenTelemetry, keeping the spans in memory, and print one change's trace as a tree after it")
	s.String(&c.TraceEvent, "trace-event", "DEMO_TRACE_EVENT", "", "the event ID of the change whose trace -trace prints; implies -trace; empty: the first modify that ran in the hold of the change before it and was applied")
	s.String(&c.LogLevel, "log-level", "LOG_LEVEL", "error", "level of the raw logs written to stderr besides the timeline: "+logging.Levels).Check(logging.CheckLevel)
	s.Duration(&c.Timeout, "timeout", "DEMO_TIMEOUT", time.Minute, "give up when the scenario has not finished by then").Check(config.Positive[time.Duration])
	orderstore.Declare(s, &c.OrderStore)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil
		}
		return err
	}
	c.Trace = c.Trace || c.TraceEvent != ""

	srv, err := embedded.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()

	tl := newTimeline(stdout)
	log, err := logging.New(c.LogLevel, logging.FormatConsole, nil)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	logging.Redis.Set(log) // go-redis's own lines (see logging.CaptureRedis)

	// With -trace, the producer, the worker and an HTTP order store trace
	// into spans kept in memory. The provider is shut down after the
	// printout, or else after the worker's runs have ended (deferred
	// before the worker's shutdown).
	var tp trace.TracerProvider // nil: tracing off
	var spans spanLog
	stopTracing := func() {}
	if c.Trace {
		sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(&spans))
		stopTracing = func() { _ = sdk.Shutdown(context.WithoutCancel(ctx)) } // no error to report: spans has nothing to flush
		tp = sdk
	}
	defer stopTracing() // a no-op once shut down

	opened, err := orderstore.Open(rdb, orderkeys.DefaultPrefix, &c.OrderStore, orderstore.Hooks{TracerProvider: tp}, log)
	if err != nil {
		return err
	}
	defer opened.Close()
	base := opened.Store
	exchanging := make(chan struct{})
	w, err := worker.New(rdb, base, worker.Config{
		Kinds:       storehook.Kinds(nil, work(tl, c.Hold, c.Work, exchanging)),
		Concurrency: 8, Logger: log, ID: "demo-worker", OnDone: tl.finished, OnLockWait: tl.waiting,
		TaskCheckInterval: 50 * time.Millisecond, DelayedTaskCheckInterval: 200 * time.Millisecond,
		TracerProvider: tp,
	})
	if err != nil {
		return err
	}
	if err := w.Start(); err != nil {
		return err
	}
	defer w.Shutdown()
	prod, err := producer.New(rdb, producer.Config{TracerProvider: tp})
	if err != nil {
		return err
	}
	defer prod.Close()

	fmt.Fprintf(stdout, "orderworker demo: embedded Redis at %s, one worker running 8 tasks at once.\n", srv.Addr())
	fmt.Fprintf(stdout, "Changes of SO1001 arrive around an exchange that holds the order for %v, and of SO1002 back to back.\n", c.Hold)
	fmt.Fprintf(stdout, "Each change takes its order's next position when accepted (seq); the worker applies them in that order.\n\n")

	sctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	if err := scenario(sctx, base, prod, exchanging, tl); err != nil {
		return err
	}
	for _, no := range []string{"SO1001", "SO2001", "SO1002"} {
		if err := printOrder(sctx, stdout, base, no); err != nil {
			return err
		}
	}
	if c.Trace {
		ev := cmp.Or(c.TraceEvent, spans.drained())
		if ev == "" {
			return errors.New("no modify ran in the hold of the change before it: no trace to print")
		}
		if err := printTrace(stdout, &spans, ev); err != nil {
			return err
		}
		stopTracing() // done with the spans: -serve keeps none in memory
	}
	if c.Serve {
		fmt.Fprintf(stdout, "\nServing on the embedded Redis at %s until interrupted. Try:\n", srv.Addr())
		fmt.Fprintf(stdout, "  REDIS_URL=%s go run ./cmd/producer modify SO2001 -remark hello\n", srv.URL())
		fmt.Fprintf(stdout, "  REDIS_URL=%s go run ./cmd/producer order get SO2001\n", srv.URL())
		<-ctx.Done()
	}
	return nil
}

// scenario seeds the orders, enqueues the changes and waits for them.
func scenario(ctx context.Context, store orders.Store, prod *producer.Producer, exchanging <-chan struct{}, tl *timeline) error {
	for _, o := range []orders.Order{
		{No: "SO1001", Address: "12 Harbour St", Remark: "ring twice", Items: []orders.Item{{SKU: "TEA-GREEN", Qty: 2}}},
		{No: "SO1002", Address: "7 Mill Lane", Items: []orders.Item{{SKU: "MUG-BLUE", Qty: 1}}},
	} {
		if err := store.Put(ctx, o); err != nil {
			return err
		}
	}
	str := func(s string) *string { return &s }
	enqueue := func(what string, f func() (producer.Result, error)) error {
		r, err := f()
		if err != nil {
			return fmt.Errorf("enqueue %s: %w", what, err)
		}
		tl.expect(r.TaskID)
		tl.printf("%-9s %-22s %s (seq %d)", "enqueue", r.EventID, what, r.Seq)
		return nil
	}
	modify := func(event, order string, c tasks.Changes, what string) error {
		return enqueue(what, func() (producer.Result, error) {
			return prod.EnqueueModify(ctx, order, c, producer.WithEventID(event))
		})
	}
	// A modify accepted just before the exchange applies before it, and
	// the replacement copies its address.
	if err := modify("modify-1", "SO1001", tasks.Changes{Address: str("3 Quay Rd")}, "modify SO1001 address"); err != nil {
		return err
	}
	if err := enqueue("exchange SO1001 for SO2001", func() (producer.Result, error) {
		return prod.EnqueueExchange(ctx, "SO1001", []tasks.Item{{SKU: "TEA-BLACK", Qty: 2}},
			producer.WithEventID("exchange-1"), producer.WithNewOrderNo("SO2001"), producer.WithReason("wrong tea"))
	}); err != nil {
		return err
	}
	select { // the next changes arrive while the exchange holds SO1001
	case <-exchanging:
	case <-ctx.Done():
		return ctx.Err()
	}
	mods := []struct {
		event, order string
		c            tasks.Changes
		what         string
	}{
		// Accepted after the exchange: rejected, naming the replacement.
		{"modify-2", "SO1001", tasks.Changes{Remark: str("leave at door")}, "modify SO1001 remark"},
		// A modify of the replacement, sent before it exists: it waits for
		// the exchange to create it.
		{"modify-3", "SO2001", tasks.Changes{Remark: str("leave at door")}, "modify SO2001 remark (the replacement)"},
		// Two address changes of SO1002 back to back: the last word wins.
		{"modify-4", "SO1002", tasks.Changes{Address: str("8 Mill Lane")}, "modify SO1002 address"},
		{"modify-5", "SO1002", tasks.Changes{Address: str("9 Mill Lane")}, "modify SO1002 address again"},
		{"modify-6", "SO1002", tasks.Changes{Remark: str("gift wrap")}, "modify SO1002 remark"},
	}
	for _, m := range mods {
		if err := modify(m.event, m.order, m.c, m.what); err != nil {
			return err
		}
	}
	return tl.wait(ctx)
}

func printOrder(ctx context.Context, w io.Writer, store orders.Store, no string) error {
	o, err := store.Get(ctx, no)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s  %s  v%d  address=%q remark=%q items=%v", o.No, o.Status, o.Version, o.Address, o.Remark, o.Items)
	if o.ExchangedTo != "" {
		fmt.Fprintf(w, "  exchanged_to=%s", o.ExchangedTo)
	}
	if o.ExchangedFrom != "" {
		fmt.Fprintf(w, "  exchanged_from=%s", o.ExchangedFrom)
	}
	fmt.Fprintln(w)
	hist, err := orders.AllHistory(ctx, store, no)
	if err != nil {
		return err
	}
	for _, h := range hist {
		seq := ""
		if h.Seq > 0 {
			seq = fmt.Sprintf("seq=%d", h.Seq)
		}
		fmt.Fprintf(w, "    v%-2d %-15s %-11s %-20s fence=%-17d %s\n", h.Version, h.Type, h.EventID, seq, h.Fence, h.Detail)
	}
	return nil
}

// work stands in for real work: each write takes a while inside the
// order's lock (hold for an exchange, work for a modify), and reports to the
// timeline when it starts. exchanging is closed when the first exchange has
// the lock.
func work(tl *timeline, hold, work time.Duration, exchanging chan struct{}) storehook.Hook {
	var once sync.Once
	return func(ctx context.Context, typ, ev, no string) error {
		w, _ := orders.WriteFrom(ctx)
		tl.printf("%-9s %-22s has the lock of %s (fence %d)", "locked", ev, no, w.Fence)
		d := work
		if typ == tasks.TypeExchange {
			once.Do(func() { close(exchanging) })
			d = hold
		}
		return storehook.Delay(d)(ctx, typ, ev, no)
	}
}

// timeline prints what happens, with the time since the start, and counts
// the tasks that have finished.
type timeline struct {
	mu      sync.Mutex
	w       io.Writer
	start   time.Time
	pending map[string]bool   // task IDs enqueued and not yet finished
	held    map[string]string // by order: the label of the last run that held its lock
	changed chan struct{}     // signalled when a task finishes
}

func newTimeline(w io.Writer) *timeline {
	return &timeline{w: w, start: time.Now(), pending: map[string]bool{}, held: map[string]string{}, changed: make(chan struct{}, 1)}
}

func (t *timeline) printf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%+7.2fs  %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, args...))
}

func (t *timeline) expect(taskID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending[taskID] = true
}

// waiting records a task that starts waiting for its order: the lock is
// held (holder is the holder's meta), or it is not its turn yet (holder is
// the label of the position before it).
func (t *timeline) waiting(key, meta, holder string) {
	_, id, _ := strings.Cut(meta, " ")
	if typ, ev, from, ok := tasks.Kinds().ParseLabel(holder); ok {
		what := typ + " " + ev
		if from != "" {
			what = "the creation of " + key + " by " + ev + " of " + from
		}
		t.printf("%-9s %-22s waits for its turn on %s, after %s", "waiting", id, key, what)
		return
	}
	t.printf("%-9s %-22s %s is held by %s", "waiting", id, key, holder)
}

// finished records a task run, from the worker's OnDone. A worker calls it
// for the runs of a drained hold one after the other, in the hold's order:
// the last run that held an order's lock is the change before the next
// one run in its hold.
func (t *timeline) finished(d worker.Done) {
	t.mu.Lock()
	before := t.held[d.OrderNo]
	if d.Locked {
		t.held[d.OrderNo] = tasks.PositionLabel(d.Type, d.EventID)
	}
	t.mu.Unlock()
	var how string
	switch {
	case d.Drained:
		how = fmt.Sprintf("ran in the hold of the change before it on %s (%s)", d.OrderNo, cmp.Or(before, "?"))
	case d.Lock.Attempts <= 1:
		how = "took the lock at once"
	case d.Lock.WokenByNotice > 0:
		how = fmt.Sprintf("waited %v, woken by the notice of the change before it", d.Lock.Waited.Round(time.Millisecond))
	default:
		how = fmt.Sprintf("waited %v, woken by its random delay", d.Lock.Waited.Round(time.Millisecond))
	}
	if d.Retried > 0 {
		how = fmt.Sprintf("run %d: %s", d.Retried+1, how)
	}
	outcome := "applied"
	if d.Err != nil {
		outcome = d.Outcome + ": " + strings.TrimSuffix(d.Err.Error(), ": "+asynq.SkipRetry.Error())
	}
	t.printf("%-9s %-22s %s; %s", "done", d.EventID, how, outcome)
	t.mu.Lock()
	if d.Outcome == worker.OutcomeOK || d.Outcome == worker.OutcomeRejected {
		delete(t.pending, d.TaskID)
	}
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// wait returns when every expected task has finished.
func (t *timeline) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		n := len(t.pending)
		t.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-t.changed:
		case <-ctx.Done():
			return fmt.Errorf("%d tasks still unfinished: %w", n, ctx.Err())
		}
	}
}
