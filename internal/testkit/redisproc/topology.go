package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file starts the two topologies beyond one node, from redis-server on
// loopback ports, as child processes:
//
//   - a Redis Cluster of 3 masters with one replica each ([StartCluster]);
//   - a Sentinel group of 1 master, 1 replica and 3 sentinels watching it
//     as MasterName, quorum 2 ([StartSentinel]).

// MasterName is the name the sentinels of a [SentinelGroup] know the master
// by.
const MasterName = "mymaster"

// startTimeout bounds the start of a cluster or a Sentinel group.
const startTimeout = 60 * time.Second

// poll calls cond until it returns nil or ctx ends, and then returns the
// last error of cond with what was awaited.
func poll(ctx context.Context, what string, cond func(ctx context.Context) error) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redisproc: %s: %w (last: %w)", what, context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

func adminClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
}

// ---------------------------------------------------------------- Cluster

// ClusterMasters is the number of masters of a [Cluster]; each has one
// replica.
const ClusterMasters = 3

// Cluster is a Redis Cluster of 3 masters with one replica each, on
// loopback ports, with a node timeout of 2 s. Its methods are safe for
// concurrent use, except Stop.
//
// A shard is one of the 3 slot ranges with its two nodes. [Cluster.KillMaster]
// and [Cluster.Rejoin] make a shard's replica its master and bring the old
// master back as its replica, as a crash and a repair would.
type Cluster struct {
	nodes []*Process // first the masters of shards 0..2, then the replica of shard i at 3+i
	slots [][2]int   // the slot range of shard i

	mu     sync.Mutex
	master [ClusterMasters]int // index in nodes of shard i's master now

	promoted promotion
}

// StartCluster starts a cluster and waits until every node reports
// cluster_state:ok and sees every shard with its master and replica
// online, and every replica is in sync. It takes about 3–4 s. The caller
// stops it.
func StartCluster() (*Cluster, error) { return startCluster(0) }

// StartClusterBehind is [StartCluster] with the replicas' clocks behind the
// machine's (and the masters') by behind (see [StartBehind]): a failover
// promotes a master whose TIME is that far behind the old one's. It returns
// an error matching [ErrNoFaketime] when libfaketime or a C compiler is
// missing.
func StartClusterBehind(behind time.Duration) (*Cluster, error) {
	if behind <= 0 {
		return nil, fmt.Errorf("redisproc: replicas behind by %v", behind)
	}
	return startCluster(behind)
}

