package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/cmd/internal/safetext"
	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/telemetry"
	"github.com/orderworker/orderworker/internal/tracing"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// usage is the help text: one enqueue command per kind of kinds (see
// kindCommands), with the kind's example when it takes JSON, then the
// other commands.
func usage(kinds tasks.Table) string {
	var b strings.Builder
	b.WriteString("Usage: producer [settings] <command> [flags] [args]\n\nCommands:\n")
	for _, c := range kindCommands(kinds) {
		fmt.Fprintf(&b, "  %s <order_no> %s\n        enqueue an %s task\n", c.kind.Name, c.flags, c.kind.Type)
		if c.example != "" {
			fmt.Fprintf(&b, "        e.g. -json '%s'\n", c.example)
		}
	}
	return b.String() + otherCommands
}

const otherCommands = `  order get <order_no>          print an order as JSON
  order history <order_no>      print an order's history as JSON
  order status <order_no> [-json]
        what is happening to an order: its lock, the changes waiting in its
        sequence, its tasks in every state, its latest history
  order blocked [-limit N] [-reason R] [-json]
        the orders that are stuck (their next change has waited longer than
        BLOCKED_AFTER, or an operator holds them), oldest first, with why
  order retry|skip|hold|resume <order_no> [-reason R] [-by WHO]
        an operator action on the order's head (the change whose turn it
        is): run it now, archive it and go on, stop applying the order's
        changes (still accepted), apply them again; -reason is required for
        skip and hold; recorded as cli:WHO, -by defaulting to the OS user
        (see docs/operations.md, Operator actions); run as intake-admin
  order put <order_no> -address A [-remark R] -item SKU=QTY...
        create or replace an order (seeding; not fenced)
  acl worker|intake|intake-admin|dashboard|dashboard-write
        print that process's Redis ACL rules, for KEY_PREFIX and ORDER_STORE,
        to follow ACL SETUSER <user> reset on ><password> (see docs/operations.md, ACL rules)
  shards                        where the tasks of the QUEUE_SHARDS queues are placed: fails
                                while any waits in a placement of a draining count only
  serve                         run the HTTP intake (see README)

Settings (before the command; each also an environment variable):
`

// common are the settings every command shares.
type common struct {
	Redis   *redisconn.Options
	Prefix  string
	Shards  tasks.Shards
	GapWait time.Duration
	// BlockedAfter is how long an order's next change may wait before the
	// blocked list shows the order.
	BlockedAfter time.Duration
	OrderStore   orderstore.Settings // the worker's: the orders are read where it writes them
	// WaitReplicas and WaitTimeout are the producer's (Config.WaitReplicas).
	WaitReplicas int
	WaitTimeout  time.Duration
	// MaxWaiting caps an order's backlog (Config.MaxWaiting).
	MaxWaiting int
	// Kinds are the task kinds every command reads types, queues and
	// labels against: the producer's (Config.Kinds), the order views' and
	// the operator actions', and the enqueue commands. run sets the
	// contract's, tasks.Kinds(); it is no setting.
	Kinds tasks.Table
}

// producerConfig is the producer's configuration from c.
func (c *common) producerConfig() producer.Config {
	// A change parked behind its order's head waits at most the workers'
	// gap wait (the same GAP_WAIT), so that a gap is found as soon.
	return producer.Config{KeyPrefix: c.Prefix, Shards: c.Shards, Kinds: c.Kinds, WaitReplicas: c.WaitReplicas, WaitTimeout: c.WaitTimeout,
		MaxWaiting: c.MaxWaiting, ParkFor: max(c.GapWait, time.Second)}
}

