package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/tools/benchkit"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
)

// prefix is the key prefix of the run (KEY_PREFIX of the workers).
const prefix = "ow:"

// settings are the suite's flags (flags only: it reads no environment).
type settings struct {
	Tasks           int
	Orders          int
	Workers         int
	Concurrency     int
	Work            time.Duration
	SlowWork        time.Duration
	SlowConcurrency int
	ExchangesPerK   int
	LatePerK        int
	Clients         int
	GapWait         time.Duration
	Shards          tasks.Shards
	LockTTL         time.Duration
	ShutdownTimeout time.Duration
	Duration        time.Duration
	KillEvery       time.Duration
	Redis           string
	Store           string
	RedisRestart    bool
	FailoverSync    bool
	Lag             time.Duration
	Behind          time.Duration
	WaitReplicas    int
	PauseEvery      time.Duration
	PauseFor        time.Duration
	HotOrders       int
	HotChanges      int
	HotAt           time.Duration
	HotKills        int
	HotFreezes      int
	CutEvery        time.Duration
	CutFor          time.Duration
	IntakeCutEvery  time.Duration
	IntakeCutFor    time.Duration
	ResetEvery      time.Duration
	SlowEvery       time.Duration
	SlowFor         time.Duration
	SlowLink        time.Duration
	DrainTimeout    time.Duration
	Short           bool
	Keep            bool
	WorkerBin       string
	Seed            int
}

type vars struct {
	tasks, hotChanges               *config.Var[int]
	duration, killEvery, drainTime  *config.Var[time.Duration]
	cutEvery, resetEvery, slowEvery *config.Var[time.Duration]
	shards                          *config.Var[tasks.Shards]
}

