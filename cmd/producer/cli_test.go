package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// cliWith returns a runner of the command line with the settings of env,
// read at each run (a test may change them between runs): it returns what
// the command printed and its error.
func cliWith(t *testing.T, env map[string]string) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		var out strings.Builder
		err := run(t.Context(), args, func(k string) string { return env[k] }, &out)
		return out.String(), err
	}
}

// TestCLI drives the commands as a user would and reads back what they did.
func TestCLI(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix}
	cli := cliWith(t, env)
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
	p, err := tasks.Parse[tasks.ExchangePayload](info.Payload)
	require.NoError(t, err)
	require.Equal(t, "SO2", p.NewOrderNo)

	out, err = cli("order", "history", "SO1")
	require.NoError(t, err)
	require.Contains(t, out, `"type": "order:put"`)

	// Text from outside prints with its bidirectional and C1 controls
	// escaped, and decodes the same.
	_, err = cli("order", "put", "SO3", "-address", "1 Main St", "-remark", "txt\u202eexe.\u009b2J", "-item", "TEA=1")
	require.NoError(t, err)
	out, err = cli("order", "get", "SO3")
	require.NoError(t, err)
	require.NotContains(t, out, "\u202e")
	require.NotContains(t, out, "\u009b")
	require.Contains(t, out, `"remark": "txt\u202eexe.\u009b2J"`)
	require.NoError(t, json.Unmarshal([]byte(out), &o))
	require.Equal(t, "txt\u202eexe.\u009b2J", o.Remark)

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

// TestCLIOrderStatus prints the status of an order with a change applied,
// one archived, the next one retrying and one parked behind it: as text for
// a terminal, and as the intake's JSON with -json.
func TestCLIOrderStatus(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "GAP_WAIT": "45s"}
	cli := cliWith(t, env)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		_ = insp.DeleteQueue(tasks.QueueModify, true)
		_ = insp.DeleteQueue(tasks.QueueExchange, true)
	})
	s := orderviewtest.Build(t, db.Client, db.Prefix, "SO1001")

	out, err := cli("order", "status", "SO1001")
	require.NoError(t, err)
	t.Log("\n" + out)
	for _, want := range []string{
		"SO1001  active  version 2  written ",
		"address  2 New Rd, " + s.Applied,
		"What is happening (at ",
		"Lock: free",
		fmt.Sprintf("Sequence: last finished position (cursor) %d, last handed out %d; 2 waiting", s.Seq[s.Archived], s.Seq[s.Parked]),
		fmt.Sprintf("%d  next  reserved  order:modify %s  retry", s.Seq[s.Retried], s.Retried),
		"note  order:modify " + s.Archived + "  archived: failed 1 times, out of its failure budget of 0 retries: " + orderviewtest.FailArchived,
		s.Retried + ": its turn: failed 1 of 6 allowed times; runs again at ",
		"    last error: " + orderviewtest.FailRetried,
		s.Parked + ": waits for its turn (1 position is ahead of it): parked in asynq's retry set, not failed",
		"History (latest 2 of 2):",
	} {
		require.Contains(t, out, want)
	}
	require.Regexp(t, `(?m)^  `+s.Applied+` +order_modify +completed +\d+ +0/5 +history$`, out)
	require.Regexp(t, `(?m)^  `+s.Archived+` +order_modify +archived +\d+ +0/0 +log$`, out)

	out, err = cli("order", "status", "-json", "SO1001")
	require.NoError(t, err)
	var st orderview.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, s.Seq[s.Archived], st.Sequence.Done)
	require.Len(t, st.Tasks, 4)

	out, err = cli("order", "status", "SO-NONE")
	require.NoError(t, err)
	require.Contains(t, out, "SO-NONE: not in the order store")
	require.Contains(t, out, "Nothing is known of SO-NONE")
	_, err = cli("order", "status", "S O")
	require.ErrorIs(t, err, orders.ErrInvalid)
	_, err = cli("order", "status")
	require.Error(t, err)

	// A backlog of 3,000: the count and the first page (50).
	fields := []any{"n", 4000, "d", 1000}
	for i := 1; i <= 3000; i++ {
		fields = append(fields, "p:"+strconv.Itoa(1000+i), "1700000000000 m ev-"+strconv.Itoa(i))
	}
	require.NoError(t, db.Client.HSet(t.Context(), db.Prefix+"lock:{SO-BIG}:seq", fields...).Err())
	out, err = cli("order", "status", "SO-BIG")
	require.NoError(t, err)
	require.Contains(t, out, "last handed out 4000; 3,000 waiting")
	require.Contains(t, out, "  (the first 50 listed, and 2,950 more)")
	require.Regexp(t, `(?m)^  1050  +reserved`, out)
	require.NotContains(t, out, "1051")
}