func declareCommon(s *config.Set, c *common) {
	s.Redis(&c.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL,
		"Redis shared by all processes: "+config.RedisURLForms)
	s.String(&c.Prefix, "key-prefix", "KEY_PREFIX", orderkeys.DefaultPrefix, "prefix of orderworker's Redis keys; the same as the worker's")
	s.Shards(&c.Shards, "queue-shards", "QUEUE_SHARDS", "queues each task type is spread over, by CRC-32 of the order number (1: the types' own queues): "+config.ShardsForms+"; the same as the workers'")
	s.Duration(&c.GapWait, "gap-wait", "GAP_WAIT", orderview.DefaultGapWait,
		"the workers' gap wait, whose time left the order status shows for a position without its task; the same as the worker's").Check(config.Positive[time.Duration])
	s.Duration(&c.BlockedAfter, "blocked-after", "BLOCKED_AFTER", orderview.DefaultBlockedAfter,
		"how long an order's next change may wait before the blocked-orders list (order blocked, GET /v1/blocked-orders) shows the order").Check(config.Positive[time.Duration])
	s.Int(&c.WaitReplicas, "wait-replicas", "WAIT_REPLICAS", 0,
		"replicas that must have an accepted change before it is reported accepted (Redis WAIT); 0 for none; 1 keeps a failover from losing an accepted change (see docs/scaling.md, What a failover can lose); at most the replicas of each master").Check(config.NonNegative[int])
	s.Duration(&c.WaitTimeout, "wait-timeout", "WAIT_TIMEOUT", producer.DefaultWaitTimeout,
		"how long an acceptance waits for WAIT_REPLICAS before it fails (unconfirmed: send it again); below the Redis read timeout").Check(config.Positive[time.Duration])
	s.Int(&c.MaxWaiting, "max-waiting", "MAX_WAITING", producer.DefaultMaxWaiting,
		"most changes of one order waiting to be applied; a change past it is refused (the intake answers 429 backlog_full) and nothing is written; -1 for no cap").Check(atLeastMinusOne)
	orderstore.Declare(s, &c.OrderStore)
}

// atLeastMinusOne accepts -1 (none) and the positive numbers.
func atLeastMinusOne(n int) error {
	if n == 0 || n < -1 {
		return fmt.Errorf("must be -1 (no cap) or positive, got %d", n)
	}
	return nil
}

// run dispatches the command line. Results go to stdout as JSON.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "serve" {
		return serve(ctx, args[1:], getenv, stdout)
	}
	c := common{Kinds: tasks.Kinds()}
	s := config.NewSet("producer", getenv)
	declareCommon(s, &c)
	s.SetOutput(io.Discard)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			fmt.Fprint(stdout, usage(c.Kinds))
			s.WriteUsage(stdout)
			return nil
		}
		return err
	}
	rest := s.Args()
	if len(rest) == 0 {
		return errors.New("no command (run with -h for the list)")
	}
	if rest[0] == "serve" {
		// serve declares the shared settings too: hand it those given
		// before the command along with its own.
		given := args[:len(args)-len(rest)]
		return serve(ctx, append(slices.Clip(given), rest[1:]...), getenv, stdout)
	}
	if rest[0] == "acl" {
		return printACL(stdout, &c, rest[1:])
	}
	rdb := c.Redis.NewClient()
	defer rdb.Close()

	if cmd, ok := kindCommand(c.Kinds, rest[0]); ok {
		// Traced by the OTEL_* variables (off unless set), under the
		// trace of TRACEPARENT when a calling script passes one.
		tr, stopTracing, err := telemetry.Start(ctx, "orderworker-cli", getenv, nil)
		if err != nil {
			return err
		}
		defer stopTracing() // a span not exported loses nothing of the change
		if err := telemetry.InstrumentRedis(rdb, tr.Provider()); err != nil {
			return err
		}
		cfg := c.producerConfig()
		cfg.TracerProvider = tr.Provider()
		p, err := producer.New(rdb, cfg)
		if err != nil {
			return err
		}
		defer p.Close()
		r, err := cmd.run(tracing.ExtractEnv(ctx, getenv), p, rest[1:])
		if err != nil {
			return err
		}
		return printJSON(stdout, r)
	}
	switch rest[0] {
	case "shards":
		if len(rest) != 1 {
			return errors.New("shards: takes no arguments (set QUEUE_SHARDS)")
		}
		rep, err := checkShards(asynq.NewInspectorFromRedisClient(rdb), c.Shards, c.Kinds)
		if perr := printJSON(stdout, rep); perr != nil {
			return perr
		}
		return err
	case "order":
		store, err := orderstore.Open(rdb, c.Prefix, &c.OrderStore, orderstore.Hooks{}, nil)
		if err != nil {
			return err
		}
		defer store.Close()
		if len(rest) > 1 {
			if a, ok := orderops.ParseAction(rest[1]); ok {
				return orderAction(ctx, rdb, store.Store, &c, a, rest[2:], getenv, stdout)
			}
		}
		views, err := orderview.New(rdb, store.Store, orderview.Config{KeyPrefix: c.Prefix, GapWait: c.GapWait, Shards: c.Shards,
			Kinds: c.Kinds, BlockedAfter: c.BlockedAfter})
		if err != nil {
			return err
		}
		return order(ctx, store.Store, views, rest[1:], stdout)
	}
	return fmt.Errorf("unknown command %q (run with -h for the list)", rest[0])
}

