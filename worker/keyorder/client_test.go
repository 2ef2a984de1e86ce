package keyorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// dbsize counts the keys of the test's own database (asynq's included).
func dbsize(t *testing.T, db *redistest.DB) int64 {
	t.Helper()
	db.RequireProcess(t, "a database of the test's own")
	n, err := db.Client.DBSize(t.Context()).Result()
	require.NoError(t, err)
	return n
}

func TestEnqueueRefusesPayloadsAndOptionsWritingNothing(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for _, p := range []string{"", " ", "null", "[]", `[{"a":1}]`, "1", `"s"`, "true", "{", `{"a":1`, `{"a":1}x`,
		`{"seq":1}`, `{"a":1,"seq":null}`, ` {"seq":{}} `, `{"s\u0065q":2}`} {
		_, err := c.Enqueue(t.Context(), "K", asynq.NewTask("t", []byte(p)))
		require.ErrorIs(t, err, keyorder.ErrPayload, "payload %q", p)
	}
	for _, opt := range []asynq.Option{asynq.Unique(time.Minute), asynq.Group("g")} {
		for _, later := range []bool{false, true} {
			opts := []asynq.Option{opt}
			if later {
				opts = append(opts, asynq.ProcessIn(time.Minute))
			}
			_, err := c.Enqueue(t.Context(), "K", asynq.NewTask("t", []byte(`{"a":1}`)), opts...)
			require.Error(t, err, "option %v", opt)
		}
	}
	for _, q := range []string{"", " ", "a b"} {
		_, err := c.Enqueue(t.Context(), "K", asynq.NewTask("t", []byte(`{}`)), asynq.Queue(q))
		require.Error(t, err, "queue %q", q)
	}
	_, err := c.Enqueue(t.Context(), "K", nil)
	require.Error(t, err)
	require.Zero(t, dbsize(t, db), "a refused Enqueue wrote")
}

// TestEnqueueKeepsEveryObjectValid enqueues objects of every shape, on
// both paths, and requires each task's payload to be valid JSON carrying
// the position, with the members it was given.
func TestEnqueueKeepsEveryObjectValid(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	for _, later := range []bool{false, true} {
		for i, p := range []string{`{}`, `{ }`, "{\n}", ` {} `, "\t{\"a\":1}\n", `{"a":{"seq":1}}`, `{"a":[1,2],"b":"}"}`} {
			var opts []asynq.Option
			if later {
				opts = append(opts, asynq.ProcessIn(time.Hour))
			}
			key := fmt.Sprint("K", i)
			e, err := c.Enqueue(t.Context(), key, asynq.NewTask("t", []byte(p)), opts...)
			require.NoError(t, err, "payload %q", p)
			info, err := insp.GetTaskInfo(e.Queue, e.TaskID)
			require.NoError(t, err)
			require.True(t, json.Valid(info.Payload), "payload %q became %q (later=%v)", p, info.Payload, later)
			pos, err := keyorder.Position(info.Payload)
			require.NoError(t, err)
			require.Equal(t, e.Pos, pos)
			var in, out map[string]any
			require.NoError(t, json.Unmarshal([]byte(p), &in))
			require.NoError(t, json.Unmarshal(info.Payload, &out))
			delete(out, keyorder.SeqField)
			require.Equal(t, in, out)
		}
	}
}

func TestEnqueueDuplicateTaskIDTakesNoPosition(t *testing.T) {
	t.Parallel()
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprint("later=", later), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			var opts []asynq.Option
			if later {
				opts = append(opts, asynq.ProcessIn(10*time.Millisecond))
			}
			e1 := enqueue(t, c, "K", 1, append(opts, asynq.TaskID("dup"))...)
			_, err := c.Enqueue(t.Context(), "K", asynq.NewTask("order", payload(t, "K", 2)), append(opts, asynq.TaskID("dup"))...)
			require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
			// Another queue may hold the ID.
			enqueue(t, c, "K", 3, append(opts, asynq.TaskID("dup"), asynq.Queue("other"))...)
			e4 := enqueue(t, c, "K", 4, opts...)
			if !later {
				require.Equal(t, e1.Pos+2, e4.Pos, "the refused task took a position")
			}

			r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: time.Minute})
			rc := newRecorder()
			srv := asynq.NewServerFromRedisClient(db.Client, r.ServerConfig(asynq.Config{
				Concurrency: 2, LogLevel: asynq.FatalLevel, Queues: map[string]int{"default": 1, "other": 1},
				TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
			}))
			require.NoError(t, srv.Start(r.Handler(rc.wrap(nil))))
			t.Cleanup(srv.Shutdown)
			// A GapWait of a minute: a position left by the refusal
			// would block task 4 past the test's patience.
			eventually(t, func() bool { return len(rc.succeeded("K")) == 3 }, "a task of K was blocked")
			require.Equal(t, []int{1, 3, 4}, rc.succeeded("K"))
		})
	}
}

