package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

const (
	modifyBody   = `{"changes":{"address":"1 Main St","items":[{"sku":"A","qty":2}]}}`
	exchangeBody = `{"items":[{"sku":"B","qty":1}],"new_order_no":"SO1-X","reason":"size"}`
)

func TestEnqueueModify(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)

	r := e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var res producer.Result
	r.decode(t, &res)
	require.Positive(t, res.Seq)
	assert.Equal(t, producer.Result{TaskID: "evt-1", Queue: tasks.QueueModify, EventID: "evt-1", Seq: res.Seq}, res)
	assert.Equal(t, "/v1/tasks/evt-1", r.header.Get("Location"))
	assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
	assert.NotEmpty(t, r.header.Get(HeaderRequestID))

	info, err := e.insp.GetTaskInfo(tasks.QueueModify, "evt-1")
	require.NoError(t, err)
	assert.Equal(t, tasks.TypeModify, info.Type)
	assert.JSONEq(t, `{"event_id":"evt-1","order_no":"SO1","changes":{"address":"1 Main St","items":[{"sku":"A","qty":2}]},"seq":`+
		strconv.FormatInt(res.Seq, 10)+`}`, string(info.Payload))
	assert.Equal(t, tasks.MaxRetry(producer.DefaultMaxRetry), info.MaxRetry)
	assert.Equal(t, 1, e.queued(t))
}

func TestEnqueueExchange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)

	r := e.post(t, "/v1/orders/SO1/exchange", "evt-x", exchangeBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var res producer.Result
	r.decode(t, &res)
	assert.Equal(t, producer.Result{TaskID: "evt-x", Queue: tasks.QueueExchange, EventID: "evt-x", Seq: res.Seq}, res)

	info, err := e.insp.GetTaskInfo(tasks.QueueExchange, "evt-x")
	require.NoError(t, err)
	assert.Equal(t, tasks.TypeExchange, info.Type)
	assert.JSONEq(t, `{"event_id":"evt-x","order_no":"SO1","items":[{"sku":"B","qty":1}],"new_order_no":"SO1-X","reason":"size","seq":`+
		strconv.FormatInt(res.Seq, 10)+`}`, string(info.Payload))
}

// kindBody returns the example body of kind k (tasks.WithExample),
// failing the test when k has none.
func kindBody(t *testing.T, k *tasks.Kind) string {
	t.Helper()
	body := k.Example()
	require.NotEmpty(t, body, "%s has no example: give it one with tasks.WithExample", k.Type)
	return body
}

// kindPath returns the enqueue route of kind k for order orderNo.
func kindPath(k *tasks.Kind, orderNo string) string {
	return "/v1/orders/" + orderNo + "/" + k.Name
}

// TestEnqueueEveryKind enqueues each kind of the table through its route
// (202), then the same request again (409) and the same key for another
// order, another payload (422): the answers of every route, so that a
// kind added to the table has its route covered with no edit here.
func TestEnqueueEveryKind(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			body := kindBody(t, k)
			evt := "evt-" + k.Name

			r := e.post(t, kindPath(k, "SO1"), evt, body)
			require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
			var res producer.Result
			r.decode(t, &res)
			require.Positive(t, res.Seq)
			assert.Equal(t, producer.Result{TaskID: evt, Queue: k.Queue, EventID: evt, Seq: res.Seq}, res)
			assert.Equal(t, "/v1/tasks/"+evt, r.header.Get("Location"))

			info, err := e.insp.GetTaskInfo(k.Queue, evt)
			require.NoError(t, err)
			assert.Equal(t, k.Type, info.Type)
			got, err := k.Parse(info.Payload)
			require.NoError(t, err)
			assert.Equal(t, tasks.Header{EventID: evt, OrderNo: "SO1", Seq: res.Seq}, got.Header())
			want, err := k.ExamplePayload(evt, "SO1")
			require.NoError(t, err)
			assert.Equal(t, want.WithHeader(tasks.Header{}), got.WithHeader(tasks.Header{}), "the body's members, as sent")

			r = e.post(t, kindPath(k, "SO1"), evt, body)
			require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
			eb := r.errorBody(t)
			assert.Equal(t, codeDuplicate, eb.Error.Code)
			assert.Equal(t, k.Queue, eb.Queue)

			r = e.post(t, kindPath(k, "SO2"), evt, body)
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
			eb = r.errorBody(t)
			assert.Equal(t, codeKeyReused, eb.Error.Code)
			assert.Equal(t, k.Queue, eb.Queue)

			assert.Equal(t, 1, e.queued(t), "no 409 or 422 enqueues anything")
		})
	}
}

