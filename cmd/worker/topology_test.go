package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// The tests in this file run the worker binary's run, and the producer
// package, end to end on a real Redis Cluster and a real Sentinel group,
// given nothing but REDIS_URL.

// aclUser and aclPassword are the ACL user the end-to-end tests run as,
// with the rules the README gives the worker and the intake.
const (
	aclUser     = "ow-worker"
	aclPassword = "worker-acl-secret-0123"
)

func aclRules(prefix string) []string {
	return []string{"reset", "on", ">" + aclPassword,
		"~" + prefix + "*", "~asynq:*", "&" + prefix + "*", "&asynq:*", "+@all", "-@dangerous"}
}

// endToEnd seeds the orders nos, starts the worker on url, enqueues a
// modify of each order through the producer and waits until all are
// applied, then an exchange of each order for news[i] and a modify of each
// replacement, and waits again. Everything runs as the ACL user that url
// names; the password must stay out of the worker's log.
func endToEnd(t *testing.T, url, prefix string, nos, news []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	o, err := redisconn.Parse(url)
	require.NoError(t, err)
	rdb := o.NewClient()
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	for _, no := range nos {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "old", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}
	defer cleanQueues(t, rdb)

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
	}()

	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix})
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
	require.NoError(t, db.Cluster.SetUser(t.Context(), aclUser, aclRules(db.Prefix)...))
	url := strings.Replace(db.URL(), "redis://", "redis://"+aclUser+":"+aclPassword+"@", 1)
	endToEnd(t, url, db.Prefix, nos, news)
}

func TestEndToEndOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	require.NoError(t, db.Group.SetUser(t.Context(), aclUser, aclRules(db.Prefix)...))
	// The data nodes' user goes in the query; the sentinels need none.
	url := db.URL() + "&username=" + aclUser + "&password=" + aclPassword
	endToEnd(t, url, db.Prefix, []string{"SO1", "SO2"}, []string{"SX1", "SX2"})
}