func startCluster(behind time.Duration) (*Cluster, error) {
	var replicaEnv []string
	if behind > 0 {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return nil, ErrNoServer
		}
		env, err := behindEnv(behind)
		if err != nil {
			return nil, err
		}
		replicaEnv = env
	}
	c := &Cluster{master: [ClusterMasters]int{0, 1, 2}}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	for n := range 2 * ClusterMasters {
		var env []string
		if n >= ClusterMasters {
			env = replicaEnv
		}
		p, err := startProcess(func(port int, dir string) []string {
			// The cluster bus on a free port of its own, not port+10000
			// (which may be taken, or past 65535).
			bus, err := freePort()
			if err != nil {
				bus = 0 // Redis's default, port+10000
			}
			return []string{
				"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--cluster-port", strconv.Itoa(bus),
				"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "redis.log",
				"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000",
				// Replicas sync at once, not after the default 5 s wait
				// for more replicas to share a diskless transfer.
				"--repl-diskless-sync-delay", "0",
				// A replica counts as online (CLUSTER SHARDS, SLOTS) once
				// its replication offset is not 0, that is after the
				// master's first write or ping to it (every 10 s by
				// default).
				"--repl-ping-replica-period", "1",
			}
		}, env)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	admin := make([]*redis.Client, len(c.nodes))
	for i, p := range c.nodes {
		admin[i] = adminClient(p.Addr())
		defer admin[i].Close()
	}
	ids := make([]string, len(c.nodes))
	for i, a := range admin {
		id, err := a.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return nil, fmt.Errorf("redisproc: cluster myid of %s: %w", c.nodes[i].Addr(), err)
		}
		ids[i] = id
		// Distinct epochs from the start, as redis-cli --cluster create
		// sets them, so that no collision has to be resolved.
		if err := a.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return nil, fmt.Errorf("redisproc: cluster set-config-epoch: %w", err)
		}
	}
	for i := range ClusterMasters {
		lo, hi := i*16384/ClusterMasters, (i+1)*16384/ClusterMasters-1
		c.slots = append(c.slots, [2]int{lo, hi})
		if err := admin[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return nil, fmt.Errorf("redisproc: cluster addslotsrange: %w", err)
		}
	}
	for _, p := range c.nodes[1:] {
		if err := admin[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", p.port, p.busPort()).Err(); err != nil {
			return nil, fmt.Errorf("redisproc: cluster meet: %w", err)
		}
	}
	err := poll(ctx, "cluster nodes meeting", func(ctx context.Context) error {
		for i, a := range admin {
			out, err := a.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != len(admin) || strings.Contains(out, "handshake") || strings.Contains(out, "noaddr") {
				return fmt.Errorf("node %d knows %d of %d nodes", i, len(lines), len(admin))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range ClusterMasters {
		if err := admin[ClusterMasters+i].ClusterReplicate(ctx, ids[i]).Err(); err != nil {
			return nil, fmt.Errorf("redisproc: cluster replicate: %w", err)
		}
	}
	err = poll(ctx, "cluster state ok", func(ctx context.Context) error {
		for i, a := range admin {
			info, err := a.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("node %d: cluster state not ok", i)
			}
			shards, err := a.ClusterShards(ctx).Result()
			if err != nil {
				return err
			}
			if len(shards) != ClusterMasters {
				return fmt.Errorf("node %d sees %d shards", i, len(shards))
			}
			for _, sh := range shards {
				if len(sh.Nodes) != 2 || len(sh.Slots) != 1 {
					return fmt.Errorf("node %d sees a shard of %d nodes, %d slot ranges", i, len(sh.Nodes), len(sh.Slots))
				}
				for _, n := range sh.Nodes {
					if n.Health != "online" {
						return fmt.Errorf("node %d sees %s %s", i, n.Endpoint, n.Health)
					}
				}
			}
		}
		for i := ClusterMasters; i < len(admin); i++ {
			info, err := admin[i].Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %d not in sync", i)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// Stop kills every node and removes their directories.
func (c *Cluster) Stop() {
	for _, p := range c.nodes {
		p.Stop()
	}
}

// SetUser runs ACL SETUSER name rules... on every node (ACLs are per
// node), for tests of what an ACL user may do.
func (c *Cluster) SetUser(ctx context.Context, name string, rules ...string) error {
	return setUser(ctx, c.nodes, name, rules)
}

func setUser(ctx context.Context, nodes []*Process, name string, rules []string) error {
	args := []any{"ACL", "SETUSER", name}
	for _, r := range rules {
		args = append(args, r)
	}
	for _, p := range nodes {
		c := adminClient(p.Addr())
		err := c.Do(ctx, args...).Err()
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("redisproc: acl setuser on %s: %w", p.Addr(), err)
		}
	}
	return nil
}

// Masters returns the masters' addresses, in slot order: after
// [Cluster.KillMaster], a shard's master is its former replica.
func (c *Cluster) Masters() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, ClusterMasters)
	for i, n := range c.master {
		out[i] = c.nodes[n].Addr()
	}
	return out
}

// URL returns a Cluster URL naming every node as a seed:
// redis://m1?addr=m2&…, the masters first. A client needs one seed that
// answers, so the URL stays good while any node of the cluster is up.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		addrs[i] = p.Addr()
	}
	return "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
}

// shardOf returns the shard whose slot range holds key's slot.
func (c *Cluster) shardOf(key string) int {
	s := Slot(key)
	for i, r := range c.slots {
		if s >= r[0] && s <= r[1] {
			return i
		}
	}
	panic("redisproc: slot not covered") // the ranges cover 0..16383
}

// MasterOf returns the address of the master that serves key's slot now.
func (c *Cluster) MasterOf(key string) string {
	return c.Masters()[c.shardOf(key)]
}

// ShardOf returns the shard (0, 1 or 2, the index in [Cluster.Masters])
// whose slot range holds key's slot. Shards keep their slots when their
// master changes.
func (c *Cluster) ShardOf(key string) int { return c.shardOf(key) }

// KillMaster kills the master of shard i with SIGKILL, as a crash would,
// and waits until its replica has taken over: every surviving node reports
// cluster_state:ok and names the replica as the shard's master. That takes
// about 3–4 s (the node timeout of 2 s, then an election). It returns the
// old and the new master's addresses. Writes the replica had not received
// are lost, as they would be in production.
//
// Until [Cluster.Rejoin] brings the old master back, the shard has no
// replica, and a second KillMaster of it leaves its slots unserved (it
// fails after ctx ends).
func (c *Cluster) KillMaster(ctx context.Context, i int) (old, cur string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	oldIdx := c.master[i]
	newIdx := (oldIdx + ClusterMasters) % (2 * ClusterMasters) // the shard's other node
	old, cur = c.nodes[oldIdx].Addr(), c.nodes[newIdx].Addr()
	c.nodes[oldIdx].Kill()
	lo := c.slots[i][0]
	err = poll(ctx, "replica of "+old+" taking over", func(ctx context.Context) error {
		return c.checkTakeover(ctx, lo, cur, nil) // the killed node no longer runs
	})
	if err != nil {
		return "", "", err
	}
	c.promoted.mark()
	c.master[i] = newIdx
	return old, cur, nil
}

// checkTakeover returns nil when every node that runs reports
// cluster_state:ok and names cur as the master of slot, and also (when not
// nil) returns nil for it.
func (c *Cluster) checkTakeover(ctx context.Context, slot int, cur string, also func(p *Process, a *redis.Client) error) error {
	for _, p := range c.nodes {
		if p.cmd == nil {
			continue
		}
		a := adminClient(p.Addr())
		err := c.checkMaster(ctx, a, slot, cur)
		if err == nil && also != nil {
			err = also(p, a)
		}
		_ = a.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", p.Addr(), err)
		}
	}
	return nil
}