func TestEnqueueLaterRunsInOrder(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	rc := newRecorder()
	startServer(t, db.Client, r, 4, rc.wrap(nil))
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	// 1 comes later than 2 and 3 are due; 4 at a time already past.
	enqueue(t, c, "K", 1, asynq.ProcessIn(300*time.Millisecond))
	enqueue(t, c, "K", 2)
	enqueue(t, c, "K", 3, asynq.Deadline(time.Now().Add(time.Minute)))
	enqueue(t, c, "K", 4, asynq.ProcessAt(time.Now().Add(-time.Second)))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 4 }, "not every task ran")
	require.Equal(t, []int{1, 2, 3, 4}, rc.succeeded("K"))
}

func TestEnqueueFullWritesNothing(t *testing.T) {
	t.Parallel()
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprint("later=", later), func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			c := newCappedClient(t, db.Client, db.Prefix, 2, keyorder.ClientConfig{})
			var opts []asynq.Option
			if later {
				opts = append(opts, asynq.ProcessIn(time.Hour))
			}
			enqueue(t, c, "K", 1, opts...)
			enqueue(t, c, "K", 2, opts...)
			_, err := c.Enqueue(t.Context(), "K", asynq.NewTask("order", payload(t, "K", 3)), append(opts, asynq.TaskID("three"))...)
			require.ErrorIs(t, err, keyorder.ErrFull)
			var full *keyorder.FullError
			require.ErrorAs(t, err, &full)
			_, err = asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo("default", "three")
			require.ErrorIs(t, err, asynq.ErrTaskNotFound)
		})
	}
}

// TestAClientTakesItsKeySpaceFromItsSequencer checks that a Client
// reserves under its Sequencer's prefix and with its retention, on both
// paths (the one script, and the two steps of a task for later). Before
// the Client was built on a Sequencer, its sequences always kept the
// default retention, whatever the Lockers' was.
func TestAClientTakesItsKeySpaceFromItsSequencer(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	seq := space(t, db.Client, db.Prefix, keyorder.SeqConfig{Retention: time.Hour})
	c, err := keyorder.NewClient(seq, keyorder.ClientConfig{})
	require.NoError(t, err)
	for key, opts := range map[string][]asynq.Option{"NOW": nil, "LATER": {asynq.ProcessIn(time.Hour)}} {
		enqueue(t, c, key, 1, opts...)
		ttl, err := db.Client.PTTL(t.Context(), seq.SeqKey(key)).Result()
		require.NoError(t, err)
		require.True(t, ttl > 59*time.Minute && ttl <= time.Hour, "%s: the sequence's TTL %v is the Sequencer's retention", key, ttl)
		require.True(t, strings.HasPrefix(seq.SeqKey(key), db.Prefix+"lock:"), "the Sequencer's prefix")
	}
}

func TestNewClientRefusesBadSettings(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	_, err := keyorder.NewClient(nil, keyorder.ClientConfig{})
	require.Error(t, err)
	_, err = keyorder.NewSequencer(db.Client, keyorder.SeqConfig{MaxWaiting: -1})
	require.Error(t, err)
	_, err = keyorder.NewClient(space(t, db.Client, db.Prefix, keyorder.SeqConfig{}), keyorder.ClientConfig{ParkFor: -time.Second})
	require.Error(t, err)
}