// printACL prints the ACL rules of the process args names, on one line, for
// c's key prefix and order store. It needs no Redis.
func printACL(stdout io.Writer, c *common, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("acl: want one process (%s)", aclProcesses())
	}
	rules, err := acl.Rules(acl.Process(args[0]), acl.Options{KeyPrefix: c.Prefix, OrderAPI: c.OrderStore.Store == orderstore.HTTP})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, strings.Join(rules, " "))
	return err
}

func aclProcesses() string {
	var names []string
	for _, p := range acl.Processes() {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

// items collects repeated -item SKU=QTY flags.
type items []tasks.Item

func (it *items) String() string { return fmt.Sprint(*it) }
func (it *items) Set(v string) error {
	sku, qty, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(qty)
	if !ok || err != nil {
		return fmt.Errorf("%q: want SKU=QTY", v)
	}
	*it = append(*it, tasks.Item{SKU: sku, Qty: n})
	return nil
}

// optString is a string flag that knows whether it was given.
type optString struct{ p *string }

func (o *optString) String() string {
	if o.p == nil {
		return ""
	}
	return *o.p
}
func (o *optString) Set(v string) error { o.p = &v; return nil }

// parseCommand parses a command's flags, which may come before or after its
// one positional argument (the order number).
func parseCommand(fs *flag.FlagSet, args []string) (string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", fmt.Errorf("%s: %w", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != 1 {
		return "", fmt.Errorf("%s: want exactly one order number, got %d arguments", fs.Name(), len(pos))
	}
	return pos[0], nil
}

// enqueueCommand is the CLI command that enqueues a task of one kind,
// named by the kind.
type enqueueCommand struct {
	kind    *tasks.Kind
	flags   string // its flags, for the usage
	example string // an example of its -json, for the usage, or ""
	run     func(ctx context.Context, p *producer.Producer, args []string) (producer.Result, error)
}

// handFlags are the enqueue commands with flags for the fields of their
// kind's payload, by kind name. Any other kind's command takes its payload
// as JSON (see jsonCommand).
var handFlags = map[string]enqueueCommand{
	"modify":   {flags: "[-address A] [-remark R] [-item SKU=QTY]... [-event-id ID]", run: modify},
	"exchange": {flags: "-item SKU=QTY [-item SKU=QTY]... [-new-order-no N] [-reason R] [-event-id ID]", run: exchange},
}

// kindCommands returns the enqueue command of every kind of kinds (the
// CLI's, common.Kinds), in its order.
func kindCommands(kinds tasks.Table) []enqueueCommand {
	var out []enqueueCommand
	for _, k := range kinds {
		c, ok := handFlags[k.Name]
		if !ok {
			c = jsonCommand(k)
		}
		c.kind = k
		out = append(out, c)
	}
	return out
}

// kindCommand returns the enqueue command of kinds named name.
func kindCommand(kinds tasks.Table, name string) (enqueueCommand, bool) {
	for _, c := range kindCommands(kinds) {
		if c.kind.Name == name {
			return c, true
		}
	}
	return enqueueCommand{}, false
}

// jsonCommand is the enqueue command of kind k that takes the payload as
// JSON (-json), as the intake takes its body: order_no from the argument,
// and no seq.
func jsonCommand(k *tasks.Kind) enqueueCommand {
	return enqueueCommand{flags: "-json PAYLOAD [-event-id ID]", example: k.Example(),
		run: func(ctx context.Context, p *producer.Producer, args []string) (producer.Result, error) {
			fs := newEnqueueFlags(k.Name, "the payload's event_id, or a new UUID")
			body := fs.String("json", "{}", "the payload as JSON, without order_no")
			no, opts, err := fs.parse(args)
			if err != nil {
				return producer.Result{}, err
			}
			payload, err := k.Decode([]byte(*body))
			if err != nil {
				return producer.Result{}, fmt.Errorf("%s: -json: %w", k.Name, err)
			}
			h := payload.Header()
			h.OrderNo = no
			return p.Enqueue(ctx, payload.WithHeader(h), opts...)
		}}
}

// enqueueFlags are the flags of an enqueue command: its own, declared on
// the embedded FlagSet by the command, and -event-id, which every one of
// them takes.
type enqueueFlags struct {
	*flag.FlagSet
	eventID *string
}

// newEnqueueFlags returns the flags of the enqueue command name, with
// -event-id, whose default eventIDDefault describes.
func newEnqueueFlags(name, eventIDDefault string) enqueueFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return enqueueFlags{FlagSet: fs, eventID: fs.String("event-id", "", "idempotency key (default: "+eventIDDefault+")")}
}

