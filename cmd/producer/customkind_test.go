package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/orderworker/orderworker/internal/intake"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/testkind"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
)

// customKind is the test's kind, test:custom-kind (package testkind), made
// as docs/adding-a-task-type.md's example is. It is handed to the producer
// (and through it to the intake, its views and actions) and to the worker
// in their configuration, and nowhere else.
var customKind = testkind.Kind

// failReason is the reason of a custom-kind task that the test's worker fails to
// apply, as an upstream that is down would.
const failReason = "fail: upstream down"

// customEntry is the worker's entry of customKind. It cancels through an
// existing store write (a modify of the remark), so the order's history
// records the change as an order:modify: the order status must still find
// the test:custom-kind task that made it.
func customEntry() worker.Kind {
	var wait worker.Wait
	for _, k := range worker.Kinds() {
		if k.Kind == tasks.Modify {
			wait = k.Wait
		}
	}
	return worker.NewKind(wait, func(ctx context.Context, store orders.Modifier, c testkind.Payload) error {
		if c.Reason == failReason {
			return errors.New("test:custom-kind: upstream down")
		}
		remark := "cancelled: " + c.Reason
		_, err := store.Modify(ctx, c.EventID, c.OrderNo, orders.Changes{Remark: &remark})
		return err
	})
}

