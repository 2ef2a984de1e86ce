package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// TestCLIOrderActions holds, resumes and skips an order's head from the
// command line (no worker runs: the changes wait), with the principal from
// USER or -by, and reads the actions back from the order's status and,
// noted by the intake-admin user, from its history.
func TestCLIOrderActions(t *testing.T) {
	db := redistest.New(t)
	// As the Redis user of the intake-admin rules.
	rules, err := acl.Rules(acl.IntakeAdmin, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	env := map[string]string{"REDIS_URL": db.AsUser(t, rules...).URL(), "KEY_PREFIX": db.Prefix, "USER": "opsuser"}
	cli := cliWith(t, env)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO7", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

	_, err = cli("modify", "SO7", "-remark", "one", "-event-id", "act-1")
	require.NoError(t, err)
	_, err = cli("modify", "SO7", "-remark", "two", "-event-id", "act-2")
	require.NoError(t, err)

	_, err = cli("order", "hold", "SO7")
	require.ErrorIs(t, err, orderops.ErrInvalid, "hold needs -reason")
	out, err := cli("order", "hold", "SO7", "-reason", "fraud check")
	require.NoError(t, err)
	var res orderops.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, orderops.Result{OrderNo: "SO7", Action: orderops.Hold, By: "cli:opsuser", Reason: "fraud check", Detail: res.Detail}, res)
	_, err = cli("order", "hold", "SO7", "-reason", "again")
	require.ErrorIs(t, err, orderops.ErrRefused)
	_, err = cli("order", "resume", "-by", "admin#1", "SO7")
	require.ErrorIs(t, err, orderops.ErrInvalid, "a CLI principal may not pass for an admin key")
	out, err = cli("order", "resume", "-by", "lead", "SO7")
	require.NoError(t, err)
	require.Contains(t, out, `"by": "cli:lead"`)

	_, err = cli("order", "retry", "SO7")
	require.ErrorIs(t, err, orderops.ErrRefused, "the head is pending: already due")
	out, err = cli("order", "skip", "SO7", "-reason", "duplicate of a phone order")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, "act-1", res.TaskID)
	info, err := insp.GetTaskInfo(tasks.QueueModify, "act-1")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)
	require.Equal(t, "skipped by cli:opsuser: duplicate of a phone order", info.LastErr, "archived with the skip's reason, by the intake-admin user")

	out, err = cli("order", "status", "SO7")
	require.NoError(t, err)
	for _, want := range []string{"hold by cli:opsuser: fraud check", "resume by cli:lead", "skipped by cli:opsuser: duplicate of a phone order"} {
		require.Contains(t, out, want)
	}
	out, err = cli("order", "history", "SO7")
	require.NoError(t, err)
	var h orderview.History
	require.NoError(t, json.Unmarshal([]byte(out), &h))
	var notes []string
	for _, e := range h.Entries {
		if e.Type == orders.TypeNote {
			notes = append(notes, e.Worker+" | "+e.Detail)
		}
	}
	require.Equal(t, []string{
		"cli:opsuser | hold by cli:opsuser: fraud check",
		"cli:lead | resume by cli:lead",
		fmt.Sprintf("cli:opsuser | skipped position %d by cli:opsuser: duplicate of a phone order", res.Seq),
	}, notes, "each action is noted in the order's history: %s", out)
	_, err = cli("order", "skip", "SO7", "SO8", "-reason", "x")
	require.Error(t, err, "one order number")
}

// TestCLIOrderActionsRefusedToTheIntakeUser runs the operator actions as
// the plain intake user, as `producer acl intake` prints its rules: each
// is refused, saying which user to run it as, and nothing is held.
func TestCLIOrderActionsRefusedToTheIntakeUser(t *testing.T) {
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	cli := cliWith(t, map[string]string{"REDIS_URL": db.AsUser(t, rules...).URL(), "KEY_PREFIX": db.Prefix, "USER": "eve"})
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), orders.Order{No: "SO7", Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	for _, a := range orderops.Actions() {
		_, err := cli("order", string(a), "SO7", "-reason", "x")
		require.ErrorIs(t, err, orderops.ErrNotAllowed, a)
		require.ErrorContains(t, err, "intake-admin")
	}
	n, err := db.Client.Exists(t.Context(), db.Prefix+"lock:{SO7}:seq").Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing was held")
}
