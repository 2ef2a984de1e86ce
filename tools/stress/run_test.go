package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// The suite itself is run by `make stress`; these tests only check its
// bookkeeping and stay well under a second.

func TestShortKeepsExplicitFlags(t *testing.T) {
	var c settings
	s := config.NewSet("stress", nil)
	v := declare(s, &c)
	require.NoError(t, s.Parse([]string{"-short", "-tasks", "500"}))
	v.applyShort(&c)
	require.Equal(t, 500, c.Tasks)
	require.Equal(t, 25*time.Second, c.Duration)
	require.Equal(t, 150*time.Second, c.DrainTimeout)
}

func TestArchiveClass(t *testing.T) {
	m := enqueued{Type: taskModify}
	tests := []struct {
		name, lastErr, want string
	}{
		{"exchanged", "modify S1: orders: order S1 is exchanged; its replacement is order S1-X1: skip retry for the task", "order:modify of an exchanged order"},
		{"not created: it must wait for the creation", "modify S1-X1: orders: order not found: skip retry for the task", "other: order:modify"},
		{"out of its budget", "failed 11 times, out of its failure budget of 10 retries: boom", "other: order:modify"},
		{"anything else", "asynq: task lease expired", "other: order:modify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, archiveClass(m, tt.lastErr))
		})
	}
}

func TestClusterDefaultsToThreeShards(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"single keeps one queue per type", []string{"-redis", "single"}, "1"},
		{"sentinel keeps one queue per type", []string{"-redis", "sentinel"}, "1"},
		{"cluster spreads the queues over its masters", []string{"-redis", "cluster"}, "3"},
		{"an explicit count wins", []string{"-redis", "cluster", "-queue-shards", "1"}, "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c settings
			s := config.NewSet("stress", nil)
			v := declare(s, &c)
			require.NoError(t, s.Parse(tt.args))
			v.applyTopology(&c)
			require.Equal(t, tt.want, c.Shards.String())
		})
	}
}

func TestRedisFlagRejectsUnknownTopology(t *testing.T) {
	var c settings
	s := config.NewSet("stress", nil)
	s.SetOutput(io.Discard)
	declare(s, &c)
	require.ErrorContains(t, s.Parse([]string{"-redis", "cluster3"}), "redis")
}

func TestStoreFlag(t *testing.T) {
	var c settings
	s := config.NewSet("stress", nil)
	s.SetOutput(io.Discard)
	declare(s, &c)
	require.NoError(t, s.Parse(nil))
	require.Equal(t, storeRedis, c.Store, "the default run keeps the Redis store")
	require.ErrorContains(t, s.Parse([]string{"-store", "grpc"}), "store")
}

func TestWithQuery(t *testing.T) {
	require.Equal(t, "redis://h:1/0?max_retries=5", withQuery("redis://h:1/0", "max_retries=5"))
	require.Equal(t, "redis://h:1?addr=h:2&max_retries=5", withQuery("redis://h:1?addr=h:2", "max_retries=5"))
}

func TestRequireEveryShard(t *testing.T) {
	require.NoError(t, requireEveryShard([]int{1, 2, 3}))
	require.ErrorContains(t, requireEveryShard([]int{4, 0, 2}), "every master")
}

// TestSwitchesRunInTurnUntilTheChaosEnds: a switch due after the chaos
// phase ended is not made; the ones made are recorded with their times.
func TestSwitchesRunInTurnUntilTheChaosEnds(t *testing.T) {
	chaosCtx, endChaos := context.WithCancel(t.Context())
	defer endChaos()
	ran := make(chan string, 3)
	sw := func(name string, at time.Duration) redisSwitch {
		return redisSwitch{at: at, name: name, do: func(context.Context) (string, time.Duration, error) {
			ran <- name
			return "a → b", time.Second, nil
		}}
	}
	ch := &chaos{switches: []redisSwitch{sw("first", 0), sw("second", 0), sw("too late", time.Hour)}, out: io.Discard}
	done := make(chan error, 1)
	go func() { done <- ch.runSwitches(t.Context(), chaosCtx) }()
	require.Equal(t, "first", <-ran)
	require.Equal(t, "second", <-ran)
	endChaos()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("runSwitches did not return after the chaos ended")
	}
	require.Len(t, ch.switched, 2)
	for i, name := range []string{"first", "second"} {
		require.Equal(t, switched{name: name, detail: "a → b", began: ch.switched[i].began, took: time.Second}, ch.switched[i])
	}
	require.Equal(t, "first: a → b, switched in 1s", ch.switched[0].String())
}

