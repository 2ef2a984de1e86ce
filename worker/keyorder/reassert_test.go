package keyorder_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// A failover loses the end of a turn: the promoted master has the key's
// head still at the position whose change was applied, its task still
// active in asynq with its lease, and the lock still held by the holder
// that released it. Nothing but the task's lease (30 s) would move the
// key. The Runner's Locker sees Redis unreachable and back (its probe),
// ends that turn again, and the next change runs within about a second
// of Redis answering, not after the lease or GapWait.
func TestRunnerEndsAgainTheTurnsAFailoverLost(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("restores every key of the database: needs a server of its own")
	}
	ctx := context.Background()
	proxy, err := faultproxy.New(db.Options.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	link := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: db.Options.DB, ContextTimeoutEnabled: true,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = link.Close() })

	logs := &slogRecords{}
	r := newRunner(t, link, db.Prefix, keyorder.RunnerConfig{GapWait: 5 * time.Minute, Logger: slog.New(logs),
		Wait: keyorder.Wait{Deadline: time.Minute}})
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: time.Minute})
	running, finish := make(chan struct{}), make(chan struct{})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(func(ctx context.Context, b body, _ keyorder.Run) error {
		if b.N == 1 {
			close(running)
			<-finish
		}
		return nil
	}))
	enqueue(t, c, "K", 1, asynq.Retention(time.Hour))

	// The replica's copy, taken while change 1 runs: its task active with
	// its lease, the key's lock held, the head at its position.
	<-running
	keys, err := db.Client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	dumps := map[string]string{}
	for _, k := range keys {
		dumps[k], err = db.Client.Dump(ctx, k).Result()
		require.NoError(t, err)
	}
	close(finish)
	eventually(t, func() bool { return len(rc.succeeded("K")) == 1 }, "change 1 never ran")

	// The promotion: every write since the copy is gone.
	now, err := db.Client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	for _, k := range now {
		if _, ok := dumps[k]; !ok {
			require.NoError(t, db.Client.Del(ctx, k).Err())
		}
	}
	for k, d := range dumps {
		require.NoError(t, db.Client.RestoreReplace(ctx, k, 0, d).Err())
	}
	// The master unreachable, then the promoted one serving.
	proxy.Blackhole()
	eventually(t, func() bool { return len(logs.matching("did not answer the probe")) > 0 }, "the Locker never probed")
	proxy.Heal()
	healed := time.Now()
	// Accepted by the promoted master behind the head it has: parked for
	// ParkFor, a minute, unless the head's end calls it back.
	enqueue(t, c, "K", 2, asynq.Retention(time.Hour))
	require.Eventually(t, func() bool { return len(rc.succeeded("K")) == 2 }, 20*time.Second, 5*time.Millisecond,
		"change 2 waited behind a turn whose end the failover lost")
	t.Logf("change 2 ran %v after Redis answered again", time.Since(healed).Round(time.Millisecond))
	require.Less(t, time.Since(healed), 5*time.Second, "not within about a second of the heal")
	require.Equal(t, []int{1, 2}, rc.succeeded("K"))
	require.NotEmpty(t, logs.matching("ended turns again"), "the turn was not ended again")
}

// A task taken for a hold whose end the hold could not record (Redis did
// not answer) is run by no one until its lease ends: the Locker brings it
// back to its queue as soon as Redis answers. One whose write Redis
// answered with an error is not known to be stuck and is left alone.
func TestLockerBringsBackATaskStuckWhileRedisWasUnreachable(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	q := "stuck_" + strings.Trim(db.Prefix, ":")
	cli := asynq.NewClientFromRedisClient(db.Client)
	for _, id := range []string{"lost", "refused"} {
		_, err := cli.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q), asynq.TaskID(id), asynq.Retention(time.Hour))
		require.NoError(t, err)
		_, _, err = asynqwire.Step(ctx, db.Client, nil, q, id)
		require.NoError(t, err)
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	state := func(id string) asynq.TaskState {
		info, err := insp.GetTaskInfo(q, id)
		require.NoError(t, err)
		return info.State
	}
	require.Equal(t, asynq.TaskStateActive, state("lost"))

	answered := db.Client.Eval(ctx, "return redis.error_reply('ERR refused')", nil).Err()
	require.Error(t, answered)
	l := newLocker(t, db, keyorder.Config{})
	l.Stuck(q, "refused", answered)
	l.Stuck(q, "lost", fmt.Errorf("end lost: %w", syscall.ECONNREFUSED))
	eventually(t, func() bool { return state("lost") == asynq.TaskStatePending }, "the stuck task was not brought back")
	require.Equal(t, asynq.TaskStateActive, state("refused"), "a task whose write Redis refused was brought back")
}