// clean keeps what a terminal shows as text and escapes what it would
// obey.
func TestClean(t *testing.T) {
	tests := []struct{ in, want string }{
		{"1 Main St, Springfield", "1 Main St, Springfield"},
		{"Straße ✓", "Straße ✓"},
		{"line\nbreak\ttab", `line\nbreak\ttab`},
		{"\x1b[2Jgone", `\x1b[2Jgone`},
		{"\u202eevil", `\u202eevil`},
		{"bad \xff byte", `bad \xff byte`},
		{"\u0085next", `\u0085next`},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, clean(tt.in), "%q", tt.in)
	}
}

// TestACL prints each process's rules, for the settings before the command,
// without a Redis.
func TestACL(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"} // never dialled
	cli := cliWith(t, env)
	for _, p := range acl.Processes() {
		out, err := cli("acl", string(p))
		require.NoError(t, err)
		want, err := acl.Rules(p, acl.Options{})
		require.NoError(t, err)
		require.Equal(t, strings.Join(want, " ")+"\n", out, p)

		out, err = cli("-key-prefix", "shop1:", "-order-store", "http", "acl", string(p))
		require.NoError(t, err)
		want, err = acl.Rules(p, acl.Options{KeyPrefix: "shop1:", OrderAPI: true})
		require.NoError(t, err)
		require.Equal(t, strings.Join(want, " ")+"\n", out, p)
	}
	env["KEY_PREFIX"] = "shop2:"
	out, err := cli("acl", "intake")
	require.NoError(t, err)
	require.Contains(t, out, "~shop2:event:{*", "KEY_PREFIX from the environment")
	require.NotContains(t, out, "ow:")

	for _, bad := range [][]string{{"acl"}, {"acl", "worker", "intake"}, {"acl", "scheduler"}, {"-key-prefix", "a b:", "acl", "worker"}} {
		out, err := cli(bad...)
		require.Error(t, err, "%v", bad)
		require.Empty(t, out)
	}
}

// aclDoc is docs/operations.md's block of `producer acl` runs, for the default
// settings.
func aclDoc(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("```\n")
	for _, p := range acl.Processes() {
		rules, err := acl.Rules(p, acl.Options{})
		require.NoError(t, err)
		fmt.Fprintf(&b, "$ producer acl %s\n%s\n", p, strings.Join(rules, " "))
	}
	b.WriteString("```\n")
	return b.String()
}

// TestDocsShowTheACLRules checks the ACL rules in docs/operations.md
// against what `producer acl` prints; UPDATE_DOCS=1 rewrites them.
func TestDocsShowTheACLRules(t *testing.T) {
	const path, begin, end = "../../docs/operations.md", "<!-- acl-rules:begin -->\n", "<!-- acl-rules:end -->"
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	before, rest, ok := strings.Cut(string(doc), begin)
	require.True(t, ok, "%s has no %q", path, begin)
	old, after, ok := strings.Cut(rest, end)
	require.True(t, ok, "%s has no %q", path, end)
	want := aclDoc(t)
	if os.Getenv("UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(path, []byte(before+begin+want+end+after), 0o644))
		return
	}
	require.Equal(t, want, old, "the ACL rules in %s are not what `producer acl` prints (UPDATE_DOCS=1 go test -run TestDocsShowTheACLRules ./cmd/producer/ rewrites them)", path)
}

