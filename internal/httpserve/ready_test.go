package httpserve_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/testkit/fakeclock"
)

// A flood of concurrent checks runs the check once; its result, success or
// failure, is kept for the period, and a check runs again after it.
func TestReadyCachesTheCheck(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	var calls atomic.Int64
	release := make(chan struct{})
	errDown := errors.New("down")
	var result atomic.Pointer[error]
	none := error(nil)
	result.Store(&none)
	r := httpserve.NewReady(func(ctx context.Context) error {
		calls.Add(1)
		<-release
		_, hasDeadline := ctx.Deadline()
		if !hasDeadline {
			return errors.New("the check has no deadline")
		}
		return *result.Load()
	}, time.Second, time.Second, clock.Now)

	const n = 50
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- r.Check(t.Context()) })
	}
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Equal(t, int64(1), calls.Load(), "one check for the flood")

	clock.Add(999 * time.Millisecond)
	require.NoError(t, r.Check(t.Context()))
	assert.Equal(t, int64(1), calls.Load(), "kept for the period")

	result.Store(&errDown)
	clock.Add(time.Millisecond)
	require.ErrorIs(t, r.Check(t.Context()), errDown)
	require.ErrorIs(t, r.Check(t.Context()), errDown, "a failure is kept too")
	assert.Equal(t, int64(2), calls.Load())
}

// A caller whose context ends while another's check runs gets its
// context's error; the check goes on for the others.
func TestReadyWaiterGivesUp(t *testing.T) {
	t.Parallel()
	release, started := make(chan struct{}), make(chan struct{})
	r := httpserve.NewReady(func(context.Context) error {
		close(started)
		<-release
		return nil
	}, time.Second, time.Second, nil)
	first := make(chan error, 1)
	go func() { first <- r.Check(context.Background()) }()
	<-started
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, r.Check(ctx), context.Canceled)
	close(release)
	require.NoError(t, <-first)
}
