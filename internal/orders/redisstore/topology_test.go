package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/conntest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
)

// The tests in this file run the Redis store on a real Redis Cluster and a
// real Sentinel group, through a client built by redisconn as the binaries
// build theirs, with the lock hold as the worker offers it.

// exerciseStore seeds each order of nos, modifies it under its lock (the
// commit releasing the lock), refuses a stale fence, reads its history,
// exchanges it for the replacement news[i] and replays the exchange.
func exerciseStore(t *testing.T, rdb redis.UniversalClient, prefix string, nos, news []string) {
	t.Helper()
	ctx := t.Context()
	s, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	space, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: prefix + "lock:"})
	require.NoError(t, err)
	locker, err := keyordertest.NewLocker(space)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close() })
	write := func(l *keyordertest.Lease) context.Context {
		return orders.WithWrite(ctx, orders.Write{Fence: l.Fence(), Worker: "w", Commit: l})
	}
	items := []orders.Item{{SKU: "A", Qty: 1}}

	for i, no := range nos {
		require.NoError(t, s.Put(ctx, orders.Order{No: no, Address: "old", Items: items}), no)

		lease, err := locker.Acquire(ctx, no, "modify")
		require.NoError(t, err)
		addr := "new " + no
		res, err := s.Modify(write(lease), "ev-m-"+no, no, orders.Changes{Address: &addr})
		require.NoError(t, err, no)
		assert.Equal(t, addr, res.Order.Address)
		n, err := rdb.Exists(ctx, prefix+"lock:{"+no+"}").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s: the commit released the lock", no)
		require.NoError(t, lease.Release(ctx))

		stale := orders.WithWrite(ctx, orders.Write{Fence: lease.Fence() - 1, Worker: "late"})
		_, err = s.Modify(stale, "ev-late-"+no, no, orders.Changes{Address: &addr})
		require.ErrorIs(t, err, orders.ErrStaleFence, no)

		h, err := orders.AllHistory(ctx, s, no)
		require.NoError(t, err, no)
		require.Len(t, h, 2, no)
		assert.Equal(t, "ev-m-"+no, h[1].EventID)

		lease, err = locker.Acquire(ctx, no, "exchange")
		require.NoError(t, err)
		x := orders.Exchange{Items: []orders.Item{{SKU: "B", Qty: 2}}, NewOrderNo: news[i], Reason: "test"}
		res, err = s.Exchange(write(lease), "ev-x-"+no, no, x)
		require.NoError(t, err, no)
		assert.Equal(t, news[i], res.Order.No)
		assert.Equal(t, no, res.Order.ExchangedFrom)
		again, err := s.Exchange(write(lease), "ev-x-"+no, no, x)
		require.NoError(t, err)
		assert.True(t, again.Replayed)
		require.NoError(t, lease.Release(ctx))

		old, err := s.Get(ctx, no)
		require.NoError(t, err)
		assert.Equal(t, orders.StatusExchanged, old.Status)
		assert.Equal(t, news[i], old.ExchangedTo)
		_, err = s.Modify(orders.WithWrite(ctx, orders.Write{Fence: lease.Fence() + 1}), "ev-after-"+no, no, orders.Changes{Address: &addr})
		require.ErrorIs(t, err, orders.ErrClosed)
		b, err := s.Get(ctx, news[i])
		require.NoError(t, err)
		assert.Equal(t, x.Items, b.Items)
		assert.Equal(t, addr, b.Address)
	}
}

func TestRedisStoreOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	name := func(p string) func(int) string { return func(i int) string { return p + strconv.Itoa(i) } }
	nos := db.Cluster.OnEachMaster(name("SO"))
	news := db.Cluster.OnEachMaster(name("SX"))
	// Each replacement on another master than its order: an exchange
	// writes to two slots, in two scripts.
	news = append(news[1:], news[0])
	for i := range nos {
		require.NotEqual(t, db.Cluster.MasterOf(nos[i]), db.Cluster.MasterOf(news[i]))
	}
	exerciseStore(t, conntest.Client(t, db.URL()), db.Prefix, nos, news)
}

func TestRedisStoreOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	exerciseStore(t, conntest.Client(t, db.URL()), db.Prefix, []string{"SO1", "SO2"}, []string{"SX1", "SX2"})
}
