package main

import (
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
	"github.com/orderworker/orderworker/internal/testkit/intaketest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
)

// TestIntakeCutMidAcceptance cuts the intake's Redis link while upstreams
// keep sending, each change sent again with its Idempotency-Key until it is
// answered 202 or 409: a blackhole past the request timeout (the commands
// held are delivered at the heal, after the intake answered 503), resets
// of every connection, and a slow link. On one Redis nothing may be lost:
// every change sent has exactly one task, at the position its 202
// answered, in the order of acceptance, and no task exists of a change
// never accepted. It runs as the intake's ACL user.
func TestIntakeCutMidAcceptance(t *testing.T) {
	db := redistest.New(t)
	db.RequireProcess(t, "a TCP proxy before a real Redis")
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	user := db.AsUser(t, rules...)
	proxy, err := faultproxy.New(user.Options.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	u, err := url.Parse(user.URL())
	require.NoError(t, err)
	u.Host = proxy.Addr()

	env := map[string]string{
		"REDIS_URL": u.String(), "KEY_PREFIX": db.Prefix, "INTAKE_ADDR": "127.0.0.1:0",
		"INTAKE_API_KEYS": testKey1, "INTAKE_REQUEST_TIMEOUT": "1s", "LOG_LEVEL": "info",
	}
	s := startServe(t, env)
	sender := intaketest.NewSender(t, "http://"+s.addr, testKey1)
	ctx := t.Context()
	nos := []string{"SC1", "SC2", "SC3"}
	const perOrder = 60

	var (
		mu      sync.Mutex
		byOrder = make(map[string][]accepted)
		sent    = make(chan struct{}, 1000) // one per change accepted
	)
	var wg sync.WaitGroup
	for _, no := range nos {
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 1; i <= perOrder; i++ {
				a := accepted{eventID: fmt.Sprintf("%s-%d", no, i), began: time.Now()}
				for {
					seq, err := sender.Modify(ctx, t, no, a.eventID, "remark "+strconv.Itoa(i))
					if err == nil {
						a.seq, a.done = seq, time.Now()
						break
					}
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
				mu.Lock()
				byOrder[no] = append(byOrder[no], a)
				mu.Unlock()
				sent <- struct{}{}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	// waitSent waits for n more changes accepted.
	waitSent := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-sent:
			case <-time.After(30 * time.Second):
				t.Fatal("no change accepted for 30 s")
			}
		}
	}
	waitSent(10)
	proxy.Blackhole()
	// The link stays cut past the request timeout: the answers in
	// between are 503s, while the commands held wait for the heal.
	cut := time.Now()
	require.Eventually(t, func() bool { return sender.Unavailable.Load() >= 3 }, 30*time.Second, 10*time.Millisecond,
		"no 503 while the link was cut")
	proxy.Heal()
	t.Logf("link cut for %v", time.Since(cut).Round(time.Millisecond))
	waitSent(10)
	for range 3 {
		proxy.Reset()
		waitSent(5)
	}
	proxy.Delay(300 * time.Millisecond)
	waitSent(5)
	proxy.Delay(0)
	wg.Wait()

	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	held := map[string]int64{}
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){insp.ListPendingTasks, insp.ListRetryTasks, insp.ListScheduledTasks} {
		tis, err := list(tasks.QueueModify, asynq.PageSize(1000))
		require.NoError(t, err)
		for _, ti := range tis {
			p, err := tasks.Modify.Parse(ti.Payload)
			require.NoError(t, err)
			_, twice := held[ti.ID]
			require.False(t, twice, "%s has two tasks", ti.ID)
			held[ti.ID] = p.Header().Seq
		}
	}
	for _, no := range nos {
		require.Len(t, byOrder[no], perOrder)
		var last int64
		for _, a := range byOrder[no] {
			seq, ok := held[a.eventID]
			require.True(t, ok, "%s was accepted and has no task", a.eventID)
			if a.seq != 0 {
				require.Equal(t, a.seq, seq, "%s: its task's position is not the one its 202 answered", a.eventID)
			}
			require.Greater(t, seq, last, "%s out of the order of acceptance", a.eventID)
			last = seq
			delete(held, a.eventID)
		}
	}
	require.Empty(t, held, "tasks of changes never accepted")
	t.Logf("%d changes accepted, each once, in order, through %d answers 503", len(nos)*perOrder, sender.Unavailable.Load())
}
