package keyorder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is matched by the error a lease's write returns, unsent,
// when fewer than [Config.WaitReplicas] replicas confirmed the key's state
// within [Config.WaitTimeout] (see [Lease.WriteCaughtUp]). It is no failure
// ([IsFailure]): the task runs again after a busy delay, its retries kept.
var ErrNotReplicated = errors.New("keyorder: not confirmed by the replicas")

// DefaultWaitTimeout is the default of Config.WaitTimeout.
const DefaultWaitTimeout = time.Second

// waitMarkerTTL is how long a WAIT marker (see [Lease.replicated]) is kept.
const waitMarkerTTL = time.Minute

// replicated returns nil once [Config.WaitReplicas] replicas have every
// write the key's master made so far: the lease's lock and fence, the
// key's positions, and, where the queue shares the master (one Redis,
// Sentinel), the task the lease runs and its state. At once when
// WaitReplicas is 0.
//
// Redis's WAIT counts the writes of the connection it runs on, and a
// pooled client gives no such connection; so, as the producer does, it
// writes a marker key in the key's slot (the lock key plus ":wait", kept
// a minute) and WAITs behind it in one pipeline, on one connection of the
// key's master: Redis replicates a master's writes in the order it made
// them, so a replica that has the marker has everything before it. It
// returns an error matching [ErrNotReplicated] when fewer replicas
// acknowledged within [Config.WaitTimeout] or when a call failed (wrapping
// Redis's error too): either way the write is not sent, and the task is no
// worse for it.
func (s *Lease) replicated(ctx context.Context) error {
	n := s.l.cfg.WaitReplicas
	if n == 0 {
		return nil
	}
	marker := s.l.lockKey(s.key) + ":wait"
	var c redis.Cmdable = s.l.rdb
	if cc, ok := s.l.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, marker)
		if err != nil {
			return fmt.Errorf("keyorder: confirm %s with the replicas: %w: %w", s.key, ErrNotReplicated, err)
		}
		c = m
	}
	var wait *redis.Cmd
	if _, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, marker, "1", waitMarkerTTL)
		wait = pipe.Do(ctx, "WAIT", n, s.l.cfg.WaitTimeout.Milliseconds())
		return nil
	}); err != nil {
		return fmt.Errorf("keyorder: confirm %s with the replicas: %w: %w", s.key, ErrNotReplicated, err)
	}
	got, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("keyorder: confirm %s with the replicas: %w: %w", s.key, ErrNotReplicated, err)
	}
	if got < int64(n) {
		return fmt.Errorf("keyorder: %s: %w: %d of %d replicas acknowledged within %v", s.key, ErrNotReplicated, got, n, s.l.cfg.WaitTimeout)
	}
	return nil
}
