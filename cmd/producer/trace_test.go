package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
)

// A script that passes its trace in TRACEPARENT to the command line gets
// a change that carries it: the task's trace context is a span of that
// trace, exported to the OTLP endpoint. Without the OTEL_* variables the
// command adds no trace context.
func TestCLIJoinsTheTraceOfTRACEPARENT(t *testing.T) {
	db := redistest.New(t)
	var exports atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			exports.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(collector.Close)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix}
	cli := cliWith(t, env)
	_, err := cli("modify", "SO-T", "-remark", "untraced", "-event-id", "ev-untraced")
	require.NoError(t, err)

	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL
	env["TRACEPARENT"] = "00-" + traceID + "-00f067aa0ba902b7-01"
	_, err = cli("modify", "SO-T", "-remark", "traced", "-event-id", "ev-traced")
	require.NoError(t, err)
	require.Positive(t, exports.Load(), "the span was flushed before the command returned")

	payload := func(id string) tasks.ModifyPayload {
		info, err := insp.GetTaskInfo(tasks.QueueModify, id)
		require.NoError(t, err)
		var p tasks.ModifyPayload
		require.NoError(t, json.Unmarshal(info.Payload, &p))
		return p
	}
	require.Nil(t, payload("ev-untraced").Trace)
	tc := payload("ev-traced").Trace
	require.NotNil(t, tc)
	require.True(t, strings.HasPrefix(tc.Traceparent, "00-"+traceID+"-"), "the change joins the script's trace: %s", tc.Traceparent)
	require.NotContains(t, tc.Traceparent, "00f067aa0ba902b7", "under a span of its own (the enqueue)")
}
