package worker_test

import (
	"testing"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/stretchr/testify/require"
)

// The worker's public names for the lock's facts have the lock's values:
// Done.Mode is the lease's mode, and Config.LockTTL's default is the lock's.
func TestPublicNamesMatchTheLock(t *testing.T) {
	t.Parallel()
	require.Equal(t, worker.ModeFree, worker.Mode(keyorder.ModeFree))
	require.Equal(t, worker.ModeTurn, worker.Mode(keyorder.ModeTurn))
	require.Equal(t, worker.ModePassed, worker.Mode(keyorder.ModePassed))
	require.Equal(t, keyorder.DefaultTTL, worker.DefaultLockTTL)
	require.Equal(t, orderkeys.DefaultPrefix, worker.DefaultKeyPrefix)
}
