package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/internal/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/stretchr/testify/require"
)

// TestCLI drives the commands as a user would and reads back what they did.
func TestCLI(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix}
	cli := func(args ...string) (string, error) {
		var out strings.Builder
		err := run(t.Context(), args, func(k string) string { return env[k] }, &out)
		return out.String(), err
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		_ = insp.DeleteQueue(tasks.QueueModify, true)
		_ = insp.DeleteQueue(tasks.QueueExchange, true)
	})

	out, err := cli("order", "put", "SO1", "-address", "1 Main St", "-item", "TEA=2")
	require.NoError(t, err)
	var o orders.Order
	require.NoError(t, json.Unmarshal([]byte(out), &o))
	require.Equal(t, "1 Main St", o.Address)

	out, err = cli("modify", "SO1", "-remark", "ring twice", "-event-id", "ev-cli")
	require.NoError(t, err)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Positive(t, res["seq"], "the change's position")
	delete(res, "seq")
	require.Equal(t, map[string]any{"task_id": "ev-cli", "queue": "order_modify", "event_id": "ev-cli"}, res)
	_, err = cli("modify", "SO1", "-remark", "ring twice", "-event-id", "ev-cli")
	require.ErrorContains(t, err, "duplicate")

	out, err = cli("-key-prefix", db.Prefix, "exchange", "SO1", "-item", "TEA-BLACK=2", "-new-order-no", "SO2", "-reason", "wrong tea")
	require.NoError(t, err)
	require.Contains(t, out, `"queue": "order_exchange"`)
	info, err := insp.GetTaskInfo(tasks.QueueExchange, strings.Split(strings.Split(out, `"task_id": "`)[1], `"`)[0])
	require.NoError(t, err)
	p, err := tasks.ParseExchange(info.Payload)
	require.NoError(t, err)
	require.Equal(t, "SO2", p.NewOrderNo)

	out, err = cli("order", "history", "SO1")
	require.NoError(t, err)
	require.Contains(t, out, `"type": "order:put"`)

	for _, bad := range [][]string{
		{"modify"},                        // no order number
		{"modify", "SO1", "-item", "TEA"}, // not SKU=QTY
		{"exchange", "SO1"},               // no items
		{"order", "get", "SO-none"},       // unknown order
		{"order", "frobnicate", "SO1"},    // unknown subcommand
		{"frobnicate"},                    // unknown command
	} {
		_, err := cli(bad...)
		require.Error(t, err, "%v", bad)
	}
}
