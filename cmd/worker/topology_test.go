package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The tests in this file run the worker binary's run, and the producer
// package, end to end on a real Redis Cluster and a real Sentinel group,
// given nothing but REDIS_URL.

// The end-to-end tests run the worker as the ACL user ow-worker and the
// producer as ow-intake, each with its process's rules (package acl, what
// `producer acl` prints).
const (
	aclUser           = "ow-worker"
	aclPassword       = "worker-acl-secret-0123"
	intakeACLUser     = "ow-intake"
	intakeACLPassword = "intake-acl-secret-0123"
)

// aclUser returns the ACL SETUSER arguments after the user name that give
// process p's rules for prefix, with password.
func aclUserRules(t *testing.T, p acl.Process, prefix, password string) []string {
	t.Helper()
	rules, err := acl.Rules(p, acl.Options{KeyPrefix: prefix})
	require.NoError(t, err)
	return append([]string{"reset", "on", ">" + password}, rules...)
}

// setUsers makes the worker's and the intake's users with set.
func setUsers(t *testing.T, prefix string, set func(ctx context.Context, name string, rules ...string) error) {
	t.Helper()
	require.NoError(t, set(t.Context(), aclUser, aclUserRules(t, acl.Worker, prefix, aclPassword)...))
	require.NoError(t, set(t.Context(), intakeACLUser, aclUserRules(t, acl.Intake, prefix, intakeACLPassword)...))
}

// client returns a client on url, closed at the end of the test.
func client(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	o, err := redisconn.Parse(url)
	require.NoError(t, err)
	rdb := o.NewClient()
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// endToEnd seeds the orders nos, starts the worker on url, enqueues a
// modify of each order through the producer and waits until all are
// applied, then an exchange of each order for news[i] and a modify of each
// replacement, and waits again. The worker runs as the ACL user that url
// names, and the orders are seeded as that user; the producer runs as
// the user of intakeURL. The password must stay out of the worker's log.
// adminURL cleans up.
func endToEnd(t *testing.T, adminURL, url, intakeURL, prefix string, nos, news []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rdb := client(t, url)
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	for _, no := range nos {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	defer cleanQueues(t, client(t, adminURL))

	ops := freeAddr(t)
	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix, "OPS_ADDR": ops, "LOG_LEVEL": "info"}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs lockedBuffer
	go func() {
		done <- runLogTo(runCtx, []string{"-concurrency", "8"}, func(k string) string { return env[k] }, &logs)
	}()
	defer func() {
		stop()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("run did not return after cancel")
		}
		require.NotContains(t, logs.String(), aclPassword)
		require.Contains(t, logs.String(), aclUser, "the start-up line shows the URL, password redacted")
		requireAllowed(t, logs.String())
	}()

	p, err := producer.New(client(t, intakeURL), producer.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	defer p.Close()
	applied := func(no, field, want string) func() bool {
		return func() bool {
			o, err := store.Get(ctx, no)
			if err != nil {
				return false
			}
			return map[string]string{"address": o.Address, "status": string(o.Status)}[field] == want
		}
	}

	for _, no := range nos {
		addr := "new " + no
		_, err := p.EnqueueModify(ctx, no, tasks.Changes{Address: &addr}, producer.WithEventID("m-"+no))
		require.NoError(t, err)
	}
	for _, no := range nos {
		require.Eventually(t, applied(no, "address", "new "+no), 30*time.Second, 10*time.Millisecond, "modify of %s", no)
	}
	for i, no := range nos {
		_, err := p.EnqueueExchange(ctx, no, []tasks.Item{{SKU: "B", Qty: 2}}, producer.WithEventID("x-"+no), producer.WithNewOrderNo(news[i]))
		require.NoError(t, err)
	}
	for i, no := range nos {
		require.Eventually(t, applied(no, "status", string(orders.StatusExchanged)), 30*time.Second, 10*time.Millisecond, "exchange of %s", no)
		addr := "final " + news[i]
		_, err := p.EnqueueModify(ctx, news[i], tasks.Changes{Address: &addr}, producer.WithEventID("m-"+news[i]))
		require.NoError(t, err)
	}
	for _, no := range news {
		require.Eventually(t, applied(no, "address", "final "+no), 30*time.Second, 10*time.Millisecond, "modify of %s", no)
	}

	resp, err := http.Get("http://" + ops + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// requireAllowed fails the test when the worker's log says that Redis
// refused it something: asynq's background work (heartbeats, recovery)
// logs its errors, and the lock says when notices are off.
func requireAllowed(t *testing.T, logs string) {
	t.Helper()
	for _, refused := range []string{"NOPERM", "no permissions", "can't access", "release notices are off"} {
		require.NotContains(t, logs, refused)
	}
}

// cleanQueues deletes the order queues, which live outside the test's
// prefix.
func cleanQueues(t *testing.T, rdb redis.UniversalClient) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
		if err := insp.DeleteQueue(q, true); err != nil {
			t.Logf("delete queue %s: %v", q, err)
		}
	}
}

func TestEndToEndOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	name := func(p string) func(int) string { return func(i int) string { return p + strconv.Itoa(i) } }
	nos := db.Cluster.OnEachMaster(name("SO"))
	news := db.Cluster.OnEachMaster(name("SX"))
	news = append(news[1:], news[0]) // each replacement on another master
	t.Logf("orders %v, replacements %v; queues on %s and %s", nos, news,
		db.Cluster.MasterOf("asynq:{"+tasks.QueueModify+"}"), db.Cluster.MasterOf("asynq:{"+tasks.QueueExchange+"}"))
	setUsers(t, db.Prefix, db.Cluster.SetUser)
	as := func(user, password string) string {
		return strings.Replace(db.URL(), "redis://", "redis://"+user+":"+password+"@", 1)
	}
	endToEnd(t, db.URL(), as(aclUser, aclPassword), as(intakeACLUser, intakeACLPassword), db.Prefix, nos, news)
}

func TestEndToEndOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	setUsers(t, db.Prefix, db.Group.SetUser)
	// The data nodes' user goes in the query; the sentinels need none.
	as := func(user, password string) string { return db.URL() + "&username=" + user + "&password=" + password }
	endToEnd(t, db.URL(), as(aclUser, aclPassword), as(intakeACLUser, intakeACLPassword), db.Prefix, []string{"SO1", "SO2"}, []string{"SX1", "SX2"})
}

// asProcess returns db as a new Redis user with process p's rules for
// db's prefix (with the order API's when api).
func asProcess(t *testing.T, db *redistest.DB, p acl.Process, api bool) *redistest.DB {
	t.Helper()
	rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix, OrderAPI: api})
	require.NoError(t, err)
	return db.AsUser(t, rules...)
}

// On one Redis, the worker runs as a user with its rules and the producer
// as one with the intake's: a modify, an exchange and a modify of the
// replacement, a change scheduled for later (asynq's forwarder moves it
// to its queue), and a duplicate refused with its task's state.
func TestRunAsItsACLUser(t *testing.T) {
	db := redistest.New(t)
	worker, intake := asProcess(t, db, acl.Worker, false), asProcess(t, db, acl.Intake, false)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	defer cleanQueues(t, db.Client)
	store, err := redisstore.New(worker.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	for _, no := range []string{"SO1", "SO2", "SO3"} {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}), "the worker's user seeds")
	}
	p, err := producer.New(intake.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	defer p.Close()
	// A flood of SO3, accepted before the worker starts: parked behind its
	// head, then drained in holds, each commit taking the next change
	// (the worker's user needs the queue's keys in the store's script),
	// with quanta of 3 changes, so that the end of a quantum reads the
	// served queues' pending lists as this user too.
	const flood = 8
	for i := range flood {
		_, err = p.EnqueueModify(ctx, "SO3", tasks.Changes{Address: new(fmt.Sprintf("SO3 #%d", i))}, producer.WithEventID(fmt.Sprintf("f-SO3-%d", i)))
		require.NoError(t, err)
	}

	env := map[string]string{"REDIS_URL": worker.URL(), "KEY_PREFIX": db.Prefix, "OPS_ADDR": freeAddr(t), "LOG_LEVEL": "info", "WORKER_DRAIN_MAX": "3"}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs lockedBuffer
	go func() { done <- runLogTo(runCtx, nil, func(k string) string { return env[k] }, &logs) }()

	address := func(no, want string) func() bool {
		return func() bool {
			o, err := store.Get(ctx, no)
			return err == nil && o.Address == want
		}
	}
	_, err = p.EnqueueModify(ctx, "SO1", tasks.Changes{Address: new("new SO1")}, producer.WithEventID("m-SO1"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(ctx, "SO1", tasks.Changes{Address: new("new SO1")}, producer.WithEventID("m-SO1"))
	var dup *producer.DuplicateError
	require.ErrorAs(t, err, &dup, "the same change again")
	require.NoError(t, dup.LookupErr, "the intake's user reads the task's state")
	_, err = p.EnqueueExchange(ctx, "SO1", []tasks.Item{{SKU: "B", Qty: 2}}, producer.WithEventID("x-SO1"), producer.WithNewOrderNo("SX1"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(ctx, "SX1", tasks.Changes{Address: new("new SX1")}, producer.WithEventID("m-SX1"))
	require.NoError(t, err)
	_, err = p.EnqueueModify(ctx, "SO2", tasks.Changes{Address: new("later SO2")}, producer.WithEventID("m-SO2"), producer.WithProcessIn(time.Second))
	require.NoError(t, err)
	for no, want := range map[string]string{"SO1": "new SO1", "SX1": "new SX1", "SO2": "later SO2", "SO3": fmt.Sprintf("SO3 #%d", flood-1)} {
		require.Eventually(t, address(no, want), 30*time.Second, 10*time.Millisecond, "%s", no)
	}

	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	requireAllowed(t, logs.String())
	require.NotContains(t, logs.String(), worker.Password())
	drained := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"order_no":"SO3"`) && strings.Contains(line, `"drained":true`) {
			drained++
		}
	}
	// Two ends of a quantum (after 3 and 6 changes) may yield to the other
	// orders' changes; the change after a yield starts a hold of its own.
	require.GreaterOrEqual(t, drained, flood-3, "SO3's flood drained in holds")
	require.NotContains(t, logs.String(), "could not read whether other changes wait")
}