// parse parses args as parseCommand does, and returns the order number and
// the producer options of -event-id (none when it is not given).
func (f enqueueFlags) parse(args []string) (string, []producer.Option, error) {
	no, err := parseCommand(f.FlagSet, args)
	if err != nil {
		return "", nil, err
	}
	var opts []producer.Option
	if *f.eventID != "" {
		opts = append(opts, producer.WithEventID(*f.eventID))
	}
	return no, opts, nil
}

func modify(ctx context.Context, p *producer.Producer, args []string) (producer.Result, error) {
	fs := newEnqueueFlags("modify", "a new UUID")
	var address, remark optString
	var its items
	fs.Var(&address, "address", "new delivery address")
	fs.Var(&remark, "remark", "new remark (empty clears it)")
	fs.Var(&its, "item", "SKU=QTY; repeat to replace the whole item list")
	no, opts, err := fs.parse(args)
	if err != nil {
		return producer.Result{}, err
	}
	return p.EnqueueModify(ctx, no, tasks.Changes{Address: address.p, Remark: remark.p, Items: its}, opts...)
}

func exchange(ctx context.Context, p *producer.Producer, args []string) (producer.Result, error) {
	fs := newEnqueueFlags("exchange", "a new UUID")
	var its items
	fs.Var(&its, "item", "SKU=QTY of the replacement order; repeat for more")
	newNo := fs.String("new-order-no", "", "the replacement's number (default: derived from the event)")
	reason := fs.String("reason", "", "why, for the history")
	no, opts, err := fs.parse(args)
	if err != nil {
		return producer.Result{}, err
	}
	if *newNo != "" {
		opts = append(opts, producer.WithNewOrderNo(*newNo))
	}
	if *reason != "" {
		opts = append(opts, producer.WithReason(*reason))
	}
	return p.EnqueueExchange(ctx, no, its, opts...)
}

