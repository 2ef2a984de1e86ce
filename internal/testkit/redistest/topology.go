package redistest

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/testkit/redisproc"
)

// This file gives tests the two topologies beyond one node, which package
// redisproc starts from redis-server on loopback ports:
//
//   - a Redis Cluster of 3 masters with one replica each ([NewCluster]);
//   - a Sentinel group of 1 master, 1 replica and 3 sentinels watching it
//     as redisproc.MasterName, quorum 2 ([NewSentinel],
//     [DedicatedSentinel]).
//
// [NewCluster] and [NewSentinel] share one cluster and one group per test
// binary, started by the first test that asks and stopped by [Main]. Both
// skip the test when redis-server is not on PATH, and fail it when the CI
// environment variable is set. TEST_REDIS_URL does not apply to them.

// requireServer skips the test when there is no redis-server binary, or
// fails it under CI.
func requireServer(tb testing.TB, what string) {
	tb.Helper()
	SkipShort(tb, what)
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("redistest: %s under CI: %v", what, redisproc.ErrNoServer)
		}
		tb.Skipf("needs a real %s from redis-server: %v", what, redisproc.ErrNoServer)
	}
}

// SkipShort skips the test under go test -short, the quick loop, when it
// needs what: a multi-process topology (a Cluster, a Sentinel group), a
// browser, or binaries built and run as processes. The README's full test
// command runs them all.
func SkipShort(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("-short: skips what needs %s", what)
	}
}

// ClusterStateReload is the slot map reload interval of a [ClusterDB]'s
// clients: redisconn.ClusterStateReload, which the binaries use (redistest
// cannot import redisconn, whose tests import redistest; a redisconn test
// checks that the two agree).
const ClusterStateReload = time.Second

// ClusterDB is one test's view of the package's shared [redisproc.Cluster]. A cluster
// has database 0 only, so tests on it are isolated by Prefix alone; keys
// without it (asynq's) must be cleaned by the test.
type ClusterDB struct {
	// Client is a cluster client seeded with every master, closed by
	// t.Cleanup.
	Client *redis.ClusterClient
	// Options are the options Client was made with.
	Options *redis.ClusterOptions
	// Prefix is unique to the test; keys under it are deleted at cleanup.
	Prefix string
	// Cluster is the cluster: the package's shared one (do not stop it or
	// kill its nodes) or, from DedicatedCluster, the test's own.
	Cluster *redisproc.Cluster
}

// URL returns the cluster's URL, for code that parses one itself.
func (db *ClusterDB) URL() string { return db.Cluster.URL() }

// NewClient returns one more cluster client, closed by t.Cleanup.
func (db *ClusterDB) NewClient(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	o := *db.Options
	o.Addrs = slices.Clone(o.Addrs)
	c := redis.NewClusterClient(&o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// topo holds the package's shared cluster and Sentinel group.
var topo struct {
	clusterOnce sync.Once
	cluster     *redisproc.Cluster
	clusterErr  error
	clusterUp   time.Duration

	sentinelOnce sync.Once
	sentinel     *redisproc.SentinelGroup
	sentinelErr  error
	sentinelUp   time.Duration

	mu     sync.Mutex
	nextDB int
}

// stopTopologies stops what NewCluster and NewSentinel started; Main calls
// it after the tests.
func stopTopologies() {
	if topo.cluster != nil {
		topo.cluster.Stop()
	}
	if topo.sentinel != nil {
		topo.sentinel.Stop()
	}
}

// NewCluster returns a client for this test on the package's shared
// cluster, which the first call starts (and logs how long that took). It
// skips the test without redis-server, fails it under CI then, and fails it
// when the cluster cannot start.
func NewCluster(tb testing.TB) *ClusterDB {
	tb.Helper()
	requireServer(tb, "Redis Cluster")
	topo.clusterOnce.Do(func() {
		start := time.Now()
		topo.cluster, topo.clusterErr = redisproc.StartCluster()
		topo.clusterUp = time.Since(start)
		if topo.clusterErr == nil {
			tb.Logf("redistest: cluster of %d masters and %d replicas up in %v", redisproc.ClusterMasters, redisproc.ClusterMasters, topo.clusterUp.Round(time.Millisecond))
		}
	})
	if topo.clusterErr != nil {
		tb.Fatalf("redistest: %v", topo.clusterErr)
	}
	db := clusterDB(tb, topo.cluster)
	tb.Cleanup(func() { deleteClusterPrefix(tb, db) })
	return db
}

// DedicatedCluster starts a cluster for this test alone, stopped by
// t.Cleanup, so that the test may kill its masters
// ([redisproc.Cluster.KillMaster]). It skips the test without
// redis-server, and fails it under CI then.
func DedicatedCluster(tb testing.TB) *ClusterDB {
	tb.Helper()
	requireServer(tb, "Redis Cluster")
	start := time.Now()
	c, err := redisproc.StartCluster()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Logf("redistest: dedicated cluster up in %v", time.Since(start).Round(time.Millisecond))
	tb.Cleanup(c.Stop)
	return clusterDB(tb, c)
}

func clusterDB(tb testing.TB, c *redisproc.Cluster) *ClusterDB {
	tb.Helper()
	db := &ClusterDB{
		// The reload interval the binaries use, so that a client follows a
		// killed master's replica as theirs do.
		Options: &redis.ClusterOptions{Addrs: c.Masters(), ContextTimeoutEnabled: true, ClusterStateReloadInterval: ClusterStateReload},
		Prefix:  prefix(tb),
		Cluster: c,
	}
	db.Client = db.NewClient(tb)
	return db
}

// deleteClusterPrefix removes the test's keys from every master.
func deleteClusterPrefix(tb testing.TB, db *ClusterDB) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: db.Cluster.Masters()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, db.Prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		_, err := n.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys { // one by one: they span slots
				p.Del(ctx, k)
			}
			return nil
		})
		return err
	})
	if err != nil {
		tb.Logf("redistest: cluster cleanup: %v", err)
	}
}

