package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
)

// The tests in this file run the CLI and the intake on a real Redis Cluster
// and a real Sentinel group, given nothing but REDIS_URL.

// intakeOn seeds each order of nos with the CLI as the worker's user
// (workerURL: `order put` writes the order store), starts the intake on
// url (whose password is password), checks /readyz, enqueues a modify and an exchange of each order
// through it, and reads the tasks, the order, its history and its status
// back, and the CLI's reads as the intake's user too. adminURL cleans up.
func intakeOn(t *testing.T, adminURL, url, password, workerURL, prefix string, nos []string) {
	t.Helper()
	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix}
	cli := func(env map[string]string, args ...string) string {
		t.Helper()
		var out strings.Builder
		err := run(t.Context(), args, func(k string) string { return env[k] }, &out)
		require.NoError(t, err, "%v: %s", args, out.String())
		return out.String()
	}
	o, err := redisconn.Parse(adminURL)
	require.NoError(t, err)
	rdb := o.NewClient()
	defer rdb.Close()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer func() {
		for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
			_ = insp.DeleteQueue(q, true)
		}
	}()
	for _, no := range nos {
		cli(map[string]string{"REDIS_URL": workerURL, "KEY_PREFIX": prefix}, "order", "put", no, "-address", "1 Main St", "-item", "TEA=2")
	}

	senv := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix, "INTAKE_ADDR": "127.0.0.1:0", "INTAKE_API_KEYS": testKey1}
	s := startServe(t, senv)
	do := func(method, path, idem, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.addr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testKey1)
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	defer http.DefaultClient.CloseIdleConnections()

	code, body := do(http.MethodGet, "/readyz", "", "")
	require.Equal(t, http.StatusOK, code, body)
	for _, no := range nos {
		code, body := do(http.MethodPost, "/v1/orders/"+no+"/modify", "ev-"+no, `{"changes":{"remark":"ring twice"}}`)
		require.Equal(t, http.StatusAccepted, code, body)
		code, body = do(http.MethodPost, "/v1/orders/"+no+"/modify", "ev-"+no, `{"changes":{"remark":"ring twice"}}`)
		require.Equal(t, http.StatusConflict, code, body)
		code, body = do(http.MethodGet, "/v1/tasks/ev-"+no, "", "")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"queue":"order_modify"`)
		code, body = do(http.MethodPost, "/v1/orders/"+no+"/exchange", "x-"+no, `{"items":[{"sku":"TEA-BLACK","qty":2}],"new_order_no":"X`+no+`"}`)
		require.Equal(t, http.StatusAccepted, code, body)
		code, body = do(http.MethodGet, "/v1/orders/"+no, "", "")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"address":"1 Main St"`)
		code, body = do(http.MethodGet, "/v1/orders/"+no+"/history", "", "")
		require.Equal(t, http.StatusOK, code, body)
		code, body = do(http.MethodGet, "/v1/orders/"+no+"/status", "", "")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, "ev-"+no, "the status finds the waiting change")
		assert.Contains(t, cli(env, "order", "status", no), "ev-"+no)
		cli(env, "order", "get", no)
	}
	cli(env, "shards")
	cli(env, "modify", nos[0], "-remark", "from the CLI")
	pending, err := insp.ListPendingTasks(tasks.QueueModify)
	require.NoError(t, err)
	// The CLI's change, behind the order's unfinished ones, is parked in
	// the retry set (only an order's head waits in the pending list), but
	// on a Cluster, where the producer parks nothing at acceptance.
	parked, err := insp.ListRetryTasks(tasks.QueueModify)
	require.NoError(t, err)
	assert.Len(t, append(pending, parked...), len(nos)+1)
	logs := s.logs.String()
	assert.NotContains(t, logs, password)
	for _, refused := range []string{"NOPERM", "no permissions", "can't access"} {
		assert.NotContains(t, logs, refused)
	}
}

// The intake and the CLI run as an ACL user with the intake's rules
// (package acl, what `producer acl intake` prints), the seeding CLI as one
// with the worker's.
const (
	aclUser           = "ow-intake"
	aclPassword       = "intake-acl-secret-0123"
	workerACLUser     = "ow-worker"
	workerACLPassword = "worker-acl-secret-0123"
)

// setUsers makes the intake's and the worker's users with set.
func setUsers(t *testing.T, prefix string, set func(ctx context.Context, name string, rules ...string) error) {
	t.Helper()
	for _, u := range []struct {
		p              acl.Process
		name, password string
	}{{acl.Intake, aclUser, aclPassword}, {acl.Worker, workerACLUser, workerACLPassword}} {
		rules, err := acl.Rules(u.p, acl.Options{KeyPrefix: prefix})
		require.NoError(t, err)
		require.NoError(t, set(t.Context(), u.name, append([]string{"reset", "on", ">" + u.password}, rules...)...))
	}
}

func TestIntakeOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	setUsers(t, db.Prefix, db.Cluster.SetUser)
	as := func(user, password string) string {
		return strings.Replace(db.URL(), "redis://", "redis://"+user+":"+password+"@", 1)
	}
	intakeOn(t, db.URL(), as(aclUser, aclPassword), aclPassword, as(workerACLUser, workerACLPassword), db.Prefix,
		db.Cluster.OnEachMaster(func(i int) string { return "SO" + strconv.Itoa(i) }))
}

func TestIntakeOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	setUsers(t, db.Prefix, db.Group.SetUser)
	as := func(user, password string) string { return db.URL() + "&username=" + user + "&password=" + password }
	intakeOn(t, db.URL(), as(aclUser, aclPassword), aclPassword, as(workerACLUser, workerACLPassword), db.Prefix, []string{"SO1", "SO2"})
}

// On one Redis too, as users of the shared server.
func TestIntakeAsItsACLUser(t *testing.T) {
	db := redistest.New(t)
	user := func(p acl.Process) *redistest.DB {
		rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
		require.NoError(t, err)
		return db.AsUser(t, rules...)
	}
	intake := user(acl.Intake)
	intakeOn(t, db.URL(), intake.URL(), intake.Password(), user(acl.Worker).URL(), db.Prefix, []string{"SO1", "SO2"})
}