// TestCLIOrderBlockedWithAWronglyTypedSequence runs `producer order
// blocked` as the intake's Redis user after that user overwrote an order's
// sequence with a string: that order is listed as unreadable, the others
// as before, and the command succeeds.
func TestCLIOrderBlockedWithAWronglyTypedSequence(t *testing.T) {
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	intake := db.AsUser(t, rules...)
	cli := cliWith(t, map[string]string{"REDIS_URL": intake.URL(), "KEY_PREFIX": db.Prefix, "BLOCKED_AFTER": "1ms"})
	t.Cleanup(func() { _ = asynq.NewInspectorFromRedisClient(db.Client).DeleteQueue(tasks.QueueModify, true) })
	orderviewtest.Later(t, db.Client, db.Prefix, "SO21", "SO22")
	orderviewtest.WrongTypeSeq(t, intake.Client, db.Prefix, "SO21")

	out, err := cli("order", "blocked")
	require.NoError(t, err)
	t.Log("\n" + out)
	for _, want := range []string{"SO21   unreadable", "SO22   scheduled", "SO21: It cannot be read: ", "WRONGTYPE"} {
		require.Contains(t, out, want)
	}
	out, err = cli("order", "blocked", "-json")
	require.NoError(t, err)
	var page orderview.BlockedPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Equal(t, 1, page.Counts[orderview.ReasonUnreadable])
	require.Equal(t, 1, page.Counts[orderview.ReasonScheduled])
}

// TestCLIOrderBlocked lists an order whose next change keeps failing, as
// text and as the intake's JSON, and none before BLOCKED_AFTER.
func TestCLIOrderBlocked(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": db.URL(), "KEY_PREFIX": db.Prefix, "BLOCKED_AFTER": "1ms"}
	cli := cliWith(t, env)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		_ = insp.DeleteQueue(tasks.QueueModify, true)
		_ = insp.DeleteQueue(tasks.QueueExchange, true)
	})
	s := orderviewtest.Build(t, db.Client, db.Prefix, "SO1001")

	out, err := cli("order", "blocked")
	require.NoError(t, err)
	t.Log("\n" + out)
	for _, want := range []string{"Blocked orders at ", "longer than 1ms", ": 1", "SO1001  failing", "order:modify " + s.Retried + " (retry)",
		"SO1001: Its next change, task " + s.Retried + ", failed 1 time(s)", orderviewtest.FailRetried} {
		require.Contains(t, out, want)
	}

	out, err = cli("order", "blocked", "-json", "-limit", "5", "-reason", "failing")
	require.NoError(t, err)
	var page orderview.BlockedPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Orders, 1)
	require.Equal(t, orderview.ReasonFailing, page.Orders[0].Reason)
	require.Equal(t, s.Retried, page.Orders[0].Failing.TaskID)

	_, err = cli("order", "blocked", "-reason", "bored")
	require.ErrorIs(t, err, orderview.ErrBadQuery)
	_, err = cli("order", "blocked", "SO1")
	require.Error(t, err)

	env["BLOCKED_AFTER"] = "1h"
	out, err = cli("order", "blocked")
	require.NoError(t, err)
	require.Contains(t, out, "none")
}

// The help of a kind's JSON command shows the kind's example, when it has
// one.
func TestUsageShowsTheKindsExample(t *testing.T) {
	t.Parallel()
	with := tasks.NewKind[tasks.ModifyPayload]("test:with", "test-with", "test_with", 1, tasks.WithExample(`{"changes":{"remark":"r"}}`))
	without := tasks.NewKind[tasks.ModifyPayload]("test:without", "test-without", "test_without", 1)
	help := usage(tasks.Table{with, without})
	require.Contains(t, help, "  test-with <order_no> -json PAYLOAD [-event-id ID]\n        enqueue an test:with task\n        e.g. -json '{\"changes\":{\"remark\":\"r\"}}'\n")
	require.Contains(t, help, "  test-without <order_no> -json PAYLOAD [-event-id ID]\n        enqueue an test:without task\n  ")
}
