package redisconn

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFollowMasterMovesSubscriptions stands in for a failover with two
// servers and a dialer that switches from one to the other, as the failover
// client's does: the first connection to the new server closes the
// subscription's connection to the old one, and go-redis resubscribes on the
// new server, where a publish then reaches it.
func TestFollowMasterMovesSubscriptions(t *testing.T) {
	oldMaster, newMaster := redistest.Dedicated(t), redistest.Dedicated(t)
	var target atomic.Value
	target.Store(oldMaster.Addr())
	c := redis.NewClient(&redis.Options{
		Addr: "master",
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, target.Load().(string))
		},
	})
	defer c.Close()
	c.AddHook(newFollowMaster())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	ps := c.Subscribe(ctx, "notices")
	defer ps.Close()
	_, err := ps.Receive(ctx) // the subscription, on the old server
	require.NoError(t, err)
	msgs := ps.Channel()

	// The switch. The pool holds no connection to the old server (go-redis
	// drops them on a switch), so the next command dials the new one.
	target.Store(newMaster.Addr())
	require.NoError(t, c.Ping(ctx).Err())
	n := redis.NewClient(&redis.Options{Addr: newMaster.Addr()})
	defer n.Close()
	require.Eventually(t, func() bool {
		subs, err := n.PubSubNumSub(ctx, "notices").Result()
		return err == nil && subs["notices"] == 1
	}, 10*time.Second, 10*time.Millisecond, "the subscription did not move to the new server")
	require.NoError(t, n.Publish(ctx, "notices", "hello").Err())
	select {
	case m := <-msgs:
		require.Equal(t, "hello", m.Payload)
	case <-ctx.Done():
		t.Fatal("no message on the new server")
	}
}
