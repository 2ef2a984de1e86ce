package intake

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

const adminKey = "admin-key-0123456789abcdef"

func adminHeader(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + key}
}

// TestActionsNeedTheAdminScope drives the operator actions through the
// intake: only an admin key may act (an enqueue key gets 403, none 401),
// an admin key may not enqueue, and each action is recorded with the
// key's name and the reason, in the sequence log and the order's history.
func TestActionsNeedTheAdminScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.AdminKeys = []string{adminKey} })
	t.Cleanup(func() { _ = e.insp.DeleteQueue(tasks.QueueModify, true) })
	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	r := e.post(t, "/v1/orders/SO1/modify", "act-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	const hold = "/v1/orders/SO1/actions/hold"

	r = e.do(t, http.MethodPost, hold, `{"reason":"fraud check"}`, map[string]string{"Authorization": ""})
	require.Equal(t, http.StatusUnauthorized, r.status, "%s", r.body)
	require.Equal(t, codeUnauthorized, r.errorBody(t).Error.Code)
	r = e.do(t, http.MethodPost, hold, `{"reason":"fraud check"}`, nil) // key1: an enqueue key
	require.Equal(t, http.StatusForbidden, r.status, "%s", r.body)
	require.Equal(t, codeForbidden, r.errorBody(t).Error.Code)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{"Authorization": "Bearer " + adminKey, HeaderIdempotencyKey: "act-x"})
	require.Equal(t, http.StatusUnauthorized, r.status, "an admin key need not enqueue: %s", r.body)

	r = e.do(t, http.MethodPost, hold, "", adminHeader(adminKey))
	require.Equal(t, http.StatusBadRequest, r.status, "hold needs a reason: %s", r.body)
	require.Equal(t, codeInvalidField, r.errorBody(t).Error.Code)
	r = e.do(t, http.MethodPost, hold, `{"reason":1}`, adminHeader(adminKey))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/frobnicate", "", adminHeader(adminKey))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	require.Equal(t, "action", r.errorBody(t).Error.Field)

	r = e.do(t, http.MethodPost, hold, `{"reason":"fraud check"}`, adminHeader(adminKey))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var res orderops.Result
	r.decode(t, &res)
	require.Equal(t, "admin#1", res.By)
	require.Equal(t, "fraud check", res.Reason)
	r = e.do(t, http.MethodPost, hold, `{"reason":"again"}`, adminHeader(adminKey))
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, codeActionRefused, r.errorBody(t).Error.Code)

	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/resume", "", adminHeader(adminKey))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/skip", `{"reason":"sent twice"}`, adminHeader(adminKey))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r.decode(t, &res)
	require.Equal(t, "act-1", res.TaskID)
	info, err := e.insp.GetTaskInfo(tasks.QueueModify, "act-1")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)

	r = e.do(t, http.MethodGet, "/v1/orders/SO1/status", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	for _, want := range []string{"hold by admin#1: fraud check", "resume by admin#1", "skipped by admin#1: sent twice"} {
		require.Contains(t, string(r.body), want)
	}

	r = e.do(t, http.MethodGet, "/v1/orders/SO1/history", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var h struct{ Entries []orders.Entry }
	r.decode(t, &h)
	var notes []string
	for _, x := range h.Entries {
		if x.Type == orders.TypeNote {
			notes = append(notes, x.Worker+" | "+x.Detail)
		}
	}
	require.Equal(t, []string{"admin#1 | hold by admin#1: fraud check", "admin#1 | resume by admin#1",
		fmt.Sprintf("admin#1 | skipped position %d by admin#1: sent twice", res.Seq)}, notes, "%s", r.body)
}

// Without AdminKeys no key may act.
func TestActionsWithoutAdminKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	r := e.do(t, http.MethodPost, "/v1/orders/SO1/actions/resume", "", nil)
	require.Equal(t, http.StatusForbidden, r.status, "%s", r.body)
}

// An action while Redis is unreachable is answered 503.
func TestActionUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnvOn(t, closedRedis(t), "ow:", func(c *Config) { c.AdminKeys = []string{adminKey} })
	r := e.do(t, http.MethodPost, "/v1/orders/SO1/actions/resume", "", adminHeader(adminKey))
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	require.Equal(t, codeUnavailable, r.errorBody(t).Error.Code)
}

// Admin keys follow the rules of API keys, and go with keys only.
func TestAdminKeysConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	p, err := producer.New(e.rdb, producer.Config{KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	for _, cfg := range []Config{
		{APIKeys: []string{key1}, AdminKeys: []string{"short"}},
		{InsecureNoAuth: true, AdminKeys: []string{adminKey}},
	} {
		_, err := New(e.rdb, p, e.store, cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

// An action's body is decoded as strictly as an enqueue's: a repeated or
// unknown field is a 400, and nothing is done.
func TestActionBodyIsStrict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.AdminKeys = []string{adminKey} })
	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	for _, body := range []string{
		`{"reason":"fraud check","reason":"other"}`, `{"reason":"x","by":"admin#2"}`, `{"Reason":"x"}`,
		`{"reason":"x"} {"reason":"y"}`, `["x"]`,
	} {
		r := e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", body, adminHeader(adminKey))
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
		require.Equal(t, codeMalformedBody, r.errorBody(t).Error.Code, body)
	}
	st, err := e.rdb.Exists(t.Context(), e.db.Prefix+"lock:{SO1}:seq").Result()
	require.NoError(t, err)
	require.Zero(t, st, "nothing was held")
}

// An admin key's actions are rate limited: past the burst, 429
// rate_limited with Retry-After, and nothing is done.
func TestActionsAreRateLimited(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	e := newEnv(t, func(c *Config) {
		c.AdminKeys = []string{adminKey}
		c.ActionRate, c.ActionBurst = 0.1, 2
		c.now = func() time.Time { return now }
	})
	require.NoError(t, e.store.Put(t.Context(), orders.Order{No: "SO1", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	r := e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", `{"reason":"x"}`, adminHeader(adminKey))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/resume", ``, adminHeader(adminKey))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", `{"reason":"y"}`, adminHeader(adminKey))
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, codeRateLimited, r.errorBody(t).Error.Code)
	require.Equal(t, "10", r.header.Get("Retry-After"))
	st, err := e.rdb.HExists(t.Context(), e.db.Prefix+"lock:{SO1}:seq", "h").Result()
	require.NoError(t, err)
	require.False(t, st, "the refused hold did nothing")
}