func order(ctx context.Context, store orders.Store, views *orderview.Reader, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("order: want get, history, status, blocked or put")
	}
	switch args[0] {
	case "status":
		fs := flag.NewFlagSet("order status", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "print the status as JSON (the intake's GET /v1/orders/{order_no}/status)")
		no, err := parseCommand(fs, args[1:])
		if err != nil {
			return err
		}
		st, err := views.Status(ctx, no)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, st)
		}
		return printStatus(stdout, st)
	case "blocked":
		fs := flag.NewFlagSet("order blocked", flag.ContinueOnError)
		limit := fs.Int("limit", orderview.DefaultBlockedLimit, fmt.Sprintf("the most orders to list, 1 to %d", orderview.MaxBlockedLimit))
		reason := fs.String("reason", "", "only the orders blocked for this reason: "+strings.Join(orderview.Reasons(), ", "))
		asJSON := fs.Bool("json", false, "print the page as JSON (the intake's GET /v1/blocked-orders)")
		fs.SetOutput(io.Discard)
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("order blocked: %w", err)
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("order blocked: unexpected arguments %q", fs.Args())
		}
		page, err := views.Blocked(ctx, orderview.BlockedQuery{Limit: *limit, Reason: *reason})
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, page)
		}
		return printBlocked(stdout, page)
	case "get", "history":
		if len(args) != 2 {
			return fmt.Errorf("order %s: want one order number", args[0])
		}
		if args[0] == "get" {
			o, err := store.Get(ctx, args[1])
			if err != nil {
				return err
			}
			return printJSON(stdout, o)
		}
		// The whole history, page after page, as one answer.
		all := orderview.History{OrderNo: args[1]}
		q := orderview.HistoryQuery{Limit: orders.MaxHistoryPage}
		for {
			h, err := views.History(ctx, args[1], q)
			if err != nil {
				return err
			}
			all.Entries, all.Skipped = append(all.Entries, h.Entries...), h.Skipped
			if h.NextCursor == "" {
				break
			}
			q.Cursor = h.NextCursor
		}
		if all.Entries == nil {
			all.Entries = []orders.Entry{}
		}
		return printJSON(stdout, all)
	case "put":
		fs := flag.NewFlagSet("order put", flag.ContinueOnError)
		address := fs.String("address", "", "delivery address")
		remark := fs.String("remark", "", "remark")
		var its items
		fs.Var(&its, "item", "SKU=QTY; repeat for more")
		no, err := parseCommand(fs, args[1:])
		if err != nil {
			return err
		}
		if err := store.Put(ctx, orders.Order{No: no, Address: *address, Remark: *remark, Items: its}); err != nil {
			return err
		}
		o, err := store.Get(ctx, no)
		if err != nil {
			return err
		}
		return printJSON(stdout, o)
	}
	return fmt.Errorf("order: unknown subcommand %q (want get, history, status, blocked or put)", args[0])
}

// orderAction runs operator action a (orderops) with the command line's
// order number, reason and principal, and prints its result as JSON (with
// a "warning" when the action took effect but the index of held orders
// could not be written). The principal is marked as the command line's,
// "cli:<name>" (orderops.CLIPrincipal): it is not authenticated. With the
// Redis store, the action is also noted in the order's history.
func orderAction(ctx context.Context, rdb redis.UniversalClient, store orders.Store, c *common, a orderops.Action, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("order "+string(a), flag.ContinueOnError)
	reason := fs.String("reason", "", "why; required for skip and hold")
	by := fs.String("by", osUser(getenv), "who acts, recorded with the action as cli:<name>; defaults to the OS user")
	no, err := parseCommand(fs, args)
	if err != nil {
		return err
	}
	principal, err := orderops.CLIPrincipal(*by)
	if err != nil {
		return err
	}
	ops, err := orderops.New(rdb, orderops.Config{KeyPrefix: c.Prefix, Shards: c.Shards, Kinds: c.Kinds, Store: store})
	if err != nil {
		return err
	}
	defer ops.Close()
	res, err := ops.Do(ctx, a, orderops.Request{OrderNo: no, By: principal, Reason: *reason})
	if err != nil {
		return err
	}
	return printJSON(stdout, res)
}

// osUser is the user running the command, for an action's principal: USER,
// else LOGNAME, else the account's name; "" when none is known.
func osUser(getenv func(string) string) string {
	if u := cmp.Or(getenv("USER"), getenv("LOGNAME")); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

// printJSON writes v as indented JSON, with the control and format
// characters that encoding/json leaves as they are (U+202E, the C1
// controls) escaped (safetext.JSON): an order's text or a history entry's
// detail cannot rewrite or reorder the terminal.
func printJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(safetext.JSON(b.Bytes()))
	return err
}
