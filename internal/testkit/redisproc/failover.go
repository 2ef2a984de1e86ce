package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file holds the switches of a master that lose no acknowledged write,
// as an operator's planned maintenance would do them: Redis replicates
// asynchronously, so a plain crash or SENTINEL FAILOVER can lose the writes
// a replica had not received yet (see docs/scaling.md, "What a failover
// can lose"). Each of these first stops the master's writes and waits until its
// replica has every one.

// quiescePause bounds how long a master's writes stay paused by
// [pauseUntilInSync]: the switch that follows lifts or outlives it.
const quiescePause = 30 * time.Second

// pauseUntilInSync pauses the writes of master (CLIENT PAUSE WRITE, for
// [quiescePause]) and waits until replica's replication offset has reached
// the master's, that is until the replica holds every write the master
// acknowledged. Reads go on; a write sent meanwhile waits in the master
// unexecuted (and is dropped if the master dies or its client goes away).
// The master sends no replication pings while its writes are paused, so its
// offset stays put.
func pauseUntilInSync(ctx context.Context, master, replica *redis.Client) error {
	if err := master.Do(ctx, "CLIENT", "PAUSE", quiescePause.Milliseconds(), "WRITE").Err(); err != nil {
		return fmt.Errorf("redisproc: client pause write: %w", err)
	}
	return poll(ctx, "replica catching up with the paused master", func(ctx context.Context) error {
		m, err := replOffset(ctx, master, "master_repl_offset")
		if err != nil {
			return err
		}
		r, err := replOffset(ctx, replica, "slave_repl_offset")
		if err != nil {
			return err
		}
		if r < m {
			return fmt.Errorf("replica at offset %d, master at %d", r, m)
		}
		return nil
	})
}

// replOffset reads one offset field of INFO replication.
func replOffset(ctx context.Context, c *redis.Client, field string) (int64, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in INFO replication", field)
}

// inSyncReplica returns nil when a is a replica whose link to its master is
// up.
func inSyncReplica(ctx context.Context, a *redis.Client) error {
	info, err := a.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_link_status:up") {
		return errors.New("not a replica in sync yet")
	}
	return nil
}

// Failover makes the replica of shard i its master with CLUSTER FAILOVER
// (without FORCE), the switch an operator plans: the replica has the master
// pause its clients, catches up with its replication stream and only then
// takes over, so that no acknowledged write is lost. It waits until every
// node reports cluster_state:ok and names the replica as the shard's master,
// and the old master is its replica, in sync. It returns the old and the new
// master's addresses. Clients see MOVED for the shard's slots, and the writes
// paused meanwhile fail over to the new master. A failover that does not
// happen within 6 s (the masters refuse to vote for a shard switched less
// than 4 s ago) is asked for again, until ctx ends.
func (c *Cluster) Failover(ctx context.Context, i int) (old, cur string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	oldIdx := c.master[i]
	newIdx := (oldIdx + ClusterMasters) % (2 * ClusterMasters)
	old, cur = c.nodes[oldIdx].Addr(), c.nodes[newIdx].Addr()
	r := adminClient(cur)
	defer r.Close()
	var asked time.Time
	lo := c.slots[i][0]
	err = poll(ctx, cur+" taking over from "+old, func(ctx context.Context) error {
		// A manual failover gives up after 5 s, and the masters refuse
		// to vote for a replica of the same master again within twice
		// the node timeout (4 s): ask again while it has not happened.
		if time.Since(asked) > 6*time.Second {
			if err := r.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
				return fmt.Errorf("cluster failover on %s: %w", cur, err)
			}
			asked = time.Now()
		}
		return c.checkTakeover(ctx, lo, cur, func(p *Process, a *redis.Client) error {
			if p.Addr() == old {
				return inSyncReplica(ctx, a)
			}
			return nil
		})
	})
	if err != nil {
		return "", "", err
	}
	c.promoted.mark()
	c.master[i] = newIdx
	return old, cur, nil
}

