package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// TestWorkerStartsWhileAClusterMasterFailsOver starts the worker while the
// master that serves its notice channel's slot is dead and its replica not
// yet elected (about 3 s): the start-up check asks again until the new
// master answers, where it used to exit on the first refused dial (found by
// tools/stress -redis cluster, a worker restarted in the switch).
func TestWorkerStartsWhileAClusterMasterFailsOver(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	shard := db.Cluster.ShardOf(db.Prefix + "lock:released")
	dead := db.Cluster.Masters()[shard]
	killed := make(chan error, 1)
	go func() {
		_, _, err := db.Cluster.KillMaster(ctx, shard)
		killed <- err
	}()
	// Wait until the master is gone (KillMaster kills it at once, then
	// waits for the election).
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", dead)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 10*time.Second, 5*time.Millisecond)

	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": "off", "LOG_LEVEL": "info"}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var logs lockedBuffer
	go func() { done <- runLogTo(runCtx, nil, func(k string) string { return env[k] }, &logs) }()
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
			return strings.Contains(logs.String(), "worker started")
		}
	}, 30*time.Second, 20*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the worker exited at start: %v\n%s", err, logs.String())
	default:
	}
	require.NoError(t, <-killed)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func TestCheckUntil(t *testing.T) {
	refused := errors.New("dial tcp: connection refused")
	t.Run("asks again until Redis answers", func(t *testing.T) {
		calls := 0
		err := checkUntil(t.Context(), 10*time.Second, func(context.Context) error {
			if calls++; calls < 3 {
				return refused
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, calls)
	})
	t.Run("a refusal is final", func(t *testing.T) {
		calls := 0
		err := checkUntil(t.Context(), 10*time.Second, func(context.Context) error {
			calls++
			return keyorder.ErrNoNotices
		})
		require.ErrorIs(t, err, keyorder.ErrNoNotices)
		require.Equal(t, 1, calls)
	})
	t.Run("gives up after the limit with the last error", func(t *testing.T) {
		err := checkUntil(t.Context(), 200*time.Millisecond, func(context.Context) error { return refused })
		require.ErrorIs(t, err, refused)
	})
}
