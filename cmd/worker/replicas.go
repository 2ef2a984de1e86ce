package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// masterReplicas reads, from INFO replication, how many replicas each
// master of rdb has connected (connected_slaves): on a Cluster each
// master's, by address; on one Redis or a Sentinel group the master's,
// under the key "master". It needs INFO, which the worker's ACL rule does
// not give (@dangerous): an error then, wrapped, as for a master that does
// not answer. It is safe for concurrent use.
func masterReplicas(ctx context.Context, rdb redis.UniversalClient) (map[string]int, error) {
	read := func(ctx context.Context, c redis.Cmdable, name string) (int, error) {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil {
			var n int
			if n, err = connectedReplicas(info); err == nil {
				return n, nil
			}
		}
		return 0, fmt.Errorf("INFO replication on %s: %w", name, err)
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		n, err := read(ctx, rdb, "master")
		if err != nil {
			return nil, err
		}
		return map[string]int{"master": n}, nil
	}
	var mu sync.Mutex // ForEachMaster calls fn concurrently
	out := map[string]int{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := read(ctx, m, m.Options().Addr)
		if err != nil {
			return err
		}
		mu.Lock()
		out[m.Options().Addr] = n
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// connectedReplicas is the connected_slaves of an INFO replication reply.
func connectedReplicas(info string) (int, error) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no connected_slaves in %q", info)
}

// warnReplicas logs, at start, a warning when WAIT_REPLICAS (want, above
// 0) is above the replicas a master of rdb has connected: until it is met,
// every write to the order store waits WAIT_TIMEOUT and the run ends
// unconfirmed. A master whose replica is rejoining after a failover is
// short for a while too. When INFO cannot be read (the worker's ACL rule
// does not give it) it says so at info level and checks nothing.
func warnReplicas(ctx context.Context, rdb redis.UniversalClient, want int, log *zap.Logger) {
	if want <= 0 {
		return
	}
	found, err := masterReplicas(ctx, rdb)
	if err != nil {
		log.Info("WAIT_REPLICAS not checked against the replicas (INFO replication refused or unanswered)", zap.Int("wait_replicas", want), zap.Error(err))
		return
	}
	var short []string
	for addr, n := range found {
		if n < want {
			short = append(short, addr+": "+strconv.Itoa(n))
		}
	}
	if len(short) == 0 {
		return
	}
	slices.Sort(short)
	log.Warn("WAIT_REPLICAS is above the replicas a master has connected: every write to the order store on it ends unconfirmed until it is met",
		zap.Int("wait_replicas", want), zap.Strings("connected_replicas", short))
}
