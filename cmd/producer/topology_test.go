package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/orderworker/orderworker/tasks"
)

// The tests in this file run the CLI and the intake on a real Redis Cluster
// and a real Sentinel group, given nothing but REDIS_URL.

// intakeOn seeds each order of nos with the CLI, starts the intake on url,
// checks /readyz, enqueues a modify of each order through it, and reads the
// task and the order back.
func intakeOn(t *testing.T, url, prefix string, nos []string) {
	t.Helper()
	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix}
	o, err := redisconn.Parse(url)
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
		var out strings.Builder
		err := run(t.Context(), []string{"order", "put", no, "-address", "1 Main St", "-item", "TEA=2"}, func(k string) string { return env[k] }, &out)
		require.NoError(t, err, out.String())
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
		code, body = do(http.MethodGet, "/v1/orders/"+no, "", "")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"address":"1 Main St"`)
	}
	pending, err := insp.ListPendingTasks(tasks.QueueModify)
	require.NoError(t, err)
	assert.Len(t, pending, len(nos))
	assert.NotContains(t, s.logs.String(), aclPassword)
}

// The intake and the CLI run as an ACL user with the README's rule: the
// orders and the queues, no channel, nothing dangerous.
const (
	aclUser     = "ow-intake"
	aclPassword = "intake-acl-secret-0123"
)

func aclRules(prefix string) []string {
	return []string{"reset", "on", ">" + aclPassword, "~" + prefix + "*", "~asynq:*", "+@all", "-@dangerous"}
}

func TestIntakeOnCluster(t *testing.T) {
	db := redistest.NewCluster(t)
	require.NoError(t, db.Cluster.SetUser(t.Context(), aclUser, aclRules(db.Prefix)...))
	url := strings.Replace(db.URL(), "redis://", "redis://"+aclUser+":"+aclPassword+"@", 1)
	intakeOn(t, url, db.Prefix, db.Cluster.OnEachMaster(func(i int) string { return "SO" + strconv.Itoa(i) }))
}

func TestIntakeOnSentinel(t *testing.T) {
	db := redistest.NewSentinel(t)
	require.NoError(t, db.Group.SetUser(t.Context(), aclUser, aclRules(db.Prefix)...))
	intakeOn(t, db.URL()+"&username="+aclUser+"&password="+aclPassword, db.Prefix, []string{"SO1", "SO2"})
}
