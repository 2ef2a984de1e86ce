package keyorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// BenchmarkRunner sets what a Runner costs against plain asynq, side by
// side in one run: b.N tasks of zero work, each of its own key (keys=all:
// the lock and the turn check, nothing parked), spread over 100 keys, or
// all of one key (a hot key: every task after the head is parked, and
// runs in its predecessor's hold), enqueued before the clock starts and
// run by one asynq server of 10 workers. It reports the time per task
// (ns/op) and the worker's Redis round trips per task (round-trips/op).
// Compare the asynq and keyorder rows of one run: the machine's noise
// moves both.
func BenchmarkRunner(b *testing.B) {
	for _, keys := range []int{0, 100, 1} {
		name := "all"
		if keys > 0 {
			name = strconv.Itoa(keys)
		}
		for _, mode := range []string{"asynq", "keyorder"} {
			b.Run(fmt.Sprintf("keys=%s/%s", name, mode), func(b *testing.B) { benchRunner(b, keys, mode == "keyorder") })
		}
	}
}

func benchRunner(b *testing.B, keys int, ordered bool) {
	db := redistest.New(b)
	ctx := context.Background()
	queue := "bench" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c, err := keyorder.NewClient(space(b, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.ClientConfig{})
	if err != nil {
		b.Fatal(err)
	}
	plain := asynq.NewClientFromRedisClient(db.Client)
	if keys == 0 {
		keys = b.N
	}
	for i := range b.N {
		key := "k" + strconv.Itoa(i%keys)
		payload, _ := json.Marshal(map[string]string{"key": key})
		task := asynq.NewTask("bench", payload)
		if ordered {
			_, err = c.Enqueue(ctx, key, task, asynq.Queue(queue))
		} else {
			_, err = plain.EnqueueContext(ctx, task, asynq.Queue(queue))
		}
		if err != nil {
			b.Fatal(err)
		}
	}

	wc := db.NewClient(b)
	hook := &countHook{}
	wc.AddHook(hook)
	var done atomic.Int64
	all := make(chan struct{})
	var h asynq.Handler = asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if done.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	})
	cfg := asynq.Config{Concurrency: 10, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 10 * time.Millisecond}
	if ordered {
		r, err := keyorder.NewRunner(space(b, wc, db.Prefix, keyorder.SeqConfig{}), keyorder.RunnerConfig{
			Key: func(t *asynq.Task) (string, error) {
				var p struct{ Key string }
				err := json.Unmarshal(t.Payload(), &p)
				return p.Key, err
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = r.Close() })
		h, cfg = r.Handler(h), r.ServerConfig(cfg)
	}
	mux := asynq.NewServeMux()
	mux.Handle("bench", h)
	srv := asynq.NewServerFromRedisClient(wc, cfg)
	b.ResetTimer()
	start := hook.n.Load()
	if err := srv.Start(mux); err != nil {
		b.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d tasks ran in 5 minutes", done.Load(), b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(hook.n.Load()-start)/float64(b.N), "round-trips/op")
	srv.Shutdown()
}
