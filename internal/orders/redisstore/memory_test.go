package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
)

// usedMemory reads INFO memory's used_memory.
func usedMemory(b *testing.B, rdb redis.UniversalClient) int64 {
	b.Helper()
	info, err := rdb.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkMemoryPerChange measures the Redis bytes one applied change
// keeps (its history entry and its dedupe record, with their share of the
// keys' overhead), on the test's database: the bytes/change metric. "few
// orders" is many changes to four orders (the dedupe buckets grow past 128
// records and Redis stores them as hash tables); "many orders" is 20
// changes to each order (small buckets, which Redis packs).
func BenchmarkMemoryPerChange(b *testing.B) {
	b.Run("few orders", func(b *testing.B) { memoryPerChange(b, 4) })
	b.Run("many orders", func(b *testing.B) { memoryPerChange(b, max(1, b.N/20)) })
}

func memoryPerChange(b *testing.B, n int) {
	db := redistest.New(b)
	db.RequireProcess(b, "used_memory of a real server")
	s, err := New(db.Client, Config{Prefix: db.Prefix, HistoryMax: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	for o := range n {
		if err := s.Put(context.Background(), orders.Order{No: "SO" + strconv.Itoa(o), Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}); err != nil {
			b.Fatal(err)
		}
	}
	fence := time.Now().UnixMicro()
	remark := "leave at the door"
	before := usedMemory(b, db.Client) // the orders themselves are not counted
	b.ResetTimer()
	for i := range b.N {
		ctx := orders.WithWrite(context.Background(), orders.Write{Fence: fence + int64(i), Worker: "host-a-1234-9f1c2e3d",
			StartedAt: time.Now(), Seq: 1796288474540370 + int64(i), NoResult: true})
		// A UUIDv7-sized event ID, as the producer generates.
		ev := "0193a5c2-7e4f-7a1b-9c3d-" + strconv.FormatInt(100000000000+int64(i), 10)
		if _, err := s.Modify(ctx, ev, "SO"+strconv.Itoa(i%n), orders.Changes{Remark: &remark}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(usedMemory(b, db.Client)-before)/float64(b.N), "bytes/change")
}

// BenchmarkMemoryLevelsOff shows that the store's memory stops growing once
// its windows roll over: with a 1 s dedupe retention and 100 history
// entries per order, it writes to 20 orders for 6 s and samples the
// server's used memory every second. It reports the bytes each change added
// in the first 2 s (the windows filling) and in the last 4 s (rolled over:
// about 0 when memory is bounded), and logs the samples. One run takes 6 s
// whatever -benchtime says.
func BenchmarkMemoryLevelsOff(b *testing.B) {
	db := redistest.New(b)
	db.RequireProcess(b, "used_memory of a real server")
	s, err := New(db.Client, Config{Prefix: db.Prefix, DedupeRetention: time.Second, HistoryMax: 100})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const nOrders = 20
	for o := range nOrders {
		if err := s.Put(ctx, orders.Order{No: "SO" + strconv.Itoa(o), Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}); err != nil {
			b.Fatal(err)
		}
	}
	remark := "leave at the door"
	fence := time.Now().UnixMicro()
	for b.Loop() {
		start := time.Now()
		mem := []int64{usedMemory(b, db.Client)}
		writes := []int{0}
		i := 0
		for sec := 1; sec <= 6; sec++ {
			for time.Since(start) < time.Duration(sec)*time.Second {
				ctx := orders.WithWrite(ctx, orders.Write{Fence: fence + int64(i), Worker: "host-a-1234-9f1c2e3d",
					Seq: fence + int64(i), NoResult: true})
				ev := "0193a5c2-7e4f-7a1b-9c3d-" + strconv.FormatInt(100000000000+int64(i), 10)
				if _, err := s.Modify(ctx, ev, "SO"+strconv.Itoa(i%nOrders), orders.Changes{Remark: &remark}); err != nil {
					b.Fatal(err)
				}
				i++
			}
			mem = append(mem, usedMemory(b, db.Client))
			writes = append(writes, i)
		}
		b.Logf("used memory each second (bytes): %v after %v changes", mem, writes)
		b.ReportMetric(float64(mem[2]-mem[0])/float64(writes[2]), "bytes/change-filling")
		b.ReportMetric(float64(mem[6]-mem[2])/float64(writes[6]-writes[2]), "bytes/change-rolled-over")
	}
}