// KillMasterInSync is [Cluster.KillMaster] once the shard's replica holds
// every write its master acknowledged: it pauses the master's writes (CLIENT
// PAUSE WRITE), waits until the replica's offset has reached the master's,
// and then kills the master with SIGKILL. The clients see a crash (their
// connections drop, the shard's slots are unserved for the node timeout and
// an election, a write waiting in the pause is never executed), but the
// new master has every acknowledged write. The shard needs a replica in
// sync (after KillMaster, [Cluster.Rejoin] first).
func (c *Cluster) KillMasterInSync(ctx context.Context, i int) (old, cur string, err error) {
	c.mu.Lock()
	oldIdx := c.master[i]
	newIdx := (oldIdx + ClusterMasters) % (2 * ClusterMasters)
	m, r := adminClient(c.nodes[oldIdx].Addr()), adminClient(c.nodes[newIdx].Addr())
	c.mu.Unlock()
	defer m.Close()
	defer r.Close()
	if err := pauseUntilInSync(ctx, m, r); err != nil {
		_ = m.Do(context.WithoutCancel(ctx), "CLIENT", "UNPAUSE").Err()
		return "", "", err
	}
	return c.KillMaster(ctx, i)
}

// FailoverInSync is [SentinelGroup.Failover] as an operator plans it, losing
// no acknowledged write. SENTINEL FAILOVER alone promotes the replica
// without stopping the master, which keeps accepting the writes of clients
// not yet switched until the sentinels demote it (8 s or more later), and
// those writes are lost. FailoverInSync therefore pauses the master's writes
// (CLIENT PAUSE WRITE) until the replica holds all of them, asks for the
// failover (again while a sentinel answers NOGOODSLAVE or INPROG, for up to
// 20 s), makes the old master the new one's replica at once (REPLICAOF, as
// the sentinels would later) and waits until it is in sync, and only then
// lifts the pause: a write that waited in it is refused (READONLY) and the
// client retries it on the new master. It returns the old and the new
// master's addresses.
func (g *SentinelGroup) FailoverInSync(ctx context.Context) (old, cur string, err error) {
	old, err = g.Master(ctx)
	if err != nil {
		return "", "", err
	}
	replica := g.data[0].Addr()
	if replica == old {
		replica = g.data[1].Addr()
	}
	m, r := adminClient(old), adminClient(replica)
	defer m.Close()
	defer r.Close()
	defer func() { _ = m.Do(context.WithoutCancel(ctx), "CLIENT", "UNPAUSE").Err() }()
	if err := pauseUntilInSync(ctx, m, r); err != nil {
		return "", "", err
	}
	if _, cur, err = g.failoverRetrying(ctx); err != nil {
		return "", "", err
	}
	host, port, err := net.SplitHostPort(cur)
	if err != nil {
		return "", "", fmt.Errorf("redisproc: new master %q: %w", cur, err)
	}
	if err := m.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: replicaof on the old master %s: %w", old, err)
	}
	err = poll(ctx, old+" replicating "+cur, func(ctx context.Context) error { return inSyncReplica(ctx, m) })
	if err != nil {
		return "", "", err
	}
	return old, cur, nil
}