// checkMaster returns nil when a reports cluster_state:ok and names want
// as the master of slot.
func (c *Cluster) checkMaster(ctx context.Context, a *redis.Client, slot int, want string) error {
	info, err := a.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return errors.New("cluster state not ok")
	}
	shards, err := a.ClusterShards(ctx).Result()
	if err != nil {
		return err
	}
	for _, sh := range shards {
		if len(sh.Slots) == 0 || sh.Slots[0].Start > int64(slot) || sh.Slots[0].End < int64(slot) {
			continue
		}
		for _, n := range sh.Nodes {
			if n.Role == "master" && n.Health == "online" {
				if addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)); addr != want {
					return fmt.Errorf("slot %d served by %s, not %s", slot, addr, want)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("slot %d not served", slot)
}

// Rejoin starts the node at addr again after [Cluster.KillMaster] killed
// it, and waits until it has rejoined as the replica of its shard's new
// master and is in sync (its nodes.conf tells it the cluster; the newer
// epoch of its former replica makes it a replica). It is a no-op for a
// node that runs.
func (c *Cluster) Rejoin(ctx context.Context, addr string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := slices.IndexFunc(c.nodes, func(p *Process) bool { return p.Addr() == addr })
	if idx < 0 {
		return fmt.Errorf("redisproc: rejoin: %s is no node of the cluster", addr)
	}
	p := c.nodes[idx]
	if p.cmd != nil {
		return nil
	}
	if err := p.Start(); err != nil {
		return err
	}
	a := adminClient(addr)
	defer a.Close()
	return poll(ctx, addr+" rejoining as a replica", func(ctx context.Context) error {
		info, err := a.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_link_status:up") {
			return errors.New("not a replica in sync yet")
		}
		return nil
	})
}

