package orderview_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// BenchmarkBlocked reads the blocked list among 100,000 orders, each with a
// change waiting in its sequence: "100of100000" with 100 of them blocked
// (each a deleted head with a change scheduled behind it), "0of100000"
// with none. The list reads only what asynq keeps of the 100, so the two
// differ by the 100 orders' reads, not by the 100,000.
func BenchmarkBlocked(b *testing.B) {
	const all, blocked = 100_000, 100
	for _, n := range []int{0, blocked} {
		b.Run(fmt.Sprintf("%dof%d", n, all), func(b *testing.B) {
			db := redistest.New(b)
			seedSequences(b, db.Client, db.Prefix, all)
			p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
			require.NoError(b, err)
			defer p.Close()
			insp := asynq.NewInspectorFromRedisClient(db.Client)
			b.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
			ctx := context.Background()
			for i := range n {
				no := fmt.Sprintf("BLK%d", i)
				_, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: new("a")}, producer.WithEventID(no+"-1"))
				require.NoError(b, err)
				_, err = p.EnqueueModify(ctx, no, tasks.Changes{Remark: new("b")}, producer.WithEventID(no+"-2"), producer.WithProcessIn(time.Hour))
				require.NoError(b, err)
				require.NoError(b, insp.DeleteTask(tasks.QueueModify, no+"-1"))
			}
			now := time.Now().Add(later)
			store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
			require.NoError(b, err)
			r, err := orderview.New(db.Client, store, orderview.Config{KeyPrefix: db.Prefix, Now: func() time.Time { return now }})
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				page, err := r.Blocked(ctx, orderview.BlockedQuery{Limit: orderview.MaxBlockedLimit})
				if err != nil || page.Total != n {
					b.Fatalf("blocked: %d orders, want %d (%v)", page.Total, n, err)
				}
			}
		})
	}
}

// seedSequences gives n orders a change waiting in their sequences, 16
// reservations at a time.
func seedSequences(tb testing.TB, rdb redis.UniversalClient, prefix string, n int) {
	tb.Helper()
	ctx := context.Background()
	seq, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: prefix + "lock:"})
	require.NoError(tb, err)
	const workers = 16
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < n; i += workers {
				no := fmt.Sprintf("SO%d", i)
				if _, err := seq.Reserve(ctx, no, tasks.PositionLabel(tasks.Modify.Type, no+"-1"), ""); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(tb, <-errs)
	}
}
