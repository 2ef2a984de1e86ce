package keyorder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orderworker/orderworker/internal/replwait"
)

// ErrNotReplicated is matched by the error a lease's write returns, unsent,
// when fewer than lockConfig.WaitReplicas replicas confirmed the key's state
// within lockConfig.WaitTimeout (see lease.WriteCaughtUp). It is no failure
// ([IsFailure]): the task runs again after a busy delay, its retries kept.
var ErrNotReplicated = errors.New("keyorder: not confirmed by the replicas")

// DefaultWaitTimeout is the default of lockConfig.WaitTimeout.
const DefaultWaitTimeout = time.Second

// replicated returns nil once lockConfig.WaitReplicas replicas have every
// write the key's master made so far: the lease's lock and fence, the
// key's positions, and, where the queue shares the master (one Redis,
// Sentinel), the task the lease runs and its state. At once when
// WaitReplicas is 0.
//
// It writes a marker key in the key's slot (the lock key plus ":wait",
// kept a minute) and WAITs behind it on one connection of the key's
// master (replwait.Confirm, as the producer does): a replica that has the
// marker has everything the master wrote before it. It
// returns an error matching [ErrNotReplicated] when fewer replicas
// acknowledged within lockConfig.WaitTimeout or when a call failed (wrapping
// Redis's error too): either way the write is not sent, and the task is no
// worse for it.
func (s *lease) replicated(ctx context.Context) error {
	n := s.l.cfg.WaitReplicas
	if n == 0 {
		return nil
	}
	marker := s.l.lockKey(s.key) + ":wait"
	if err := replwait.Confirm(ctx, s.l.rdb, []string{marker}, n, s.l.cfg.WaitTimeout); err != nil {
		return fmt.Errorf("keyorder: confirm %s with the replicas: %w: %w", s.key, ErrNotReplicated, err)
	}
	return nil
}