func declare(s *config.Set, c *settings) vars {
	var v vars
	v.tasks = s.Int(&c.Tasks, "tasks", "", 20000, "tasks to enqueue, spread evenly over -duration").Check(config.Positive[int])
	s.Int(&c.Orders, "orders", "", 50, "orders the tasks go to (seeded with the store's Put)").Check(config.Positive[int])
	s.Int(&c.Workers, "workers", "", 4, "worker processes (built from cmd/worker)").Check(config.Positive[int])
	s.Int(&c.Concurrency, "concurrency", "", 20, "WORKER_CONCURRENCY of each worker").Check(config.Positive[int])
	s.Duration(&c.Work, "work", "", 2*time.Millisecond, "WORKER_SIMULATE_WORK: how long each task works inside its lock").Check(config.NonNegative[time.Duration])
	s.Duration(&c.SlowWork, "slow-work", "", 7*time.Second, "the first worker's simulated work during the chaos phase, longer than -lock-ttl so that its leases renew while it is killed and Redis restarts (it drains at the normal pace); 0 for none").Check(config.NonNegative[time.Duration])
	s.Int(&c.SlowConcurrency, "slow-concurrency", "", 2, "WORKER_CONCURRENCY of the slow first worker").Check(config.Positive[int])
	s.Int(&c.ExchangesPerK, "exchanges-per-1000", "", 10, "exchanges per 1000 tasks; the rest are modifies").Check(config.NonNegative[int])
	s.Int(&c.LatePerK, "late-per-1000", "", 5, "modifies per 1000 tasks sent to an order just exchanged (the worker rejects them, naming the replacement)").Check(config.NonNegative[int])
	s.Int(&c.Clients, "clients", "", 4, "upstream clients enqueueing at once, each one change after another, to shared orders").Check(config.Positive[int])
	s.Duration(&c.GapWait, "gap-wait", "", 5*time.Second, "GAP_WAIT of the workers").Check(config.Positive[time.Duration])
	v.shards = s.Shards(&c.Shards, "queue-shards", "", "QUEUE_SHARDS of the workers and the producer: "+config.ShardsForms+"; with -redis cluster, defaults to 3 (a shard of each task type on each master)")
	s.Duration(&c.LockTTL, "lock-ttl", "", 5*time.Second, "LOCK_TTL of the workers").Check(config.Positive[time.Duration])
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "", 3*time.Second, "SHUTDOWN_TIMEOUT of the workers (they are stopped with SIGTERM at the end)").Check(config.Positive[time.Duration])
	v.duration = s.Duration(&c.Duration, "duration", "", 90*time.Second, "how long the tasks are enqueued and the workers killed").Check(config.Positive[time.Duration])
	v.killEvery = s.Duration(&c.KillEvery, "kill-every", "", 3*time.Second, "SIGKILL one worker (and start it again) this often; 0 for never").Check(config.NonNegative[time.Duration])
	s.Duration(&c.PauseEvery, "pause-every", "", 10*time.Second, "also freeze one worker (SIGSTOP) this often, for -pause-for, then SIGCONT it: a stall past the lock's lease (the fencing case); 0 for never").Check(config.NonNegative[time.Duration])
	s.Duration(&c.PauseFor, "pause-for", "", 0, "how long a frozen worker stays frozen; defaults to -lock-ttl + 2s").Check(config.NonNegative[time.Duration])
	s.Int(&c.HotOrders, "hot-orders", "", 3, "the hot-order phase: orders of their own flooded with -hot-changes changes each during the chaos phase, so that workers drain them in holds of the lock, while the phase kills and freezes their holders mid-hold; 0 for no phase").Check(config.NonNegative[int])
	v.hotChanges = s.Int(&c.HotChanges, "hot-changes", "", 1000, "changes flooded to each hot order, back to back from two clients per order").Check(config.Positive[int])
	s.Duration(&c.HotAt, "hot-at", "", 0, "when the flood of the hot orders starts, into the chaos phase; defaults to a second before the first Redis switch (a third of -duration without one)").Check(config.NonNegative[time.Duration])
	s.Int(&c.HotKills, "hot-kills", "", 2, "hot-order phase: SIGKILL (and start again) this many workers in the middle of a hold of a hot order; the kills after the first wait for the first Redis switch").Check(config.NonNegative[int])
	s.Int(&c.HotFreezes, "hot-freezes", "", 1, "hot-order phase: freeze this many workers (SIGSTOP for -pause-for, past the lock's lease) in the middle of a hold of a hot order").Check(config.NonNegative[int])
	v.cutEvery = s.Duration(&c.CutEvery, "cut-every", "", 15*time.Second, "nemesis (-redis single): blackhole one worker's Redis link (a TCP proxy before each worker) this often, for -cut-for, then heal it, delivering what it held; 0 for never").Check(config.NonNegative[time.Duration])
	s.Duration(&c.IntakeCutEvery, "intake-cut-every", "", 10*time.Second, "nemesis (-redis single): blackhole the acceptance's Redis link (the suite's producer, which the intake runs, through a TCP proxy) this often, for -intake-cut-for, then heal it, delivering what it held, and reset its connections half-way between two cuts; each change is sent again with its event ID until accepted or answered as a duplicate, as an upstream retries with its Idempotency-Key; 0 for never").Check(config.NonNegative[time.Duration])
	s.Duration(&c.IntakeCutFor, "intake-cut-for", "", 7*time.Second, "how long an acceptance cut lasts: past the suite's 5 s acceptance timeout, so that an acceptance given up on is delivered at the heal").Check(config.Positive[time.Duration])
	s.Duration(&c.CutFor, "cut-for", "", 0, "how long a cut lasts; defaults to 2.5 × -lock-ttl (past the lock's lease; give 35s to pass asynq's 30 s lease as well)").Check(config.NonNegative[time.Duration])
	v.resetEvery = s.Duration(&c.ResetEvery, "reset-every", "", 4*time.Second, "nemesis (-redis single): reset every connection of one worker's Redis link this often; 0 for never").Check(config.NonNegative[time.Duration])
	v.slowEvery = s.Duration(&c.SlowEvery, "slow-every", "", 20*time.Second, "nemesis (-redis single): slow one worker's Redis link by -slow-link, both ways, for -slow-for, this often; 0 for never").Check(config.NonNegative[time.Duration])
	s.Duration(&c.SlowFor, "slow-for", "", 5*time.Second, "how long a slow spell lasts").Check(config.Positive[time.Duration])
	s.Duration(&c.SlowLink, "slow-link", "", 300*time.Millisecond, "the latency a slow spell adds to each chunk").Check(config.NonNegative[time.Duration])
	s.String(&c.Redis, "redis", "", redisSingle, "the Redis the workers run on: single (one redis-server with an fsync'd AOF), sentinel (1 master, 1 replica, 3 sentinels) or cluster (3 masters with a replica each)").Check(config.OneOf(redisSingle, redisSentinel, redisCluster))
	s.Bool(&c.RedisRestart, "redis-restart", "", true, "inject the failure of -redis in the chaos phase: single restarts Redis (SIGKILL, then start on its AOF) half-way through -duration; sentinel fails the master over at a third and at two thirds; cluster fails one shard's master over gracefully (CLUSTER FAILOVER) at a third and SIGKILLs another's at two thirds, which then rejoins as replica")
	s.Bool(&c.FailoverSync, "failover-sync", "", true, "sentinel and cluster: before a SENTINEL FAILOVER or a master's SIGKILL, pause the master's writes (CLIENT PAUSE WRITE) until its replica has them all, so that the switch loses no acknowledged write; false for the raw switch, whose losses in the asynchronous-replication window the checks then report like any other")
	s.Duration(&c.Lag, "lag", "", 0, "nemesis (-redis sentinel or cluster): each switch is a SIGKILL of a master after its replica's link was cut for this long, so that the promoted replica lacks the lag's writes (0: the switches of -failover-sync); on a cluster, the two switches are on two shards; the checks then hold with -wait-replicas 1, and report the lag's losses without it").Check(config.NonNegative[time.Duration])
	s.Duration(&c.Behind, "behind", "", 0, "nemesis (-redis sentinel or cluster): the replicas' clocks run this far behind the machine's (libfaketime; Debian package faketime, and cc), so that the first switch promotes a master whose TIME is behind the fences and positions handed out before; 0: none").Check(config.NonNegative[time.Duration])
	s.String(&c.Store, "store", "", storeRedis, "the workers' order store: redis (on the workers' Redis, failing over with it) or http (the reference upstream order API, served in process on loopback over a Redis of its own that outlives the switches; the history checker also reads the API's log; with the network nemeses each worker reaches it through a proxy, cut, reset and slowed with its Redis link)").Check(config.OneOf(storeRedis, storeHTTP))
	s.Int(&c.WaitReplicas, "wait-replicas", "", 0, "WAIT_REPLICAS of the producer and the workers: replicas that must confirm an acceptance, and an order's state before each write to the store (-redis sentinel or cluster)").Check(config.NonNegative[int])
	v.drainTime = s.Duration(&c.DrainTimeout, "drain-timeout", "", 5*time.Minute, "give up waiting for the queues to drain after this long (asynq re-delivers a killed worker's tasks a minute or two after their lease expired)").Check(config.Positive[time.Duration])
	s.Bool(&c.Short, "short", "", false, "the CI configuration: 3000 tasks over 25 s, kills every 3 s, freezes every 10 s, 400 changes to each hot order, 150 s drain limit (flags given explicitly win)")
	s.Bool(&c.Keep, "keep", "", false, "keep the directory with the workers' logs and Redis's files even when the run passes")
	s.String(&c.WorkerBin, "worker-bin", "", "", "use this worker binary instead of building cmd/worker")
	s.Int(&c.Seed, "seed", "", 0, "seed of the task mix and the kills; 0 for a random one (printed)")
	return v
}

