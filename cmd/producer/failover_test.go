package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/intaketest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
)

// accepted is one modify the intake accepted.
type accepted struct {
	eventID     string
	seq         int64 // from the 202; 0 after a 409
	began, done time.Time
}

// TestIntakeMasterKilled runs serve on a Cluster whose master of the modify
// queue (and of one of the three orders) is killed while requests keep
// coming, each sent again with its Idempotency-Key until accepted. Every
// answer is a 202, a 409 (an earlier attempt was accepted after all) or a
// 503 with a Retry-After of whole seconds; serve recovers by itself
// (/readyz, and 202s for requests sent after the switch); and every
// accepted change has its one task, at the position its 202 answered, in
// the order of acceptance. No worker runs: the tasks stay pending. (The
// worker's side, with the intake, is cmd/worker's
// TestClusterMasterKilledMidRun.)
func TestIntakeMasterKilled(t *testing.T) {
	db := redistest.DedicatedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := map[string]string{
		"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "INTAKE_ADDR": "127.0.0.1:0",
		"INTAKE_API_KEYS": testKey1, "INTAKE_REQUEST_TIMEOUT": "2s", "LOG_LEVEL": "info",
	}
	s := startServe(t, env)
	base := "http://" + s.addr
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	nos := db.Cluster.OnEachMaster(func(i int) string { return "SK" + strconv.Itoa(i) })
	shard := db.Cluster.ShardOf("asynq:{" + tasks.QueueModify + "}")

	var (
		mu      sync.Mutex
		byOrder = make(map[string][]accepted)
	)
	sender := intaketest.NewSender(t, base, testKey1)
	post := func(no, eventID string, i int) (int64, bool) {
		seq, err := sender.Modify(ctx, t, no, eventID, fmt.Sprintf("remark %d", i))
		return seq, err == nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, no := range nos {
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 1; i <= 200; i++ { // serve's log sink holds 1000 lines
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				a := accepted{eventID: fmt.Sprintf("%s-%d", no, i), began: time.Now()}
				for {
					seq, ok := post(no, a.eventID, i)
					if ok {
						a.seq, a.done = seq, time.Now()
						mu.Lock()
						byOrder[no] = append(byOrder[no], a)
						mu.Unlock()
						break
					}
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
			}
		})
	}
	stopped := false
	stopSenders := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopSenders()
	since := func(t time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		least := -1
		for _, no := range nos {
			n := 0
			for _, a := range byOrder[no] {
				if a.began.After(t) {
					n++
				}
			}
			if least < 0 || n < least {
				least = n
			}
		}
		return least
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(30 * time.Second)
		for !cond() {
			select {
			case <-tick.C:
			case <-deadline:
				t.Fatalf("%s", what)
			}
		}
	}

	start := time.Now()
	wait("no change accepted before the kill", func() bool { return since(start) >= 3 })
	began := time.Now()
	old, cur, err := db.Cluster.KillMaster(ctx, shard)
	require.NoError(t, err)
	ended := time.Now()
	wait("no change sent after the switch accepted", func() bool { return since(ended) >= 5 })
	again := time.Now()
	stopSenders()
	wait("serve's /readyz after the switch", func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return false
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	o, err := redisconn.Parse(db.URL())
	require.NoError(t, err)
	rdb := o.NewClient()
	defer rdb.Close()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	pending, err := insp.ListPendingTasks(tasks.QueueModify, asynq.PageSize(2000))
	require.NoError(t, err)
	held := make(map[string]int64, len(pending))
	for _, ti := range pending {
		p, err := tasks.Modify.Parse(ti.Payload)
		require.NoError(t, err)
		held[ti.ID] = p.Header().Seq
	}
	total, lost := 0, 0
	for _, no := range nos {
		var last int64
		for _, a := range byOrder[no] {
			total++
			seq, ok := held[a.eventID]
			switch {
			case !ok && !a.done.Before(began.Add(-time.Second)) && !a.began.After(ended):
				lost++ // acknowledged, not replicated: the switch's window
				continue
			case !ok:
				t.Errorf("%s accepted at %s, outside the switch, has no task", a.eventID, a.done.Format("15:04:05.000"))
				continue
			case a.seq != 0 && seq != a.seq:
				t.Errorf("%s: task at position %d, 202 answered %d", a.eventID, seq, a.seq)
			case seq <= last:
				t.Errorf("%s at position %d after one at %d", a.eventID, seq, last)
			}
			last = seq
			delete(held, a.eventID)
		}
	}
	for id := range held {
		t.Errorf("task %s of a change never accepted", id)
	}
	t.Logf("master %s killed, %s took over in %v; %d changes accepted, %d lost in the switch; %d answers 503; "+
		"every order had 5 changes sent after the switch accepted %v after it began",
		old, cur, ended.Sub(began).Round(time.Millisecond), total, lost, sender.Unavailable.Load(), again.Sub(began).Round(time.Millisecond))
	for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
		_ = insp.DeleteQueue(q, true)
	}
}