// TestEnqueueOnCluster runs the two-step path on a Redis Cluster: keys on
// every master, enqueued by two racing Clients, run in order.
func TestEnqueueOnCluster(t *testing.T) {
	t.Parallel()
	db := redistest.NewCluster(t)
	keys := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprint("CK-", i) })
	// asynq's keys are not under the prefix: a queue of the test's own.
	queue := strings.NewReplacer(" ", "", "{", "", "}", "").Replace(db.Prefix) + "q"
	t.Cleanup(func() { cleanAsynq(t, db.Client, queue) })
	rc := newRecorder()
	for range 2 {
		rdb := db.NewClient(t)
		r := newRunner(t, rdb, db.Prefix, keyorder.RunnerConfig{})
		srv := asynq.NewServerFromRedisClient(rdb, r.ServerConfig(asynq.Config{
			Concurrency: 3, LogLevel: asynq.FatalLevel, Queues: map[string]int{queue: 1},
			TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
		}))
		require.NoError(t, srv.Start(r.Handler(rc.wrap(nil))))
		t.Cleanup(srv.Shutdown)
	}
	clients := []*keyorder.Client{newClient(t, db.NewClient(t), db.Prefix, keyorder.ClientConfig{}), newClient(t, db.NewClient(t), db.Prefix, keyorder.ClientConfig{})}
	const each = 10
	var wg sync.WaitGroup
	for p, c := range clients {
		wg.Go(func() {
			for i := range each {
				for _, k := range keys {
					_, err := c.Enqueue(t.Context(), k, asynq.NewTask("order", payload(t, k, p*each+i)), asynq.Queue(queue))
					if !assertNoError(t, err) {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	eventually(t, func() bool { return len(rc.all()) == 2*each*len(keys) }, "not every task ran")
	require.Empty(t, rc.overlaps)
	for _, k := range keys {
		var last int64
		for _, r := range rc.all() {
			if r.Key != k {
				continue
			}
			if last != 0 {
				require.Equal(t, last+1, r.Pos, "key %s ran out of order", k)
			}
			last = r.Pos
		}
	}
}

// cleanAsynq deletes asynq's keys of queue from a cluster.
func cleanAsynq(t *testing.T, c *redis.ClusterClient, queue string) {
	ctx := context.Background()
	c.SRem(ctx, "asynq:queues", queue)
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "asynq:{"+queue+"}:*", 100).Iterator()
		for iter.Next(ctx) {
			m.Del(ctx, iter.Val())
		}
		return iter.Err()
	})
}

func FuzzPosition(f *testing.F) {
	for _, s := range []string{`{}`, `{"seq":1}`, `{"seq":0}`, `{"seq":-1}`, `{"seq":1.5}`, `{"seq":1e3}`, `{"seq":"1"}`,
		`{"seq":9223372036854775807}`, `{"seq":9223372036854775808}`, `null`, `[]`, `{"a":1,"seq":42}`, `{"seq":+1}`, `{"seq": 7 }`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pos, err := keyorder.Position(b)
		switch {
		case err != nil:
			require.Zero(t, pos)
		case pos != 0:
			require.Positive(t, pos)
		}
		// What Enqueue accepts, it rewrites into a payload whose position
		// reads back.
		body, err := keyorder.Positionless(b)
		if err != nil {
			require.True(t, errors.Is(err, keyorder.ErrPayload))
			return
		}
		out := keyorder.WithSeq(body, 17)
		require.True(t, json.Valid(out), "%q became %q", b, out)
		pos, err = keyorder.Position(out)
		require.NoError(t, err)
		require.Equal(t, int64(17), pos)
	})
}

// TestEnqueueLeftPositionIsSkipped breaks the two-step path between its
// steps: a Client whose Redis user may write the sequences but not asynq's
// keys takes a position and fails to enqueue. The position stays, and the
// Runners skip it after GapWait: the next task runs.
func TestEnqueueLeftPositionIsSkipped(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	const gapWait = 300 * time.Millisecond
	seqOnly := db.AsUser(t, "~"+db.Prefix+"*", "+@all")
	broken := newClient(t, seqOnly.Client, db.Prefix, keyorder.ClientConfig{ParkFor: gapWait})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: gapWait})
	enqueue(t, c, "K", 1)
	_, err := broken.Enqueue(t.Context(), "K", asynq.NewTask("order", payload(t, "K", 2)), asynq.ProcessIn(time.Millisecond))
	require.Error(t, err)
	require.Contains(t, err.Error(), "NOPERM")
	enqueue(t, c, "K", 3)

	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{GapWait: gapWait})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, "task 3 was blocked by the left position")
	require.Equal(t, []int{1, 3}, rc.succeeded("K"))
}

// TestEnqueueRefusesABlankType: asynq's Client refuses a task of a blank
// type; Enqueue must too, on both paths, before it takes a position.
func TestEnqueueRefusesABlankType(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	for _, typ := range []string{"", "  "} {
		for _, opts := range [][]asynq.Option{nil, {asynq.ProcessIn(time.Hour)}} {
			_, err := c.Enqueue(t.Context(), "K", asynq.NewTask(typ, []byte(`{}`)), opts...)
			require.Error(t, err, "type %q, options %v", typ, opts)
		}
	}
	require.Zero(t, dbsize(t, db), "a refused Enqueue wrote")
}
