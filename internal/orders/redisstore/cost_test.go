package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
)

// scriptStats reads the server's EVALSHA calls and total time in µs (the
// time of the commands a script runs included), and the calls of every
// other command but INFO: those a script made, for the tests send nothing
// else meanwhile.
func scriptStats(b *testing.B, rdb redis.UniversalClient) (scripts, usec, inner int64) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		name, stats, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") || name == "info" {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch {
			case name == "evalsha" && k == "calls":
				scripts = n
			case name == "evalsha" && k == "usec":
				usec = n
			case name != "evalsha" && k == "calls":
				inner += n
			}
		}
	}
	return scripts, usec, inner
}

// redisCPU reads the server's CPU time (user and system), which a loaded
// machine inflates less than the commands' wall time.
func redisCPU(b *testing.B, rdb redis.UniversalClient) time.Duration {
	b.Helper()
	info, err := rdb.InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info["CPU"][k], 64)
		if err != nil {
			b.Fatal(err)
		}
		sum += v
	}
	return time.Duration(sum * float64(time.Second))
}

// BenchmarkScriptCost reports the Redis time of each script on a task's
// path, per call (<script>-cpuµs/op: the server's CPU time, INFO cpu, on the
// test's own server, so that the request's parsing and reply count too)
// and the commands it runs (<script>-calls/op, INFO commandstats): reserving a position (the producer), taking the lock in turn
// (the worker), and the store's commit of a modify that also releases the
// lock and passes the turn on. For scale, "noop" is a script that runs no
// command and "five" one that runs five small ones: each redis.call costs
// about as much as a small command sent on its own, so the scripts' cost is
// mostly the number of calls they make. Run it with -benchtime 1000x (at
// most 1000, the number of orders, so that the commits are measured apart).
func BenchmarkScriptCost(b *testing.B) {
	db := redistest.New(b)
	db.RequireProcess(b, "INFO commandstats of a real server")
	ctx := context.Background()
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	if err != nil {
		b.Fatal(err)
	}
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	if err != nil {
		b.Fatal(err)
	}
	locker, err := keyordertest.NewLocker(seq)
	if err != nil {
		b.Fatal(err)
	}
	defer locker.Close()
	const nOrders = 1000
	orderNo := func(i int) string { return "SO" + strconv.Itoa(i%nOrders) }
	for i := range nOrders {
		if err := s.Put(ctx, orders.Order{No: orderNo(i), Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}); err != nil {
			b.Fatal(err)
		}
	}
	// One change applied to each order first, as on orders that have a
	// history.
	for i := range nOrders {
		label := "order:modify warm-" + strconv.Itoa(i)
		p, err := seq.Reserve(ctx, orderNo(i), label, "")
		if err != nil {
			b.Fatal(err)
		}
		l, err := locker.AcquireTurn(ctx, orderNo(i), "bench", p, label, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		commit(b, s, l, "warm-"+strconv.Itoa(i), orderNo(i), p)
	}
	n := max(b.N, 1)
	measure := func(name string, f func(i int)) {
		c0, _, i0 := scriptStats(b, db.Client)
		cpu0 := redisCPU(b, db.Client)
		for i := range n {
			f(i)
		}
		cpu1 := redisCPU(b, db.Client)
		c1, _, i1 := scriptStats(b, db.Client)
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(n), name+"-cpuµs/op")
		b.ReportMetric(float64(c1-c0)/float64(n), name+"-scripts/op")
		b.ReportMetric(float64(i1-i0)/float64(n), name+"-calls/op")
	}
	noop := redis.NewScript(`return 1`)
	five := redis.NewScript(`redis.call('TIME') redis.call('EXISTS', KEYS[1]) redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HSET', KEYS[1], 'p', ARGV[1]) redis.call('PEXPIRE', KEYS[1], 100000) return 1`)
	for _, sc := range []*redis.Script{noop, five} {
		if err := sc.Load(ctx, db.Client).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	measure("noop", func(i int) {
		if err := noop.Run(ctx, db.Client, []string{db.Prefix + "x:{" + orderNo(i) + "}"}).Err(); err != nil {
			b.Fatal(err)
		}
	})
	measure("five", func(i int) {
		if err := five.Run(ctx, db.Client, []string{db.Prefix + "x:{" + orderNo(i) + "}"}, "1796294897248 order:modify ev-1").Err(); err != nil {
			b.Fatal(err)
		}
	})
	pos := make([]int64, n)
	label := func(i int) string { return "order:modify ev-" + strconv.Itoa(i) }
	measure("reserve", func(i int) {
		p, err := seq.Reserve(ctx, orderNo(i), label(i), "")
		if err != nil {
			b.Fatal(err)
		}
		pos[i] = p
	})
	leases := make([]*keyordertest.Lease, n)
	measure("acquire", func(i int) {
		l, err := locker.AcquireTurn(ctx, orderNo(i), "bench", pos[i], label(i), time.Second)
		if err != nil {
			b.Fatal(err)
		}
		leases[i] = l
		if n > nOrders { // the order's next position waits for this commit
			commit(b, s, l, "ev-"+strconv.Itoa(i), orderNo(i), pos[i])
			leases[i] = nil
		}
	})
	if n <= nOrders {
		measure("commit", func(i int) { commit(b, s, leases[i], "ev-"+strconv.Itoa(i), orderNo(i), pos[i]) })
	}
}

// commit applies a modify under lease l with its hand-off, as the worker
// does, and releases l (a no-op after the hand-off).
func commit(b *testing.B, s *Store, l *keyordertest.Lease, event, no string, pos int64) {
	b.Helper()
	r := "ring " + event
	ctx := orders.WithWrite(context.Background(), orders.Write{Fence: l.Fence(), Worker: "host-1-bench",
		StartedAt: time.Now(), Seq: pos, NoResult: true, Commit: l})
	if _, err := s.Modify(ctx, event, no, orders.Changes{Remark: &r}); err != nil {
		b.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		b.Fatal(err)
	}
}
