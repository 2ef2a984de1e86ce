package producer_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
)

// An order's backlog is capped (Config.MaxWaiting): a change past it is
// refused with ErrBacklogFull and writes nothing (no claim, no position,
// no task), on one Redis's one-step path and on the two-step path (a
// scheduled change takes it, as a Cluster does); once a change is done the
// next one is accepted again.
func TestBacklogCap(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		opts []producer.Option
	}{
		{"one step", nil},
		{"two steps", []producer.Option{producer.WithProcessIn(time.Minute)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, producer.Config{MaxWaiting: 3})
			for i := range 3 {
				_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, append(tt.opts, producer.WithEventID(fmt.Sprint("ev-", i)))...)
				require.NoError(t, err)
			}
			before, err := e.db.Client.DBSize(t.Context()).Result()
			require.NoError(t, err)
			_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, append(tt.opts, producer.WithEventID("ev-over"))...)
			require.ErrorIs(t, err, producer.ErrBacklogFull)
			require.ErrorIs(t, err, keyorder.ErrFull)
			require.NotErrorIs(t, err, producer.ErrUnavailable)
			assert.ErrorContains(t, err, "3 changes of the order wait, the most allowed (MaxWaiting 3)")
			// An exchange, which also takes its replacement's first position.
			_, err = e.p.EnqueueExchange(t.Context(), "SO1", []tasks.Item{{SKU: "A", Qty: 1}}, append(tt.opts, producer.WithEventID("ex-over"), producer.WithNewOrderNo("SO9"))...)
			require.ErrorIs(t, err, producer.ErrBacklogFull)
			after, err := e.db.Client.DBSize(t.Context()).Result()
			require.NoError(t, err)
			if tt.opts == nil {
				assert.Equal(t, before, after, "the refusals wrote nothing")
			}
			assert.Zero(t, e.db.Client.Exists(t.Context(), "ow:event:{ev-over}", "ow:event:{ex-over}").Val(), "no claim is left")
			q := sequencer(t, e)
			st, err := q.Status(t.Context(), "SO9")
			require.NoError(t, err)
			assert.Empty(t, st.Pending, "no position of the replacement is left waiting")
			_, err = e.insp.GetTaskInfo("order_modify", "ev-over")
			require.Error(t, err, "no task")

			// Another order is not held back; the order goes on once one
			// of its changes is done.
			_, err = e.p.EnqueueModify(t.Context(), "SO2", tasks.Changes{Remark: new("r")}, tt.opts...)
			require.NoError(t, err)
			st, err = q.Status(t.Context(), "SO1")
			require.NoError(t, err)
			l, err := keyordertest.NewLocker(q)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			done, err := l.AcquireTurn(t.Context(), "SO1", "test", st.Pending[0].Pos, st.Pending[0].Label, time.Second)
			require.NoError(t, err)
			done.Finish()
			require.NoError(t, done.Release(t.Context()))
			_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, append(tt.opts, producer.WithEventID("ev-over"))...)
			require.NoError(t, err, "sent again once there is room, with the same event ID")
		})
	}
}

// Producers racing on one order never pass the cap together: of 16
// changes sent at once with a cap of 5, exactly 5 are accepted.
func TestBacklogCapUnderRace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{MaxWaiting: 5})
	ps := []*producer.Producer{e.p}
	for range 3 {
		p, err := producer.New(e.db.NewClient(t), producer.Config{MaxWaiting: 5})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		ps = append(ps, p)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			var opts []producer.Option
			if i%2 == 1 {
				opts = append(opts, producer.WithProcessIn(time.Minute)) // the two-step path
			}
			_, err := ps[i%len(ps)].EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, opts...)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	accepted := 0
	for err := range errs {
		switch {
		case err == nil:
			accepted++
		case !errors.Is(err, producer.ErrBacklogFull):
			t.Errorf("unexpected error: %v", err)
		}
	}
	require.Equal(t, 5, accepted)
}

// A change with a position may be scheduled at most MaxScheduleAhead
// ahead: every later change of its order waits behind it.
func TestScheduleAheadBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, producer.Config{MaxScheduleAhead: time.Hour})
	_, err := e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithProcessIn(time.Hour+time.Second))
	require.ErrorIs(t, err, producer.ErrInvalidOption)
	assert.ErrorContains(t, err, "further ahead than MaxScheduleAhead (1h0m0s)")
	e.requireEmpty(t)
	_, err = e.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithProcessIn(time.Hour))
	require.NoError(t, err)

	d := newEnv(t, producer.Config{})
	_, err = d.p.EnqueueModify(t.Context(), "SO1", tasks.Changes{Remark: new("r")}, producer.WithProcessIn(365*24*time.Hour))
	require.ErrorIs(t, err, producer.ErrInvalidOption, "the probe's year ahead, under the default")
	d.requireEmpty(t)

	for _, bad := range []time.Duration{-time.Second, 7 * 24 * time.Hour} {
		_, err := producer.New(e.db.Client, producer.Config{MaxScheduleAhead: bad})
		require.Error(t, err, "%v", bad)
	}
}