// --------------------------------------------------------------- Sentinel

// SentinelDB is one test's view of a [redisproc.SentinelGroup]: a database of its
// own, flushed before use.
type SentinelDB struct {
	// Client is a failover client for the test's database, closed by
	// t.Cleanup.
	Client *redis.Client
	// Options are the options Client was made with.
	Options *redis.FailoverOptions
	// DB is the test's database.
	DB int
	// Prefix is unique to the test.
	Prefix string
	// Group is the Sentinel group: the package's shared one (do not stop
	// it or fail it over) or, from DedicatedSentinel, the test's own.
	Group *redisproc.SentinelGroup
}

// URL returns the Sentinel URL of the test's database, for code that
// parses one itself.
func (db *SentinelDB) URL() string { return db.Group.URL(db.DB) }

// NewClient returns one more failover client for the test's database,
// closed by t.Cleanup.
func (db *SentinelDB) NewClient(tb testing.TB) *redis.Client {
	tb.Helper()
	o := *db.Options
	o.SentinelAddrs = slices.Clone(o.SentinelAddrs)
	c := redis.NewFailoverClient(&o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// NewSentinel returns a failover client for a database of this test's own
// on the package's shared Sentinel group, which the first call starts (and
// logs how long that took). A test that fails the master over should use
// [DedicatedSentinel] instead. It skips the test without redis-server, fails
// it under CI then, and fails it when the group cannot start.
func NewSentinel(tb testing.TB) *SentinelDB {
	tb.Helper()
	requireServer(tb, "Sentinel group")
	topo.sentinelOnce.Do(func() {
		start := time.Now()
		topo.sentinel, topo.sentinelErr = redisproc.StartSentinel()
		topo.sentinelUp = time.Since(start)
		if topo.sentinelErr == nil {
			tb.Logf("redistest: Sentinel group (1 master, 1 replica, 3 sentinels) up in %v", topo.sentinelUp.Round(time.Millisecond))
		}
	})
	if topo.sentinelErr != nil {
		tb.Fatalf("redistest: %v", topo.sentinelErr)
	}
	topo.mu.Lock()
	topo.nextDB = topo.nextDB%(databases-1) + 1
	n := topo.nextDB
	topo.mu.Unlock()
	return sentinelDB(tb, topo.sentinel, n)
}

// DedicatedSentinel starts a Sentinel group for this test alone, stopped by
// t.Cleanup, so that the test may fail it over, and returns a failover
// client for its database 1. It skips the test without redis-server, and
// fails it under CI then.
func DedicatedSentinel(tb testing.TB) *SentinelDB {
	tb.Helper()
	requireServer(tb, "Sentinel group")
	start := time.Now()
	g, err := redisproc.StartSentinel()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Logf("redistest: dedicated Sentinel group up in %v", time.Since(start).Round(time.Millisecond))
	tb.Cleanup(g.Stop)
	return sentinelDB(tb, g, 1)
}

func sentinelDB(tb testing.TB, g *redisproc.SentinelGroup, n int) *SentinelDB {
	tb.Helper()
	db := &SentinelDB{
		Options: &redis.FailoverOptions{
			MasterName:            redisproc.MasterName,
			SentinelAddrs:         g.Sentinels(),
			DB:                    n,
			ContextTimeoutEnabled: true,
		},
		DB:     n,
		Prefix: prefix(tb),
		Group:  g,
	}
	db.Client = db.NewClient(tb)
	if err := db.Client.FlushDB(tb.Context()).Err(); err != nil {
		tb.Fatalf("redistest: flush db %d: %v", n, err)
	}
	return db
}