// failoverRetrying is [SentinelGroup.Failover], asked again while a
// sentinel answers NOGOODSLAVE (it has not seen the replica healthy
// recently enough, as after a switch) or INPROG, for up to 20 s.
func (g *SentinelGroup) failoverRetrying(ctx context.Context) (old, cur string, err error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		old, cur, err = g.Failover(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil ||
			!(strings.Contains(err.Error(), "NOGOODSLAVE") || strings.Contains(err.Error(), "INPROG")) {
			return old, cur, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// FailoverWhenReady is the plain [SentinelGroup.Failover], which may lose
// the writes of the asynchronous-replication window, made only once the
// data node that is not the master replicates it, in sync, and asked again
// while the sentinels find no good replica (see failoverRetrying). After a
// Failover the sentinels turn the old master into a replica only some
// seconds later (they wait 8 s after it last reported its role); a second
// Failover before that promotes a node that never received the writes made
// in between, and all of them are lost. It returns the old and the new
// master's addresses and how long it waited for the replica.
func (g *SentinelGroup) FailoverWhenReady(ctx context.Context) (old, cur string, waited time.Duration, err error) {
	start := time.Now()
	err = poll(ctx, "the replica in sync", func(ctx context.Context) error {
		cur, err := g.Master(ctx)
		if err != nil {
			return err
		}
		replica := g.data[0].Addr()
		if replica == cur {
			replica = g.data[1].Addr()
		}
		r := adminClient(replica)
		defer r.Close()
		info, err := r.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		host, port, _ := net.SplitHostPort(cur)
		if !strings.Contains(info, "master_host:"+host+"\r\nmaster_port:"+port+"\r\n") {
			return fmt.Errorf("%s does not replicate %s yet", replica, cur)
		}
		return inSyncReplica(ctx, r)
	})
	waited = time.Since(start)
	if err != nil {
		return "", "", waited, err
	}
	old, cur, err = g.failoverRetrying(ctx)
	return old, cur, waited, err
}

// FailoverAfterLag is the failover that loses writes: the replica's link to
// the master is cut for lag (the replica is pointed at a closed port, so it
// keeps what it had and gets nothing more), while the master goes on
// acknowledging writes; then the master is SIGKILLed, the replica pointed
// back at it, and the sentinels promote the replica (their
// down-after-milliseconds is 1 s), which never received the writes of the
// lag. Once every sentinel names the new master, the old one starts again
// empty, as the new one's replica, and FailoverAfterLag waits until it is in
// sync, so that a WAIT for one replica can be met again. It returns the old
// and the new master's addresses.
func (g *SentinelGroup) FailoverAfterLag(ctx context.Context, lag time.Duration) (old, cur string, err error) {
	old, err = g.Master(ctx)
	if err != nil {
		return "", "", err
	}
	oldProc, replica := g.data[0], g.data[1]
	if replica.Addr() == old {
		oldProc, replica = replica, oldProc
	}
	r := adminClient(replica.Addr())
	defer r.Close()
	closed, err := freePort()
	if err != nil {
		return "", "", err
	}
	if err := r.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(closed)).Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: cut the replica's link: %w", err)
	}
	select {
	case <-ctx.Done():
		return "", "", ctx.Err()
	case <-time.After(lag): // the lag itself, not a wait for a state
	}
	oldProc.Kill()
	host, port, err := net.SplitHostPort(old)
	if err != nil {
		return "", "", fmt.Errorf("redisproc: master %q: %w", old, err)
	}
	if err := r.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: point the replica back at the dead master: %w", err)
	}
	err = poll(ctx, "the sentinels promoting "+replica.Addr(), func(ctx context.Context) error {
		for _, s := range g.sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			hp, err := c.GetMasterAddrByName(ctx, MasterName).Result()
			_ = c.Close()
			if err != nil {
				return err
			}
			if a := net.JoinHostPort(hp[0], hp[1]); a != replica.Addr() {
				return fmt.Errorf("sentinel %s names %s", s.Addr(), a)
			}
		}
		info, err := r.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return errors.New("not a master yet")
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	g.promoted.mark()
	cur = replica.Addr()
	ch, cp, _ := net.SplitHostPort(cur)
	if err := oldProc.StartWith("--replicaof", ch, cp); err != nil {
		return "", "", fmt.Errorf("redisproc: start the old master again as a replica: %w", err)
	}
	m := adminClient(old)
	defer m.Close()
	err = poll(ctx, old+" replicating "+cur, func(ctx context.Context) error { return inSyncReplica(ctx, m) })
	if err != nil {
		return "", "", err
	}
	return old, cur, nil
}

// lagAuth is the password a replica is given as masterauth to cut its
// link: its master's default user has none, so the AUTH of every
// handshake fails and the replica cannot resync.
const lagAuth = "redisproc-lag-nemesis"

// FailoverAfterLag is the crash of shard i's master that loses writes, as
// [SentinelGroup.FailoverAfterLag] is on Sentinel: the replica's link to
// its master is cut for lag while the master goes on acknowledging writes;
// then the master is SIGKILLed, the cluster elects the replica (which
// never received the writes of the lag) after the node timeout, and the
// old master starts again, empty (no persistence), from its nodes.conf,
// rejoins as the new master's replica and catches up with it, so that a
// WAIT for one replica can be met again. It waits until every node
// reports cluster_state:ok and names the replica as the shard's master,
// and the old master is its replica, in sync. It returns the old and the
// new master's addresses.
//
// A cluster replica refuses REPLICAOF, and a replica frozen with SIGSTOP
// loses nothing (the kernel's socket buffers keep the stream), so the link
// is cut by making the replica's handshake fail: its masterauth is set to
// a password its master does not have, and its link is closed (CLIENT
// KILL TYPE master), so it keeps what it had and gets nothing more. The
// replica's masterauth is cleared once its master is dead, and its
// cluster-replica-validity-factor set to 0, so that the data age of the
// lag does not keep it from the election. The shard needs a replica in
// sync (after [Cluster.KillMaster], [Cluster.Rejoin] first).
func (c *Cluster) FailoverAfterLag(ctx context.Context, i int, lag time.Duration) (old, cur string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	oldIdx := c.master[i]
	newIdx := (oldIdx + ClusterMasters) % (2 * ClusterMasters)
	oldProc := c.nodes[oldIdx]
	old, cur = oldProc.Addr(), c.nodes[newIdx].Addr()
	r := adminClient(cur)
	defer r.Close()
	if err := r.ConfigSet(ctx, "cluster-replica-validity-factor", "0").Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: validity factor on %s: %w", cur, err)
	}
	if err := r.ConfigSet(ctx, "masterauth", lagAuth).Err(); err != nil {
		return "", "", fmt.Errorf("redisproc: cut the replica's link: %w", err)
	}
	restore := func() error { return r.ConfigSet(context.WithoutCancel(ctx), "masterauth", "").Err() }
	if err := r.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		_ = restore()
		return "", "", fmt.Errorf("redisproc: close the replica's link: %w", err)
	}
	err = poll(ctx, "the replica's link down", func(ctx context.Context) error {
		info, err := r.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if strings.Contains(info, "master_link_status:up") {
			return errors.New("link still up")
		}
		return nil
	})
	if err != nil {
		_ = restore()
		return "", "", err
	}
	select {
	case <-ctx.Done():
		_ = restore()
		return "", "", ctx.Err()
	case <-time.After(lag): // the lag itself, not a wait for a state
	}
	oldProc.Kill()
	if err := restore(); err != nil {
		return "", "", fmt.Errorf("redisproc: restore the replica's masterauth: %w", err)
	}
	lo := c.slots[i][0]
	err = poll(ctx, cur+" elected in place of "+old, func(ctx context.Context) error {
		return c.checkTakeover(ctx, lo, cur, nil) // the killed node no longer runs
	})
	if err != nil {
		return "", "", err
	}
	c.promoted.mark()
	c.master[i] = newIdx
	if err := oldProc.Start(); err != nil {
		return "", "", fmt.Errorf("redisproc: start the old master again: %w", err)
	}
	err = poll(ctx, old+" rejoining as the replica of "+cur, func(ctx context.Context) error {
		return c.checkTakeover(ctx, lo, cur, func(p *Process, a *redis.Client) error {
			if p.Addr() == old {
				return inSyncReplica(ctx, a)
			}
			return nil
		})
	})
	if err != nil {
		return "", "", err
	}
	return old, cur, nil
}

