// Package replwait confirms that a Redis master's replicas have its writes
// (Redis WAIT), for the producer's WAIT_REPLICAS and the engine's
// (keyorder.RunnerConfig.WaitReplicas).
//
// WAIT counts the writes of the connection it runs on, and a pooled client
// gives no such connection; so [Confirm] writes a marker key in each
// name's slot and WAITs behind it in one pipeline, on one connection of
// that slot's master: Redis replicates a master's writes in the order it
// made them, so a replica that has the marker has every write made there
// before it.
package replwait

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrShort is matched by the error of [Confirm] and [Check] when fewer
// replicas than asked acknowledged in time.
var ErrShort = errors.New("replwait: too few replicas acknowledged")

// MarkerTTL is how long a marker key is kept.
const MarkerTTL = time.Minute

// Confirm returns nil once n replicas have every write made so far on the
// masters of markers' slots (each marker a key, written with [MarkerTTL]),
// each WAIT bounded by timeout; at once when n is 0 or markers is empty.
// On a ClusterClient it WAITs once per master; on another client, one
// marker will do. It returns an error matching [ErrShort] when fewer
// replicas acknowledged, and Redis's error when a call failed. It is safe
// for concurrent use.
func Confirm(ctx context.Context, rdb redis.UniversalClient, markers []string, n int, timeout time.Duration) error {
	if n == 0 || len(markers) == 0 {
		return nil
	}
	type node struct {
		c    redis.Cmdable
		keys []string
	}
	var nodes []node
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		byAddr := map[string]int{}
		for _, k := range markers {
			m, err := cc.MasterForKey(ctx, k)
			if err != nil {
				return err
			}
			addr := m.Options().Addr
			if i, ok := byAddr[addr]; ok {
				nodes[i].keys = append(nodes[i].keys, k)
				continue
			}
			byAddr[addr] = len(nodes)
			nodes = append(nodes, node{m, []string{k}})
		}
	} else {
		nodes = []node{{rdb, markers[:1]}} // one master: one marker will do
	}
	for _, nd := range nodes {
		var wait *redis.Cmd
		_, err := nd.c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, k := range nd.keys {
				pipe.Set(ctx, k, "1", MarkerTTL)
			}
			wait = Do(ctx, pipe, n, timeout)
			return nil
		})
		if err != nil {
			return err
		}
		if err := Check(wait, n, timeout); err != nil {
			return err
		}
	}
	return nil
}

// Do queues WAIT n timeout on pipe, for a caller whose own writes ride in
// the same pipeline; [Check] reads its answer.
func Do(ctx context.Context, pipe redis.Pipeliner, n int, timeout time.Duration) *redis.Cmd {
	return pipe.Do(ctx, "WAIT", n, timeout.Milliseconds())
}

// Check returns nil when wait, a WAIT that ran, was acknowledged by n
// replicas, an error matching [ErrShort] when by fewer, and Redis's error
// when it failed.
func Check(wait *redis.Cmd, n int, timeout time.Duration) error {
	got, err := wait.Int64()
	if err != nil {
		return err
	}
	if got < int64(n) {
		return &shortError{got: got, want: n, timeout: timeout}
	}
	return nil
}

// shortError says how many replicas acknowledged; it matches ErrShort.
type shortError struct {
	got     int64
	want    int
	timeout time.Duration
}

func (e *shortError) Error() string {
	return fmt.Sprintf("%d of %d replicas acknowledged within %v", e.got, e.want, e.timeout)
}

func (e *shortError) Is(target error) bool { return target == ErrShort }
