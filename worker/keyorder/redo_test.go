package keyorder_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// A holder's link is cut while it releases: its release reaches Redis only
// when the link heals, after the holder gave up on the reply and closed
// the connection, so the release's call back of the next position's
// parked holder goes to nobody. The Locker runs the release again until
// Redis answers, finds the turn passed and the holder still parked, and
// calls it back: within a second of the heal, not after its park.
func TestReleaseCutMidCallCallsTheNextHolderBackAtTheHeal(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "a TCP proxy before the server")
	proxy, err := faultproxy.New(db.Options.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	cut := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: db.Options.DB, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cut.Close() })
	holder := newLockerOn(t, cut, db, keyorder.Config{ReleaseTimeout: 300 * time.Millisecond})
	tasks := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "", 0, nil }}
	_, err = keyorder.NewTurns(holder, tasks, keyorder.TurnsConfig{})
	require.NoError(t, err)

	// Warm up: the release script is in the server's cache, so that the
	// release held by the cut runs at the heal as it is.
	warm, err := holder.TryAcquire(t.Context(), "SO-warm", "warm")
	require.NoError(t, err)
	require.NoError(t, warm.Release(t.Context()))

	const key = "SO-cut"
	turns := reserve(t, holder.Sequencer(), key, 2)
	lease, err := holder.AcquireTurn(t.Context(), key, "holder", turns[0], slow)
	require.NoError(t, err)
	seqKey := db.Prefix + "lock:{" + key + "}:seq"
	// The next position's holder is parked, waiting to be called back.
	require.NoError(t, db.Client.HSet(t.Context(), seqKey, "k:"+itoa(turns[1].Pos), "1").Err())

	proxy.Blackhole()
	lease.Finish()
	err = lease.Release(t.Context())
	require.Error(t, err, "the release gets no answer through the cut")
	require.NotErrorIs(t, err, keyorder.ErrNotHeld)
	d, err := db.Client.HGet(t.Context(), seqKey, "d").Int64()
	require.NoError(t, err)
	require.Less(t, d, turns[0].Pos, "the release has not reached Redis yet")

	proxy.Heal()
	healed := time.Now()
	require.Eventually(t, func() bool {
		for _, l := range tasks.wokenLabels() {
			if l == turns[1].Label {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "the next holder was never called back")
	t.Logf("called back %v after the heal", time.Since(healed).Round(time.Millisecond))
	d, err = db.Client.HGet(t.Context(), seqKey, "d").Int64()
	require.NoError(t, err)
	require.Equal(t, turns[0].Pos, d, "the turn passed on once")
	require.Zero(t, db.Client.Exists(t.Context(), db.Prefix+"lock:{"+key+"}").Val(), "the lock is released")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