// promotion is the instant the last switch of a [Cluster] or a
// [SentinelGroup] saw its new master serve. It is safe for concurrent use.
type promotion struct{ at atomic.Int64 } // UnixNano, 0 before any switch

func (p *promotion) mark() { p.at.Store(time.Now().UnixNano()) }

func (p *promotion) get() time.Time {
	if n := p.at.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Promoted returns when the last switch made by the cluster's methods
// ([Cluster.Failover], [Cluster.KillMaster], [Cluster.KillMasterInSync],
// [Cluster.FailoverAfterLag]) saw its new master serve: every running node
// reporting cluster_state:ok and naming it as the shard's master, at most a
// poll (20 ms) and one round of reads later. It is the zero time before any
// switch, and may be read while a switch runs.
func (c *Cluster) Promoted() time.Time { return c.promoted.get() }

// Promoted returns when the last switch made by the group's methods
// ([SentinelGroup.Failover], [SentinelGroup.FailoverInSync],
// [SentinelGroup.FailoverWhenReady], [SentinelGroup.FailoverAfterLag]) saw
// its new master serve: every sentinel naming it and it reporting the
// master's role, at most a poll (20 ms) and one round of reads later. It
// is the zero time before any switch, and may be read while a switch runs.
func (g *SentinelGroup) Promoted() time.Time { return g.promoted.get() }