// applyShort gives the settings that were not set explicitly their -short
// values.
func (v vars) applyShort(c *settings) {
	if v.tasks.Source() == config.FromDefault {
		c.Tasks = 3000
	}
	if v.duration.Source() == config.FromDefault {
		c.Duration = 25 * time.Second
	}
	if v.killEvery.Source() == config.FromDefault {
		c.KillEvery = 3 * time.Second
	}
	if v.drainTime.Source() == config.FromDefault {
		c.DrainTimeout = 150 * time.Second
	}
	if v.hotChanges.Source() == config.FromDefault {
		c.HotChanges = 400
	}
}

// applyTopology gives the settings that depend on -redis and were not set
// explicitly their values for it: with a cluster, 3 queue shards, so that
// the queues spread over the masters.
func (v vars) applyTopology(c *settings) {
	if c.Redis == redisCluster && v.shards.Source() == config.FromDefault {
		c.Shards = tasks.Shards{Count: 3}
	}
}

// run is the suite. It returns an error for a violation (after printing
// the figures) and for a run that could not be carried out.
func run(ctx context.Context, args []string, out io.Writer) (err error) {
	var c settings
	s := config.NewSet("stress", nil)
	v := declare(s, &c)
	if err := s.Parse(args); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil
		}
		return err
	}
	if c.Short {
		v.applyShort(&c)
	}
	v.applyTopology(&c)
	if c.PauseFor == 0 {
		c.PauseFor = c.LockTTL + 2*time.Second
	}
	if c.CutFor == 0 {
		c.CutFor = c.LockTTL * 5 / 2
	}
	if c.Seed == 0 {
		c.Seed = int(time.Now().UnixNano() % 1_000_000)
	}
	started := time.Now()

	dir, err := os.MkdirTemp("", "orderworker-stress-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil || c.Keep {
			fmt.Fprintf(out, "\nlogs and Redis files kept in %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	bin := c.WorkerBin
	if bin == "" {
		fmt.Fprintf(out, "building %s ...\n", benchkit.WorkerPackage)
		if bin, err = benchkit.BuildWorker(ctx, dir); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "starting Redis (%s) ...\n", c.Redis)
	be, err := startBackend(c, dir)
	if err != nil {
		return err
	}
	defer be.stop()
	// The same constructor as the workers', on the same URL; a few more
	// retries ride out the Redis restart or failovers.
	ropts, err := redisconn.Parse(withQuery(be.url, "max_retries=5"))
	if err != nil {
		return err
	}
	rdb := ropts.NewClient()
	defer rdb.Close()
	// The orders: the Redis store's on the workers' Redis, or the
	// upstream's, seeded through its API.
	var (
		store     orders.Store
		seedStore orders.Store
		ordersRDB redis.UniversalClient = rdb
		up        *upstream
	)
	if store, err = redisstore.New(rdb, redisstore.Config{Prefix: prefix}); err != nil {
		return err
	}
	nemeses := c.CutEvery > 0 || c.ResetEvery > 0 || c.SlowEvery > 0
	seedStore = store
	if c.Store == storeHTTP {
		if up, err = startUpstream(dir, c.Workers, nemeses); err != nil {
			return err
		}
		defer func() {
			if cerr := up.close(); cerr != nil {
				fmt.Fprintf(out, "note: %v\n", cerr)
			}
		}()
		store, seedStore, ordersRDB = up.store, up.client, up.rdb
	}
	// The acceptance's link: through a proxy of its own when cut.
	prodRDB := rdb
	var intake *links
	if c.IntakeCutEvery > 0 && c.Redis == redisSingle {
		if intake, err = newLinks(be.url, 1); err != nil {
			return err
		}
		defer intake.close()
		popts, err := redisconn.Parse(withQuery(intake.url(be.url, 0), "max_retries=5"))
		if err != nil {
			return err
		}
		prodClient := popts.NewClient()
		defer prodClient.Close()
		prodRDB = prodClient
	}
	prod, err := producer.New(prodRDB, producer.Config{KeyPrefix: prefix, Shards: c.Shards, WaitReplicas: c.WaitReplicas})
	if err != nil {
		return err
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)

	fmt.Fprintf(out, "stress: %d tasks (%d exchanges and %d late modifies per 1000) from %d clients over %d orders in %v; %d workers × %d, work %v",
		c.Tasks, c.ExchangesPerK, c.LatePerK, c.Clients, c.Orders, c.Duration, c.Workers, c.Concurrency, c.Work)
	if c.SlowWork > 0 {
		fmt.Fprintf(out, " (worker 0: × %d, work %v)", c.SlowConcurrency, c.SlowWork)
	}
	fmt.Fprintf(out, "; QUEUE_SHARDS %s; LOCK_TTL %v; kill every %v", c.Shards, c.LockTTL, c.KillEvery)
	if c.PauseEvery > 0 {
		fmt.Fprintf(out, "; freeze a worker for %v every %v", c.PauseFor, c.PauseEvery)
	}
	fmt.Fprintf(out, "; seed %d\n", c.Seed)
	fmt.Fprintf(out, "redis %s: %s; logs in %s\n", c.Redis, be.describe, dir)
	if up != nil {
		fmt.Fprintf(out, "order store http: %s\n", up.describe())
	}
	for _, sw := range be.switches {
		fmt.Fprintf(out, "redis chaos at %v: %s\n", sw.at.Round(time.Second), sw.name)
	}
	if len(be.switches) == 0 {
		fmt.Fprintln(out, "redis chaos: none (-redis-restart=false)")
	}

	l := newLoad(prod, c)
	l.hot = hotOrderNos(c.HotOrders, be.cluster)
	if be.cluster != nil {
		orders, queues := placement(be.cluster, l.seeded(), c.Shards)
		fmt.Fprintf(out, "cluster: seeded orders per shard %v, order queues per shard %v\n", orders, queues)
		if err := requireEveryShard(orders); err != nil {
			return err
		}
		if len(l.hot) > 0 {
			hotOrders, _ := placement(be.cluster, l.hot, c.Shards)
			fmt.Fprintf(out, "cluster: hot orders %v per shard %v\n", l.hot, hotOrders)
		}
	}
	if err := l.seed(ctx, seedStore); err != nil {
		return err
	}
	pool := &workerPool{bin: bin, dir: dir, env: workerEnv(be.url, c), c: c}
	var ls *links
	if nemeses && c.Redis == redisSingle {
		if ls, err = newLinks(be.url, c.Workers); err != nil {
			return err
		}
		defer ls.close()
		pool.url = func(slot int) string { return ls.url(be.url, slot) }
	}
	if up != nil {
		pool.extraEnv = up.env
		if nemeses && ls == nil {
			ls = &links{n: c.Workers}
		}
		if ls != nil {
			ls.api = up.proxies
		}
	}
	if ls != nil {
		ls.trouble = &pool.trouble
		var what []string
		if ls.proxies != nil {
			what = append(what, "Redis link")
		}
		if ls.api != nil {
			what = append(what, "order API link")
		}
		fmt.Fprintf(out, "nemeses: each worker's %s through a proxy; cut one worker's for %v every %v, reset one's every %v, slow one's by %v for %v every %v (0: never)\n",
			strings.Join(what, " and "), c.CutFor, c.CutEvery, c.ResetEvery, c.SlowLink, c.SlowFor, c.SlowEvery)
	}
	if err := pool.startAll(); err != nil {
		return err
	}
	defer pool.killAll()

	// The chaos phase: enqueue while killing workers and restarting Redis,
	// with the hot-order phase's flood and kills mid-hold inside it.
	ch := &chaos{pool: pool, switches: be.switches, c: c, out: out}
	chaosDone := make(chan error, 1)
	cctx, stopChaos := context.WithCancel(ctx)
	l.start = time.Now()
	go func() { chaosDone <- ch.run(ctx, cctx, c.Seed) }()
	nemesesDone := make(chan struct{})
	go func() {
		defer close(nemesesDone)
		var wg sync.WaitGroup
		defer wg.Wait()
		if intake != nil {
			wg.Go(func() { intake.cutAcceptance(cctx, c.IntakeCutEvery, c.IntakeCutFor) })
		}
		if ls != nil {
			runNemeses(cctx, ls, c, c.Seed)
		}
	}()
	var hp *hot
	hotDone := make(chan error, 1)
	if len(l.hot) > 0 {
		hp = newHot(c, l.hot, pool, insp, be.switches, out)
		go func() { hotDone <- hp.run(ctx, l, c.Clients) }()
	} else {
		hotDone <- nil
	}
	loadErr := l.run(ctx, c.Duration)
	stopChaos()
	<-nemesesDone // every link healed
	if cerr := <-chaosDone; cerr != nil {
		return fmt.Errorf("chaos: %w", cerr)
	}
	// The hot phase ends by itself (its flood enqueued, its kills and
	// freezes made): before calmDown restarts the slow worker.
	if herr := <-hotDone; herr != nil {
		return fmt.Errorf("hot orders: %w", herr)
	}
	if loadErr != nil {
		return fmt.Errorf("enqueue: %w", loadErr)
	}
	fmt.Fprintf(out, "enqueued %d tasks (%d modifies, %d exchanges) in %v; %d worker kills, %d worker freezes, %d redis switches\n",
		len(l.tasks), l.count(taskModify), l.count(taskExchange), time.Since(started).Round(time.Second), ch.kills, ch.pauses, len(ch.switched))
	if ls != nil {
		cuts, resets, slows := ls.counts()
		fmt.Fprintf(out, "nemeses: %d links cut for %v, %d reset, %d slowed\n", cuts, c.CutFor, resets, slows)
	}
	if intake != nil {
		cuts, resets, _ := intake.counts()
		fmt.Fprintf(out, "acceptance:    its Redis link cut %d times for %v and reset %d times; %d changes sent again after a failed acceptance, %d of them answered as a duplicate (accepted by an attempt given up on)\n",
			cuts, c.IntakeCutFor, resets, l.resent.Load(), l.resentDup.Load())
	}

	if err := pool.calmDown(); err != nil {
		fmt.Fprintf(out, "note: %v\n", err)
	}
	drainStart := time.Now()
	drained, derr := drain(ctx, insp, c.DrainTimeout, out)
	if derr != nil {
		return derr
	}
	drainTook := time.Since(drainStart)
	if err := pool.stopAll(); err != nil {
		fmt.Fprintf(out, "note: %v\n", err)
	}

	seq, err := orderkeys.Sequencer(rdb, prefix, orderkeys.Use{})
	if err != nil {
		return err
	}
	res, err := check(ctx, rdb, ordersRDB, store, seq, insp, l)
	if err != nil {
		return err
	}
	if up != nil {
		if res.api, err = checkLog(ctx, up.api.Log(), up, res.nos); err != nil {
			return err
		}
	}
	res.drained, res.drainTook = drained, drainTook
	res.crashes = pool.crashed()
	res.redis = c.Redis
	res.lossy = c.Lag > 0 || (c.Redis != redisSingle && !c.FailoverSync)
	res.switched = ch.switched
	if be.cluster != nil {
		res.placement, _ = placement(be.cluster, res.nos, c.Shards)
	}
	if hp != nil {
		accepted := make(map[string]time.Time, len(l.tasks))
		for _, t := range l.tasks {
			accepted[t.EventID] = l.start.Add(t.At)
		}
		if res.hot, err = hp.report(dir, ch.switched, accepted); err != nil {
			return err
		}
	}
	res.print(out, time.Since(started), 20)
	if n := res.violations(); n > 0 {
		if f, ferr := os.Create(filepath.Join(dir, "report.txt")); ferr == nil {
			res.print(f, time.Since(started), -1)
			_ = f.Close()
		}
		return fmt.Errorf("%d violations (seed %d; worker logs in %s)", n, c.Seed, dir)
	}
	return nil
}

// workerArgs are the command-line arguments of every worker process. The
// ops server listens on a free loopback port, since four workers cannot
// share :9090 (the checks read the store and the Inspector, not /metrics).
var workerArgs = []string{"-ops-addr", "127.0.0.1:0"}

// workerEnv is the environment of every worker process.
func workerEnv(url string, c settings) []string {
	return []string{
		"REDIS_URL=" + url,
		"KEY_PREFIX=" + prefix,
		"LOG_FORMAT=json",
		"LOG_LEVEL=info",
		"LOCK_TTL=" + c.LockTTL.String(),
		"SHUTDOWN_TIMEOUT=" + c.ShutdownTimeout.String(),
		"GAP_WAIT=" + c.GapWait.String(),
		"QUEUE_SHARDS=" + c.Shards.String(),
		"WAIT_REPLICAS=" + strconv.Itoa(c.WaitReplicas),
	}
}
