package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// The topologies of -redis.
const (
	redisSingle   = "single"
	redisSentinel = "sentinel"
	redisCluster  = "cluster"
)

// backend is the Redis the suite runs on, and the failures its chaos phase
// injects into it.
type backend struct {
	url      string // REDIS_URL of the workers and of the suite's own client
	describe string // for the header
	switches []redisSwitch
	stop     func()
	cluster  *redisproc.Cluster // -redis cluster only
}

// redisSwitch is one failure of Redis in the chaos phase.
type redisSwitch struct {
	at   time.Duration // into the chaos phase
	name string        // what it does, for the output
	// do carries it out and returns what happened (the old and the new
	// master) and how long the switch took (until the new master served).
	do func(ctx context.Context) (detail string, took time.Duration, err error)
	// promoted returns when the last switch saw its new master serve
	// (redisproc's Promoted, or the restart's end).
	promoted func() time.Time
}

// switched is a switch as it ran.
type switched struct {
	name, detail string
	began        time.Duration // into the chaos phase
	took         time.Duration
	served       time.Time // when the new master (or the restarted one) served
}

func (s switched) String() string {
	return fmt.Sprintf("%s: %s, switched in %v", s.name, s.detail, s.took.Round(time.Millisecond))
}

// startBackend starts the Redis of c.Redis. Its files (one node's AOF and
// log) are copied into dir when it stops.
func startBackend(c settings, dir string) (*backend, error) {
	switch c.Redis {
	case redisSentinel:
		return startSentinel(c)
	case redisCluster:
		return startCluster(c)
	default:
		return startSingle(c, dir)
	}
}

func startSingle(c settings, dir string) (*backend, error) {
	srv, err := redisproc.Start("--appendonly", "yes", "--appendfsync", "always")
	if err != nil {
		return nil, err
	}
	b := &backend{
		url:      srv.URL(),
		describe: fmt.Sprintf("redis-server on %s with appendonly yes, appendfsync always", srv.Addr()),
		stop: func() {
			// Keep Redis's log and AOF with the workers' logs.
			_ = os.CopyFS(filepath.Join(dir, "redis"), os.DirFS(srv.Dir()))
			srv.Stop()
		},
	}
	if c.RedisRestart {
		var up time.Time
		b.switches = append(b.switches, redisSwitch{
			at:   c.Duration / 2,
			name: "redis restart (SIGKILL, then up again on its AOF)",
			do: func(context.Context) (string, time.Duration, error) {
				at := time.Now()
				err := srv.Restart()
				up = time.Now()
				return srv.Addr(), up.Sub(at), err
			},
			promoted: func() time.Time { return up },
		})
	}
	return b, nil
}

func startSentinel(c settings) (*backend, error) {
	start, behind := redisproc.StartSentinel, ""
	if c.Behind > 0 {
		start = func() (*redisproc.SentinelGroup, error) { return redisproc.StartSentinelBehind(c.Behind) }
		behind = fmt.Sprintf(", its clock %v behind", c.Behind)
	}
	g, err := start()
	if err != nil {
		return nil, err
	}
	b := &backend{
		url: g.URL(0),
		describe: fmt.Sprintf("Sentinel group: master %s, replica %s%s (no persistence), sentinels %s",
			g.Nodes()[0], g.Nodes()[1], behind, strings.Join(g.Sentinels(), " ")),
		stop: g.Stop,
	}
	if !c.RedisRestart {
		return b, nil
	}
	name := "SENTINEL FAILOVER in sync (the master's writes paused until its replica had them all; the old master made its replica at once)"
	do := func(ctx context.Context) (string, time.Duration, error) {
		at := time.Now()
		old, cur, err := g.FailoverInSync(ctx)
		return old + " → " + cur, time.Since(at), err
	}
	if c.Lag > 0 {
		name = fmt.Sprintf("SIGKILL of the master after its replica's link was cut for %v (the sentinels promote the replica, which lacks the lag's writes)", c.Lag)
		do = func(ctx context.Context) (string, time.Duration, error) {
			at := time.Now()
			old, cur, err := g.FailoverAfterLag(ctx, c.Lag)
			return old + " → " + cur, time.Since(at) - c.Lag, err
		}
	} else if !c.FailoverSync {
		name = "SENTINEL FAILOVER (raw: the writes of the replication window may be lost), once the replica is in sync"
		do = func(ctx context.Context) (string, time.Duration, error) {
			// Not before the sentinels made the old master a replica:
			// promoting it earlier loses every write in between.
			at := time.Now()
			old, cur, waited, err := g.FailoverWhenReady(ctx)
			return fmt.Sprintf("%s → %s (after %v waiting for the replica)", old, cur, waited.Round(time.Millisecond)), time.Since(at) - waited, err
		}
	}
	for i := 1; i <= 2; i++ {
		b.switches = append(b.switches, redisSwitch{at: c.Duration * time.Duration(i) / 3, name: name, do: do, promoted: g.Promoted})
	}
	return b, nil
}

