package worker_test

import (
	"testing"

	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/worker"
	"github.com/stretchr/testify/require"
)

// The worker's public names for the lock's facts have the lock's values:
// Done.Mode is the lease's mode, and Config.LockTTL's default is the lock's.
func TestPublicNamesMatchTheLock(t *testing.T) {
	t.Parallel()
	require.Equal(t, worker.ModeFree, worker.Mode(lock.ModeFree))
	require.Equal(t, worker.ModeTurn, worker.Mode(lock.ModeTurn))
	require.Equal(t, worker.ModePassed, worker.Mode(lock.ModePassed))
	require.Equal(t, lock.DefaultTTL, worker.DefaultLockTTL)
	require.Equal(t, lock.DefaultPrefix, worker.DefaultKeyPrefix+"lock:")
}