func TestHotEventNamesItsOrder(t *testing.T) {
	for _, no := range []string{"H0", "H12", "H-1"} {
		got, ok := hotOrderOf(hotEvent(no, 17))
		require.True(t, ok)
		require.Equal(t, no, got)
	}
	_, ok := hotOrderOf("ev-17")
	require.False(t, ok)
	require.Equal(t, []string{"H0", "H1", "H2"}, hotOrderNos(3, nil))
}

func TestHotPlanAlternates(t *testing.T) {
	h := &hot{c: settings{HotKills: 2, HotFreezes: 1}}
	require.Equal(t, []string{"SIGKILL", "SIGSTOP", "SIGKILL"}, h.plan())
	h.c.HotKills = 0
	require.Equal(t, []string{"SIGSTOP"}, h.plan())
}

func TestHotStartsBeforeTheFirstSwitch(t *testing.T) {
	c := settings{Duration: 25 * time.Second}
	h := newHot(c, nil, nil, nil, []redisSwitch{{at: 12500 * time.Millisecond}}, io.Discard)
	require.Equal(t, 11500*time.Millisecond, h.at)
	require.Equal(t, 13500*time.Millisecond, h.later)
	h = newHot(c, nil, nil, nil, nil, io.Discard)
	require.Equal(t, c.Duration/3-time.Second, h.at)
	c.HotAt = 2 * time.Second
	require.Equal(t, 2*time.Second, newHot(c, nil, nil, nil, nil, io.Discard).at)
}

// TestLogTailReadsOnlyNewCompleteLines: a line still being written is read
// once it is complete, and lines before a skip are not read.
func TestLogTailReadsOnlyNewCompleteLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.log")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	write := func(s string) {
		_, err := f.WriteString(s)
		require.NoError(t, err)
	}
	write(`{"msg":"task done","order_no":"H0","event_id":"hot-H0-1","drained":true}` + "\n")
	tail := &logTail{off: map[string]int64{}}
	tail.skip(path)
	write(`{"msg":"task done","order_no":"H0","event_id":"hot-H0-2","seq":2,"drained":true}` + "\n")
	write(`{"msg":"lease renewal failed"}` + "\n")
	write(`{"msg":"task done","order_no":"H0","event_id":"hot-H0-3",`)
	lines := tail.read(path)
	require.Len(t, lines, 1)
	require.Equal(t, logLine{Msg: msgTaskDone, OrderNo: "H0", EventID: "hot-H0-2", Seq: 2, Drained: true}, lines[0])
	write(`"seq":3,"drained":true}` + "\n")
	lines = tail.read(path)
	require.Len(t, lines, 1)
	require.Equal(t, "hot-H0-3", lines[0].EventID)
	require.Empty(t, tail.read(path))
}

// A task whose queue is missing from asynq's set of queues (a failover can
// lose it) is not lost: the check reads its state. A task asynq does not
// have is.
func TestTaskOutcomeOfAnUnlistedQueue(t *testing.T) {
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	ctx := t.Context()
	cli := asynq.NewClientFromRedisClient(db.Client)
	t.Cleanup(func() { _ = cli.Close() })
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	_, err := cli.EnqueueContext(ctx, asynq.NewTask(tasks.TypeModify, []byte(`{}`)), asynq.Queue(tasks.QueueModify), asynq.TaskID("ev-1"))
	require.NoError(t, err)
	require.NoError(t, db.Client.SRem(ctx, asynqredis.AllQueues, tasks.QueueModify).Err())

	o, err := taskOutcome(ctx, db.Client, insp, tasks.QueueModify, "ev-1")
	require.NoError(t, err)
	require.Equal(t, "pending", o.state)
	require.NoError(t, db.Client.SRem(ctx, asynqredis.AllQueues, tasks.QueueModify).Err())
	o, err = taskOutcome(ctx, db.Client, insp, tasks.QueueModify, "ev-none")
	require.NoError(t, err)
	require.Equal(t, "lost", o.state)
}