// TestACustomKindEndToEnd drives a kind of the test's own, test:custom-kind,
// through every reader of kinds over the intake (real Redis, real HTTP
// socket) and a worker: its POST route enqueues it to its own queue, the
// worker applies it, the order status finds its task by the history entry
// it wrote (whose type is not its task type), the blocked list shows its
// failing head, and an operator action skips it. None of these knew the
// kind before it was configured.
func TestACustomKindEndToEnd(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()
	kinds := append(tasks.Kinds(), customKind)
	require.NoError(t, kinds.Validate())

	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	for _, no := range []string{"SO-CUSTOM-1", "SO-CUSTOM-2"} {
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}

	done := make(chan worker.Done, 100)
	w, err := worker.New(db.Client, store, worker.Config{KeyPrefix: db.Prefix, Logger: zaptest.NewLogger(t),
		Kinds: append(worker.Kinds(), customEntry()), TaskCheckInterval: 50 * time.Millisecond,
		OnDone: func(d worker.Done) { done <- d }})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)

	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, Kinds: kinds})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	const apiKey, adminKey = "custom-kind-key-0123456789", "custom-kind-admin-0123456789"
	in, err := intake.New(db.Client, p, store, intake.Config{APIKeys: []string{apiKey}, AdminKeys: []string{adminKey},
		BlockedAfter: time.Millisecond, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(in)
	t.Cleanup(srv.Close)

	call := func(method, path, key string, body any, header map[string]string) (int, []byte) {
		t.Helper()
		var r io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			require.NoError(t, err)
			r = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, r)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	waitDone := func(eventID string) worker.Done {
		t.Helper()
		timeout := time.After(15 * time.Second)
		for {
			select {
			case d := <-done:
				if d.EventID == eventID && d.Outcome != worker.OutcomeWaiting && d.Outcome != worker.OutcomeBusy {
					return d
				}
			case <-timeout:
				t.Fatalf("the worker did not run %s", eventID)
			}
		}
	}

	// The intake's route, from the producer's kinds.
	assert.Contains(t, intake.Routes(kinds), intake.Route{Method: http.MethodPost, Path: "/v1/orders/{order_no}/test-custom-kind", Limited: true})
	status, body := call(http.MethodPost, "/v1/orders/SO-CUSTOM-1/test-custom-kind", apiKey, map[string]string{"reason": "customer asked"},
		map[string]string{intake.HeaderIdempotencyKey: "custom-1"})
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	var res producer.Result
	require.NoError(t, json.Unmarshal(body, &res))
	assert.Equal(t, "test_custom_kind", res.Queue)
	require.Positive(t, res.Seq)
	// A body the kind refuses is the intake's 400, and nothing is enqueued.
	status, body = call(http.MethodPost, "/v1/orders/SO-CUSTOM-1/test-custom-kind", apiKey, map[string]string{},
		map[string]string{intake.HeaderIdempotencyKey: "custom-bad"})
	require.Equal(t, http.StatusBadRequest, status, "%s", body)

	d := waitDone("custom-1")
	require.Equal(t, worker.OutcomeOK, d.Outcome, "%v", d.Err)
	assert.Equal(t, "test_custom_kind", d.Queue)

	// The order status finds the task by the history entry it wrote, an
	// order:modify: it looks in the custom kind's queue too.
	status, body = call(http.MethodGet, "/v1/orders/SO-CUSTOM-1/status", apiKey, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var st orderview.Status
	require.NoError(t, json.Unmarshal(body, &st))
	require.NotEmpty(t, st.History)
	last := st.History[len(st.History)-1]
	assert.Equal(t, []string{"custom-1", orders.TypeModify}, []string{last.EventID, last.Type})
	require.Len(t, st.Tasks, 1, "%+v", st.Tasks)
	assert.Equal(t, "custom-1", st.Tasks[0].TaskID)
	assert.Equal(t, customKind.Type, st.Tasks[0].Type)
	assert.Equal(t, "test_custom_kind", st.Tasks[0].Queue)
	assert.Equal(t, orderview.SourceHistory, st.Tasks[0].Source)
	assert.Equal(t, res.Seq, st.Tasks[0].Seq, "its position, read from its payload as a custom-kind task")

	// A custom-kind task that fails is the head of its order: the status
	// and the blocked list show it, in the custom kind's queue.
	status, body = call(http.MethodPost, "/v1/orders/SO-CUSTOM-2/test-custom-kind", apiKey, map[string]string{"reason": failReason},
		map[string]string{intake.HeaderIdempotencyKey: "custom-2"})
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	require.NoError(t, json.Unmarshal(body, &res))
	d = waitDone("custom-2")
	require.Equal(t, worker.OutcomeError, d.Outcome, "%v", d.Err)

	status, body = call(http.MethodGet, "/v1/orders/SO-CUSTOM-2/status", apiKey, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	st = orderview.Status{}
	require.NoError(t, json.Unmarshal(body, &st))
	require.Len(t, st.Sequence.Waiting, 1)
	assert.Equal(t, []string{"custom-2", "test_custom_kind", "retry"},
		[]string{st.Sequence.Waiting[0].TaskID, st.Sequence.Waiting[0].Queue, st.Sequence.Waiting[0].TaskState})
	assert.Contains(t, st.Summary[0], fmt.Sprintf("Its next change fails: task custom-2 (test:custom-kind, position %d)", res.Seq))

	status, body = call(http.MethodGet, "/v1/blocked-orders", apiKey, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var page orderview.BlockedPage
	require.NoError(t, json.Unmarshal(body, &page))
	var blocked *orderview.BlockedOrder
	for i := range page.Orders {
		if page.Orders[i].OrderNo == "SO-CUSTOM-2" {
			blocked = &page.Orders[i]
		}
	}
	require.NotNil(t, blocked, "the blocked list: %s", body)
	assert.Equal(t, orderview.ReasonFailing, blocked.Reason, blocked.Explanation)
	require.NotNil(t, blocked.Failing)
	assert.Equal(t, []string{"custom-2", "test_custom_kind"}, []string{blocked.Failing.TaskID, blocked.Failing.Queue})

	// The operator skips it: the action finds its task in the custom
	// kind's queue and archives it.
	status, body = call(http.MethodPost, "/v1/orders/SO-CUSTOM-2/actions/skip", adminKey, map[string]string{"reason": "cancelled by phone"}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var act orderops.Result
	require.NoError(t, json.Unmarshal(body, &act))
	assert.Equal(t, []string{"custom-2", "test_custom_kind"}, []string{act.TaskID, act.Queue})
	assert.Equal(t, fmt.Sprintf("task custom-2 archived and position %d skipped", res.Seq), act.Detail)
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo("test_custom_kind", "custom-2")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateArchived, info.State)

	status, body = call(http.MethodGet, "/v1/blocked-orders", apiKey, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.NotContains(t, string(body), "SO-CUSTOM-2", "skipped, the order is no longer blocked")
}