// One key across both types: the second use is refused when it is
// enqueued (422), never accepted and then archived by the worker.
func TestKeyAcrossTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	r := e.post(t, "/v1/orders/SO1/exchange", "evt-x", exchangeBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)

	for _, path := range []string{"/v1/orders/SO1/modify", "/v1/orders/SO2/modify"} {
		r = e.post(t, path, "evt-x", modifyBody)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
		var body struct {
			Error  map[string]string `json:"error"`
			TaskID string            `json:"task_id"`
			Queue  string            `json:"queue"`
		}
		r.decode(t, &body)
		assert.Equal(t, codeKeyReused, body.Error["code"])
		assert.Equal(t, "evt-x", body.TaskID)
		assert.Equal(t, tasks.QueueExchange, body.Queue, "the queue of the change the key was first used for")
	}
	assert.Equal(t, 1, e.queued(t), "nothing more was enqueued")
}

// TestEnqueueKeyForms checks the ways of giving the event ID, which all make
// the same task.
func TestEnqueueKeyForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)

	// In the body only, with order_no repeated.
	r := e.post(t, "/v1/orders/SO1/modify", "", `{"event_id":"crm:7.a","order_no":"SO1","changes":{"remark":"x"}}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	assert.Equal(t, "/v1/tasks/crm:7.a", r.header.Get("Location"))

	// The same event as a quoted structured-field string, in the header and
	// the body: the same payload, so a duplicate.
	r = e.post(t, "/v1/orders/SO1/modify", `"crm:7.a"`, `{"event_id":"crm:7.a","changes":{"remark":"x"}}`)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)

	// A quoted key with escapes unquotes to characters no event ID has.
	r = e.post(t, "/v1/orders/SO1/modify", `"a\"b\\c"`, `{"changes":{"remark":"x"}}`)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, HeaderIdempotencyKey, r.errorBody(t).Error.Field)
	assert.Equal(t, 1, e.queued(t))
}

func TestEnqueueDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	require.Equal(t, http.StatusAccepted, e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody).status)

	// The same request again: 409 with the existing task.
	r := e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	body := r.errorBody(t)
	assert.Equal(t, codeDuplicate, body.Error.Code)
	assert.Equal(t, "evt-1", body.TaskID)
	assert.Equal(t, tasks.QueueModify, body.Queue)
	assert.Equal(t, "evt-1", body.EventID)
	assert.Equal(t, "pending", body.State)

	// The same key with another change: 422.
	r = e.post(t, "/v1/orders/SO1/modify", "evt-1", `{"changes":{"remark":"other"}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
	body = r.errorBody(t)
	assert.Equal(t, codeKeyReused, body.Error.Code)
	assert.Equal(t, "event_id", body.Error.Field)
	assert.Equal(t, "evt-1", body.TaskID)
	assert.Empty(t, body.State)

	// The same key and change for another order is another payload too.
	r = e.post(t, "/v1/orders/SO2/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)

	// Exchanges alike.
	require.Equal(t, http.StatusAccepted, e.post(t, "/v1/orders/SO1/exchange", "evt-2", exchangeBody).status)
	require.Equal(t, http.StatusConflict, e.post(t, "/v1/orders/SO1/exchange", "evt-2", exchangeBody).status)
	r = e.post(t, "/v1/orders/SO1/exchange", "evt-2", `{"items":[{"sku":"B","qty":2}]}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
	assert.Equal(t, tasks.QueueExchange, r.errorBody(t).Queue)

	assert.Equal(t, 2, e.queued(t), "no 409 or 422 enqueues anything")
}

// TestEnqueueRejects checks every 4xx of the POST routes, and that none of
// them enqueues anything.
func TestEnqueueRejects(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const modify, exchange = "/v1/orders/SO1/modify", "/v1/orders/SO1/exchange"
	type rejection struct {
		name   string
		path   string
		header map[string]string
		body   string
		status int
		code   string
		field  string
	}
	tests := []rejection{
		{"not json", modify, nil, `{"changes":`, 400, codeMalformedBody, ""},
		{"trailing data", modify, nil, modifyBody + `{}`, 400, codeMalformedBody, ""},
		{"array", modify, nil, `[]`, 400, codeMalformedBody, ""},
		{"empty body", modify, nil, ``, 400, codeMalformedBody, ""},
		{"unknown field", modify, nil, `{"changes":{"remark":"x"},"priority":1}`, 400, codeInvalidField, "priority"},
		{"unknown nested field", modify, nil, `{"changes":{"colour":"red"}}`, 400, codeInvalidField, "changes.colour"},
		{"bad qty", modify, nil, `{"changes":{"items":[{"sku":"A","qty":0}]}}`, 400, codeInvalidField, "changes.items[0].qty"},
		{"qty not integer", modify, nil, `{"changes":{"items":[{"sku":"A","qty":1.5}]}}`, 400, codeInvalidField, "changes.items[0].qty"},
		{"no changes", modify, nil, `{"changes":{}}`, 400, codeInvalidField, "changes"},
		{"repeated field", modify, nil, `{"changes":{"remark":"x","remark":"y"}}`, 400, codeInvalidField, "changes.remark"},
		{"NUL in remark", modify, nil, `{"changes":{"remark":"a\u0000b"}}`, 400, codeInvalidField, "changes.remark"},
		{"escape in address", modify, nil, `{"changes":{"address":"\u001b[2J1 Main St"}}`, 400, codeInvalidField, "changes.address"},
		{"tab in address", modify, nil, `{"changes":{"address":"1 Main St\tSpringfield"}}`, 400, codeInvalidField, "changes.address"},
		{"lone surrogate in address", modify, nil, `{"changes":{"address":"1 Main St \ud800"}}`, 400, codeInvalidField, "changes.address"},
		{"lone surrogate in remark", modify, nil, `{"changes":{"remark":"\udc00"}}`, 400, codeInvalidField, "changes.remark"},
		{"lone surrogate in reason", exchange, nil, `{"items":[{"sku":"A","qty":1}],"reason":"\ud83d"}`, 400, codeInvalidField, "reason"},
		{"bad event_id in body", modify, map[string]string{HeaderIdempotencyKey: ""}, `{"event_id":"a b","changes":{"remark":"x"}}`, 400, codeInvalidField, "event_id"},
		{"exchange without items", exchange, nil, `{"reason":"x"}`, 400, codeInvalidField, "items"},
		{"exchange to itself", exchange, nil, `{"items":[{"sku":"A","qty":1}],"new_order_no":"SO1"}`, 400, codeInvalidField, "new_order_no"},
		{"bad order number", "/v1/orders/SO.1/modify", nil, modifyBody, 400, codeInvalidParameter, "order_no"},
		{"long order number", "/v1/orders/" + strings.Repeat("A", 65) + "/exchange", nil, exchangeBody, 400, codeInvalidParameter, "order_no"},
		{"order_no differs", modify, nil, `{"order_no":"SO2","changes":{"remark":"x"}}`, 400, codeInvalidField, "order_no"},
		{"no key", modify, map[string]string{HeaderIdempotencyKey: ""}, modifyBody, 400, codeKeyRequired, HeaderIdempotencyKey},
		{"key with space", modify, map[string]string{HeaderIdempotencyKey: "a b"}, modifyBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"key with a path", modify, map[string]string{HeaderIdempotencyKey: "../pending_tasks:delete_all"}, modifyBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"key with a query", exchange, map[string]string{HeaderIdempotencyKey: "evt?x=1"}, exchangeBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"key with a percent", modify, map[string]string{HeaderIdempotencyKey: "evt%2F1"}, modifyBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"event_id with a path in body", exchange, map[string]string{HeaderIdempotencyKey: ""}, `{"event_id":"../pending_tasks:delete_all","items":[{"sku":"A","qty":1}]}`, 400, codeInvalidField, "event_id"},
		{"key too long", exchange, map[string]string{HeaderIdempotencyKey: strings.Repeat("k", 129)}, exchangeBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"bad quoted key", modify, map[string]string{HeaderIdempotencyKey: `"a\b"`}, modifyBody, 400, codeInvalidParameter, HeaderIdempotencyKey},
		{"keys differ", modify, nil, `{"event_id":"other","changes":{"remark":"x"}}`, 400, codeKeyMismatch, "event_id"},
		{"text body", modify, map[string]string{"Content-Type": "text/plain"}, modifyBody, 415, codeUnsupportedMedia, "Content-Type"},
		{"form body", exchange, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, exchangeBody, 415, codeUnsupportedMedia, "Content-Type"},
		{"too large", modify, nil, `{"changes":{"remark":"` + strings.Repeat("x", DefaultMaxBody) + `"}}`, 413, codeBodyTooLarge, ""},
		{"too large exchange", exchange, nil, `{"reason":"` + strings.Repeat("x", DefaultMaxBody) + `"}`, 413, codeBodyTooLarge, ""},
		{"no credentials", modify, map[string]string{"Authorization": ""}, modifyBody, 401, codeUnauthorized, ""},
		{"wrong key", exchange, map[string]string{"Authorization": "Bearer not-a-key-0123456789"}, exchangeBody, 401, codeUnauthorized, ""},
	}
	// The refusals every kind's route makes alike, for each kind of the
	// table, so that a kind added to it has its route's 4xx covered.
	for _, k := range tasks.Kinds() {
		path, body := kindPath(k, "SO1"), kindBody(t, k)
		tests = append(tests, []rejection{
			{k.Name + " not json", path, nil, body[:len(body)-1], 400, codeMalformedBody, ""},
			{k.Name + " unknown field", path, nil, `{"not_a_member":1,` + body[1:], 400, codeInvalidField, "not_a_member"},
			{k.Name + " keys differ", path, nil, `{"event_id":"other",` + body[1:], 400, codeKeyMismatch, "event_id"},
			{k.Name + " bad order number", kindPath(k, "SO.1"), nil, body, 400, codeInvalidParameter, "order_no"},
			{k.Name + " text body", path, map[string]string{"Content-Type": "text/plain"}, body, 415, codeUnsupportedMedia, "Content-Type"},
			{k.Name + " too large", path, nil, body + strings.Repeat(" ", DefaultMaxBody), 413, codeBodyTooLarge, ""},
		}...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			header := map[string]string{HeaderIdempotencyKey: "evt-" + strings.ReplaceAll(tt.name, " ", "-")}
			for k, v := range tt.header {
				header[k] = v
			}
			r := e.do(t, http.MethodPost, tt.path, tt.body, header)
			require.Equal(t, tt.status, r.status, "%s", r.body)
			body := r.errorBody(t)
			assert.Equal(t, tt.code, body.Error.Code, body.Error.Message)
			assert.Equal(t, tt.field, body.Error.Field, body.Error.Message)
		})
	}
	// Also a valid request with a JSON media type other than the plain one.
	r := e.do(t, http.MethodPost, modify, modifyBody, map[string]string{
		HeaderIdempotencyKey: "evt-ok", "Content-Type": "application/merge-patch+json; charset=utf-8"})
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	assert.Equal(t, 1, e.queued(t), "no 4xx enqueues anything")
}

// TestEnqueueBodyLimit checks the limit on bodies with and without a
// Content-Length, and a configured limit.
func TestEnqueueBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxBody = 100 })
	padded := func(n int) string { return modifyBody + strings.Repeat(" ", n-len(modifyBody)) }

	require.Equal(t, http.StatusAccepted, e.post(t, "/v1/orders/SO1/modify", "evt-100", padded(100)).status)

	r := e.post(t, "/v1/orders/SO1/modify", "evt-101", padded(101))
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status, "%s", r.body)
	assert.Equal(t, codeBodyTooLarge, r.errorBody(t).Error.Code)

	// Of unknown length (so sent chunked): only reading finds out.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL+"/v1/orders/SO1/modify",
		io.MultiReader(strings.NewReader(padded(101))))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key1)
	req.Header.Set(HeaderIdempotencyKey, "evt-chunked")
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	assert.Equal(t, 1, e.queued(t))
}

// TestEnqueueConcurrentSameKey sends one request from 50 clients at once:
// exactly one is enqueued, and the others learn its task ID.
func TestEnqueueConcurrentSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const clients = 50
	start := make(chan struct{})
	results := make(chan response, clients)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			<-start
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL+"/v1/orders/SO1/modify", strings.NewReader(modifyBody))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("Authorization", "Bearer "+key2)
			req.Header.Set(HeaderIdempotencyKey, "evt-race")
			resp, err := e.srv.Client().Do(req)
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			results <- response{status: resp.StatusCode, header: resp.Header, body: b}
		})
	}
	close(start)
	wg.Wait()
	close(results)

	counts := map[int]int{}
	for r := range results {
		counts[r.status]++
		switch r.status {
		case http.StatusAccepted:
			var res producer.Result
			r.decode(t, &res)
			assert.Equal(t, "evt-race", res.TaskID)
		case http.StatusConflict:
			assert.Equal(t, "evt-race", r.errorBody(t).TaskID)
		}
	}
	assert.Equal(t, map[int]int{http.StatusAccepted: 1, http.StatusConflict: clients - 1}, counts)
	assert.Equal(t, 1, e.queued(t))
}

// TestGetTask reads tasks back, including an ID that needs escaping.
func TestGetTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const id = "crm:7.a_b-c"
	r := e.post(t, "/v1/orders/SO1/modify", id, modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	loc := r.header.Get("Location")
	assert.Equal(t, "/v1/tasks/crm:7.a_b-c", loc)

	r = e.do(t, http.MethodGet, loc, "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var got map[string]any
	r.decode(t, &got)
	assert.Equal(t, map[string]any{
		"task_id": id, "queue": tasks.QueueModify, "type": tasks.TypeModify, "state": "pending",
		"max_retry": float64(producer.DefaultMaxRetry), "retried": float64(0), // the failure budget
	}, got)

	r = e.do(t, http.MethodGet, loc+"?queue="+tasks.QueueModify, "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	r = e.do(t, http.MethodGet, loc+"?queue="+tasks.QueueExchange, "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	assert.Equal(t, codeNotFound, r.errorBody(t).Error.Code)

	r = e.do(t, http.MethodGet, "/v1/tasks/unknown", "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)

	r = e.do(t, http.MethodGet, loc+"?queue=default", "", nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, "queue", r.errorBody(t).Error.Field)

	for _, bad := range []string{"a%20b", "..%2Fpending_tasks:delete_all", "crm%3F7", ".hidden"} {
		r = e.do(t, http.MethodGet, "/v1/tasks/"+bad, "", nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r.body)
		body := r.errorBody(t)
		assert.Equal(t, "task_id", body.Error.Field, bad)
		assert.Contains(t, body.Error.Message, tasks.EventIDRule, bad)
	}
}

// TestGetTaskOfAnUnlistedQueue reads, as the intake's Redis user, a task
// whose queue is missing from asynq's set of queues (lost in a failover,
// say): it is answered, and its queue listed again, not taken for gone.
// A duplicate of it is still refused as one. A task that does not exist is
// still 404.
func TestGetTaskOfAnUnlistedQueue(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	if db.Kind == redistest.External {
		t.Skip("it changes asynq's set of queues, which the tests share on TEST_REDIS_URL")
	}
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	e := newEnvOn(t, db.AsUser(t, rules...).Client, db.Prefix, nil)
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(tasks.QueueModify, true) })
	require.Equal(t, http.StatusAccepted, e.post(t, "/v1/orders/SO1/modify", "evt-unlisted", modifyBody).status)
	require.NoError(t, db.Client.SRem(t.Context(), asynqredis.AllQueues, tasks.QueueModify).Err())

	r := e.do(t, http.MethodGet, "/v1/tasks/evt-unlisted", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var got taskView
	require.NoError(t, json.Unmarshal(r.body, &got))
	assert.Equal(t, "pending", got.State)
	assert.Equal(t, tasks.QueueModify, got.Queue)
	listed, err := db.Client.SIsMember(t.Context(), asynqredis.AllQueues, tasks.QueueModify).Result()
	require.NoError(t, err)
	assert.True(t, listed, "listed again")

	require.NoError(t, db.Client.SRem(t.Context(), asynqredis.AllQueues, tasks.QueueModify).Err())
	r = e.do(t, http.MethodGet, "/v1/tasks/evt-none", "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	r = e.post(t, "/v1/orders/SO1/modify", "evt-unlisted", modifyBody)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
}

// TestGetTaskFailed runs a task that fails for good and reads its error.
func TestGetTaskFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	require.Equal(t, http.StatusAccepted, e.post(t, "/v1/orders/SO1/exchange", "evt-fail", exchangeBody).status)

	ran := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 1,
		Queues:      map[string]int{tasks.QueueExchange: 1},
		LogLevel:    asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(_ context.Context, _ *asynq.Task) error {
		close(ran)
		return fmt.Errorf("order SO1 is closed: %w", asynq.SkipRetry)
	})))
	defer srv.Shutdown()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not run")
	}

	// asynq archives the task after the handler returns.
	var got taskView
	require.Eventually(t, func() bool {
		info, err := e.insp.GetTaskInfo(tasks.QueueExchange, "evt-fail")
		return err == nil && info.State == asynq.TaskStateArchived
	}, 10*time.Second, 10*time.Millisecond)
	r := e.do(t, http.MethodGet, "/v1/tasks/evt-fail", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.NoError(t, json.Unmarshal(r.body, &got))
	assert.Equal(t, "archived", got.State)
	assert.Equal(t, tasks.QueueExchange, got.Queue)
	assert.Contains(t, got.LastError, "order SO1 is closed")
	assert.False(t, got.LastFailedAt.IsZero())
	assert.Equal(t, time.UTC, got.LastFailedAt.Location())
}

// A change past the order's backlog cap (the producer's MaxWaiting) is
// answered 429 backlog_full with Retry-After, and nothing is enqueued; the
// other orders go on.
func TestEnqueueBacklogFull(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, MaxWaiting: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	s, err := New(db.Client, p, store, Config{APIKeys: []string{key1}})
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	e := &env{srv: srv, rdb: db.Client, store: store, insp: asynq.NewInspectorFromRedisClient(db.Client)}

	for _, id := range []string{"evt-1", "evt-2"} {
		r := e.post(t, "/v1/orders/SO1/modify", id, modifyBody)
		require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	}
	r := e.post(t, "/v1/orders/SO1/modify", "evt-3", modifyBody)
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, "backlog_full", r.errorBody(t).Error.Code)
	require.Equal(t, "5", r.header.Get("Retry-After"))
	_, err = e.insp.GetTaskInfo(tasks.QueueModify, "evt-3")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
	require.Equal(t, 2, e.queued(t))

	r = e.post(t, "/v1/orders/SO2/modify", "evt-4", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
}
