package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// warned returns the warnings warnReplicas logs for rdb and want.
func warned(t *testing.T, rdb redis.UniversalClient, want int) []observer.LoggedEntry {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	warnReplicas(ctx, rdb, want, zap.New(core))
	return logs.All()
}

func TestWarnReplicasAboveTheReplicas(t *testing.T) {
	master := redistest.Dedicated(t)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()

	t.Run("no replica", func(t *testing.T) {
		logs := warned(t, mc, 1)
		require.Len(t, logs, 1)
		require.Equal(t, zap.WarnLevel, logs[0].Level)
		require.Contains(t, logs[0].Message, "WAIT_REPLICAS is above the replicas")
		fields := logs[0].ContextMap()
		require.EqualValues(t, 1, fields["wait_replicas"])
		require.Equal(t, []any{"master: 0"}, fields["connected_replicas"])
	})
	t.Run("0 is not checked", func(t *testing.T) {
		require.Empty(t, warned(t, mc, 0))
	})

	redistest.Dedicated(t, "--replicaof", "127.0.0.1", strconv.Itoa(addrPort(t, master.Addr())))
	require.Eventually(t, func() bool {
		info, err := mc.Info(t.Context(), "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1")
	}, 30*time.Second, 20*time.Millisecond)
	t.Run("one replica, WAIT_REPLICAS=1", func(t *testing.T) {
		require.Empty(t, warned(t, mc, 1))
	})
	t.Run("one replica, WAIT_REPLICAS=2", func(t *testing.T) {
		logs := warned(t, mc, 2)
		require.Len(t, logs, 1)
		require.Equal(t, []any{"master: 1"}, logs[0].ContextMap()["connected_replicas"])
	})
	t.Run("INFO refused", func(t *testing.T) {
		require.NoError(t, mc.Do(t.Context(), "ACL", "SETUSER", "noinfo", "on", ">pw", "+@all", "-info", "~*").Err())
		c := redis.NewClient(&redis.Options{Addr: master.Addr(), Username: "noinfo", Password: "pw"})
		defer c.Close()
		logs := warned(t, c, 1)
		require.Len(t, logs, 1)
		require.Equal(t, zap.InfoLevel, logs[0].Level, "an ACL'd worker is told, not warned")
		require.Contains(t, logs[0].Message, "not checked")
	})
}

// The worker logs it at start, before it takes tasks.
func TestWorkerWarnsOfWaitReplicasAtStart(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": "off", "WAIT_REPLICAS": "1"}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	var logs lockedBuffer
	go func() { done <- runLogTo(ctx, nil, func(k string) string { return env[k] }, &logs) }()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "worker started") }, 30*time.Second, 20*time.Millisecond)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	out := logs.String()
	i := strings.Index(out, "WAIT_REPLICAS is above the replicas")
	require.GreaterOrEqual(t, i, 0, out)
	require.Less(t, i, strings.Index(out, "worker started"), "warned before the first task")
	require.Contains(t, out, "master: 0")
}

// On a Cluster each master is read: one replica each, so 2 is above all
// three.
func TestWarnReplicasOnEachClusterMaster(t *testing.T) {
	db := redistest.NewCluster(t)
	require.Empty(t, warned(t, db.Client, 1))
	logs := warned(t, db.Client, 2)
	require.Len(t, logs, 1)
	short, _ := logs[0].ContextMap()["connected_replicas"].([]any)
	require.Len(t, short, 3, "every master named: %v", short)
	for _, s := range short {
		require.True(t, strings.HasSuffix(s.(string), ": 1"), "%v", s)
	}
}

func addrPort(t *testing.T, addr string) int {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	p, err := strconv.Atoi(addr[i+1:])
	require.NoError(t, err)
	return p
}