// OnEachMaster returns, for each master in the order of [Cluster.Masters],
// the first of name(0), name(1), … whose slot that master serves. Use it to
// pick test keys, or order numbers (an order number's slot is the slot of
// its keys, which carry it as the hash tag), that put work on every master,
// so that a script touching a key it was not passed in KEYS cannot pass by
// luck. It panics after 10 000 names without a hit, which for a name that
// varies with i does not happen.
func (c *Cluster) OnEachMaster(name func(i int) string) []string {
	out := make([]string, ClusterMasters)
	found := 0
	for i := 0; found < ClusterMasters; i++ {
		if i == 10_000 {
			panic("redisproc: OnEachMaster: names do not spread over the masters")
		}
		n := name(i)
		m := slices.Index(c.Masters(), c.MasterOf(n))
		if out[m] == "" {
			out[m] = n
			found++
		}
	}
	return out
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of the key, or of
// its hash tag (the text between the first { and the next }, when not
// empty), modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), which Redis
// Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// SentinelGroup is a master with one replica, watched by three sentinels as
// [MasterName] with quorum 2 and a down-after of 1 s. Its methods are safe
// for concurrent use, except Stop.
type SentinelGroup struct {
	data      []*Process // the first master, then its replica
	sentinels []*Process

	promoted promotion
}

// StartSentinel starts a Sentinel group with 128 databases and waits until
// every sentinel knows the master, the replica and the two other
// sentinels, so that a failover can be asked for at once. It takes about
// 5 s (the sentinels find each other through hello messages sent every
// 2 s). The caller stops it.
func StartSentinel() (*SentinelGroup, error) { return startSentinel(0) }

// StartSentinelBehind is [StartSentinel] with the replica's clock behind
// the machine's (and the master's) by behind (see [StartBehind]): a
// failover promotes a master whose TIME is that far behind the old one's.
// It returns an error matching [ErrNoFaketime] when libfaketime or a C
// compiler is missing.
func StartSentinelBehind(behind time.Duration) (*SentinelGroup, error) {
	if behind <= 0 {
		return nil, fmt.Errorf("redisproc: a replica behind by %v", behind)
	}
	return startSentinel(behind)
}

func startSentinel(behind time.Duration) (*SentinelGroup, error) {
	g := &SentinelGroup{}
	ok := false
	defer func() {
		if !ok {
			g.Stop()
		}
	}()
	// No 5 s wait for more replicas before a diskless sync, on either
	// node: the replica is the master after a failover.
	master, err := Start("--repl-diskless-sync-delay", "0")
	if err != nil {
		return nil, err
	}
	g.data = append(g.data, master)
	replicaArgs := []string{"--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", strconv.Itoa(master.port)}
	var replica *Process
	if behind > 0 {
		replica, err = StartBehind(behind, replicaArgs...)
	} else {
		replica, err = Start(replicaArgs...)
	}
	if err != nil {
		return nil, err
	}
	g.data = append(g.data, replica)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	// The replica must be attached before the sentinels start: they learn
	// of replicas from the master's INFO, which they read every 10 s.
	rc := adminClient(replica.Addr())
	defer rc.Close()
	err = poll(ctx, "replica in sync", func(ctx context.Context) error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("replica link not up")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for range 3 {
		s, err := startProcess(func(port int, dir string) []string {
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile redis.log\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %s 1000\n"+
				"sentinel failover-timeout %s 10000\n",
				port, dir, MasterName, master.port, MasterName, MasterName)
			// Start reports a failure to read it; sentinel rewrites it.
			_ = os.WriteFile(conf, []byte(text), 0o600)
			return []string{conf, "--sentinel"}
		}, nil)
		if err != nil {
			return nil, err
		}
		g.sentinels = append(g.sentinels, s)
	}
	err = poll(ctx, "sentinels ready", func(ctx context.Context) error {
		for _, s := range g.sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			m, err := sc.Master(ctx, MasterName).Result()
			if err == nil && (m["flags"] != "master" || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2") {
				err = fmt.Errorf("sentinel %s: flags %s, %s replicas, %s other sentinels",
					s.Addr(), m["flags"], m["num-slaves"], m["num-other-sentinels"])
			}
			if err == nil {
				var rs []map[string]string
				rs, err = sc.Replicas(ctx, MasterName).Result()
				if err == nil && (len(rs) != 1 || rs[0]["flags"] != "slave" || rs[0]["master-link-status"] != "ok") {
					err = fmt.Errorf("sentinel %s: replicas %v", s.Addr(), rs)
				}
			}
			_ = sc.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return g, nil
}

// Stop kills the sentinels and the data nodes and removes their
// directories.
func (g *SentinelGroup) Stop() {
	for _, p := range g.sentinels {
		p.Stop()
	}
	for _, p := range g.data {
		p.Stop()
	}
}

// SetUser runs ACL SETUSER name rules... on both data nodes, so that the
// user exists on whichever is master.
func (g *SentinelGroup) SetUser(ctx context.Context, name string, rules ...string) error {
	return setUser(ctx, g.data, name, rules)
}

// Sentinels returns the sentinels' addresses.
func (g *SentinelGroup) Sentinels() []string {
	out := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		out[i] = s.Addr()
	}
	return out
}

// Nodes returns the data nodes' addresses, the first master's first.
func (g *SentinelGroup) Nodes() []string {
	return []string{g.data[0].Addr(), g.data[1].Addr()}
}

// URL returns a Sentinel URL for database db:
// redis://s1/db?master_name=mymaster&addr=s2&addr=s3.
func (g *SentinelGroup) URL(db int) string {
	s := g.Sentinels()
	return fmt.Sprintf("redis://%s/%d?master_name=%s&addr=%s", s[0], db, MasterName, strings.Join(s[1:], "&addr="))
}

// Master returns the master's address as the first sentinel that answers
// says.
func (g *SentinelGroup) Master(ctx context.Context) (string, error) {
	var errs []error
	for _, s := range g.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		hp, err := sc.GetMasterAddrByName(ctx, MasterName).Result()
		_ = sc.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("redisproc: no sentinel names the master: %w", errors.Join(errs...))
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER) and waits
// until every sentinel names the other data node as master and that node
// says it is one. It returns the old and the new master's addresses.
//
// When it returns, the old master has not necessarily been turned into a
// replica yet: the sentinels do that some seconds later (they wait 8 s
// after it last reported its role). Until then it is a master that nobody
// should write to, and connections to it are not closed.
func (g *SentinelGroup) Failover(ctx context.Context) (old, cur string, err error) {
	old, err = g.Master(ctx)
	if err != nil {
		return "", "", err
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.sentinels[0].Addr(), MaxRetries: -1})
	defer sc.Close()
	if err := sc.Failover(ctx, MasterName).Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: sentinel failover: %w", err)
	}
	err = poll(ctx, "failover", func(ctx context.Context) error {
		cur = ""
		for _, s := range g.sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			hp, err := c.GetMasterAddrByName(ctx, MasterName).Result()
			_ = c.Close()
			if err != nil {
				return err
			}
			addr := net.JoinHostPort(hp[0], hp[1])
			switch {
			case addr == old:
				return fmt.Errorf("sentinel %s still names %s", s.Addr(), old)
			case cur != "" && addr != cur:
				return fmt.Errorf("sentinels disagree: %s and %s", cur, addr)
			}
			cur = addr
		}
		n := adminClient(cur)
		defer n.Close()
		role, err := n.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s is not master yet: %v", cur, role)
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	g.promoted.mark()
	return old, cur, nil
}

// busPort is the cluster bus port of a cluster node: its --cluster-port,
// or Redis's default, port+10000.
func (p *Process) busPort() int {
	for i, a := range p.args {
		if a == "--cluster-port" && i+1 < len(p.args) {
			if n, err := strconv.Atoi(p.args[i+1]); err == nil && n > 0 {
				return n
			}
		}
	}
	return p.port + 10000
}