func startCluster(c settings) (*backend, error) {
	start, behind := redisproc.StartCluster, ""
	if c.Behind > 0 {
		start = func() (*redisproc.Cluster, error) { return redisproc.StartClusterBehind(c.Behind) }
		behind = fmt.Sprintf(", their clocks %v behind", c.Behind)
	}
	cl, err := start()
	if err != nil {
		return nil, err
	}
	b := &backend{
		url: cl.URL(),
		describe: fmt.Sprintf("Redis Cluster: masters %s, one replica each%s (no persistence)",
			strings.Join(cl.Masters(), " "), behind),
		stop:    cl.Stop,
		cluster: cl,
	}
	if !c.RedisRestart {
		return b, nil
	}
	// A graceful switch of one shard, then a crash of another shard's
	// master, which comes back as its replica.
	graceful, crashed := c.Seed%redisproc.ClusterMasters, (c.Seed+1)%redisproc.ClusterMasters
	if c.Lag > 0 {
		// Both switches lose the lag, on two shards.
		for n, shard := range []int{graceful, crashed} {
			b.switches = append(b.switches, redisSwitch{
				at:   c.Duration * time.Duration(n+1) / 3,
				name: fmt.Sprintf("SIGKILL of the master of shard %d after its replica's link was cut for %v (the cluster elects the replica, which lacks the lag's writes; the old master rejoins empty as its replica)", shard, c.Lag),
				do: func(ctx context.Context) (string, time.Duration, error) {
					at := time.Now()
					old, cur, err := cl.FailoverAfterLag(ctx, shard, c.Lag)
					return old + " → " + cur + " (" + old + " back as its replica, in sync)", time.Since(at) - c.Lag, err
				},
				promoted: cl.Promoted,
			})
		}
		return b, nil
	}
	kill, how := cl.KillMaster, "raw: the writes of the replication window may be lost"
	if c.FailoverSync {
		kill, how = cl.KillMasterInSync, "in sync: its writes paused until its replica had them all"
	}
	b.switches = []redisSwitch{{
		at:   c.Duration / 3,
		name: fmt.Sprintf("CLUSTER FAILOVER of shard %d (graceful)", graceful),
		do: func(ctx context.Context) (string, time.Duration, error) {
			at := time.Now()
			old, cur, err := cl.Failover(ctx, graceful)
			return old + " → " + cur, time.Since(at), err
		},
		promoted: cl.Promoted,
	}, {
		at:   c.Duration * 2 / 3,
		name: fmt.Sprintf("SIGKILL of the master of shard %d (%s), then it rejoins", crashed, how),
		do: func(ctx context.Context) (string, time.Duration, error) {
			at := time.Now()
			old, cur, err := kill(ctx, crashed)
			took := time.Since(at)
			if err != nil {
				return "", took, err
			}
			at = time.Now()
			if err := cl.Rejoin(ctx, old); err != nil {
				return "", took, err
			}
			return fmt.Sprintf("%s → %s; %s back as its replica, in sync, %v later", old, cur, old, time.Since(at).Round(time.Millisecond)), took, nil
		},
		promoted: cl.Promoted,
	}}
	return b, nil
}

// placement counts, for each shard of a cluster, the orders and the order
// queues whose keys it serves (an order's keys carry its number as the hash
// tag, a queue's its name).
func placement(cl *redisproc.Cluster, nos []string, shards tasks.Shards) (orders, queues []int) {
	orders = make([]int, redisproc.ClusterMasters)
	queues = make([]int, redisproc.ClusterMasters)
	for _, no := range nos {
		orders[cl.ShardOf(prefix+"order:{"+no+"}")]++
	}
	for _, q := range shards.AllQueues(tasks.Kinds()) {
		queues[cl.ShardOf(asynqredis.QueueKey(q))]++
	}
	return orders, queues
}

// requireEveryShard returns an error when a shard serves no order: the
// cluster run must put work on every master.
func requireEveryShard(orders []int) error {
	if slices.Contains(orders, 0) {
		return fmt.Errorf("the orders do not reach every master (orders per shard: %v); change -orders", orders)
	}
	return nil
}

// withQuery adds a query parameter to a Redis URL.
func withQuery(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}
