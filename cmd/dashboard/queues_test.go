package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// testShards is the deployment of the queue guard's tests: three shards,
// while the tasks placed with one queue per kind drain.
var testShards = tasks.Shards{Count: 3, Draining: []int{1}}

// Queue names outside testShards' deployment, as one path segment: the
// issue's planted names (percent-encoded, as a careful client would send
// them), queues of another application, shards the deployment does not
// have, and look-alikes.
var badQueues = []string{
	"order_modify%2Fpending_tasks:delete_all",
	"order_modify%2Fpending_tasks:archive_all%23",
	"default", "critical", "order_modify:3", "order_modify:01", "order_exchange:-1", "ORDER_MODIFY",
	"order_modify%00", "order_modify%20", "~order_modify", "order_modify.0", "%C3%B6rder_modify", "x",
}

// Group names outside groupChars (or dot segments), as one path segment.
var badGroups = []string{
	"g%2F..%2F..%2Forder_modify%2Fpending_tasks:delete_all", "a%20b", "g%23", "g%3Fx", "%C3%A9", "%25", ".", "..",
	"g%5Cx", strings.Repeat("g", 129),
}

// writePath is asynqmon's route p (as its handler.go writes it) under root,
// for queue q, group g and a valid task ID, with a valid batch body when the
// route is a batch one.
func writePath(root, p, q, g string) (string, string) {
	out := root + "/api" + strings.NewReplacer("{qname}", q, "{gname}", g, "{task_id}", "crm:order-7:v3").Replace(p)
	if strings.Contains(p, ":batch_") {
		return out, `{"task_ids":["evt-1"]}`
	}
	return out, ""
}

// TestGuardCoversEveryWriteRouteQueues sends every write route of
// asynqmon's API, read from its source, through the guard with queue and
// group segments outside the deployment: each is refused with a JSON error
// and reaches nothing. With each of the deployment's queues (the shards and
// the draining unsharded queues) and a safe group, it goes through.
func TestGuardCoversEveryWriteRouteQueues(t *testing.T) {
	t.Parallel()
	queues := newQueueSet(testShards, tasks.Kinds(), zap.NewNop())
	for _, root := range []string{"", "/asynq"} {
		g := newGuardedWith(t, root, queues, `{}`, "")
		writes, grouped := 0, 0
		for _, rt := range asynqmonRoutes(t) {
			if rt.method == http.MethodGet {
				continue
			}
			writes++
			require.True(t, strings.HasPrefix(rt.path, "/queues/{qname}"),
				"asynqmon has a write route outside /queues/{qname}: %s %s; the guard refuses it (see queueSet.checkNames)", rt.method, rt.path)
			for _, bad := range badQueues {
				p, body := writePath(root, rt.path, bad, "g1")
				status, answer := g.do(t, rt.method, p, body)
				assert.Equal(t, http.StatusBadRequest, status, "%s %s", rt.method, p)
				if strings.Contains(bad, "%2F") {
					// Also not canonical: refused for either reason.
					assertRefusalCode(t, answer, errorCodeUnknownQueue, errorCodeInvalidTaskID)
				} else {
					assertRefusalCode(t, answer, errorCodeUnknownQueue)
				}
			}
			if strings.Contains(rt.path, "{gname}") {
				grouped++
				for _, bad := range badGroups {
					p, body := writePath(root, rt.path, "order_modify:1", bad)
					status, answer := g.do(t, rt.method, p, body)
					assert.Equal(t, http.StatusBadRequest, status, "%s %s", rt.method, p)
					assertRefusalCode(t, answer, errorCodeInvalidGroup, errorCodeInvalidTaskID)
				}
			}
			require.Empty(t, g.take(), "%s %s: a refused request reached asynqmon", rt.method, rt.path)

			for _, q := range testShards.AllQueues(tasks.Kinds()) {
				p, body := writePath(root, rt.path, q, "batch-2024.07:a_b")
				status, answer := g.do(t, rt.method, p, body)
				assert.Equal(t, http.StatusOK, status, "%s %s: %s", rt.method, p, answer)
				assert.Equal(t, []string{rt.method + " " + p + " " + body}, g.take())
			}
		}
		// v0.7.2 has 45 write routes, 9 of them on a group.
		assert.GreaterOrEqual(t, writes, 45, "write routes")
		assert.GreaterOrEqual(t, grouped, 9, "write routes on a group")

		// A write that names no queue is no asynqmon route: refused too.
		for _, p := range []string{"/api/servers", "/api/queues", "/api/queue_stats:delete_all", "/api/scheduler_entries/x"} {
			status, answer := g.do(t, http.MethodPost, root+p, "")
			assert.Equal(t, http.StatusBadRequest, status, p)
			assertRefusalCode(t, answer, errorCodeUnknownQueue)
		}
		assert.Empty(t, g.take())
	}
}

// TestGuardHidesUnknownQueues checks that the GET answers of asynqmon's API
// lose every queue outside the deployment and every unsafe group, wherever
// asynqmon puts a name the UI could paste into a URL, that a GET of such a
// queue's (or group's) pages is answered 404, and that each hidden name is
// logged once.
func TestGuardHidesUnknownQueues(t *testing.T) {
	t.Parallel()
	const planted = plantedDelete
	core, logs := observer.New(zap.WarnLevel)
	queues := newQueueSet(testShards, tasks.Kinds(), zap.New(core))

	tests := []struct{ path, answer, want string }{
		{
			"/api/queues",
			`{"queues":[{"queue":"order_modify:0","size":3,"paused":false},{"queue":"` + planted + `","size":0},` +
				`{"queue":"order_modify:1","size":1},{"queue":"` + plantedArchive + `","size":0},{"queue":"default","size":9}]}`,
			`{"queues":[{"paused":false,"queue":"order_modify:0","size":3},{"queue":"order_modify:1","size":1}]}`,
		},
		{
			"/api/queue_stats",
			`{"stats":{"order_modify":[{"queue":"order_modify","processed":1}],"` + planted + `":[{"queue":"` + planted + `","processed":0}],"default":[]}}`,
			`{"stats":{"order_modify":[{"processed":1,"queue":"order_modify"}]}}`,
		},
		{
			"/api/servers",
			`{"servers":[{"id":"srv-1","queue_priorities":{"order_modify:2":3,"` + planted + `":1},` +
				`"active_workers":[{"task_id":"evt-1","queue":"order_modify:2"},{"task_id":"evt-2","queue":"` + plantedArchive + `"}]}]}`,
			`{"servers":[{"active_workers":[{"queue":"order_modify:2","task_id":"evt-1"}],"id":"srv-1","queue_priorities":{"order_modify:2":3}}]}`,
		},
		{
			"/api/redis_info",
			`{"cluster":true,"queue_locations":[{"queue":"` + planted + `","keyslot":1},{"queue":"order_exchange:0","keyslot":9686}]}`,
			`{"cluster":true,"queue_locations":[{"keyslot":9686,"queue":"order_exchange:0"}]}`,
		},
		{
			"/api/queues/order_modify:0/groups",
			`{"stats":{"queue":"order_modify:0","groups":2},"groups":[{"group":"g1","size":1},{"group":"../aggregating_tasks:delete_all","size":2},{"group":"a b","size":1}]}`,
			`{"groups":[{"group":"g1","size":1}],"stats":{"groups":2,"queue":"order_modify:0"}}`,
		},
		{
			"/api/queues/order_modify:0/pending_tasks",
			`{"tasks":[{"id":"../pending_tasks:delete_all","queue":"order_modify:0"}]}`,
			`{"tasks":[{"id":"~..%2Fpending_tasks:delete_all","queue":"order_modify:0"}]}`,
		},
	}
	for _, tt := range tests {
		for range 2 {
			g := newGuardedWith(t, "", queues, tt.answer, "")
			status, body := g.do(t, http.MethodGet, tt.path, "")
			require.Equal(t, http.StatusOK, status, tt.path)
			assert.JSONEq(t, tt.want, body, tt.path)
			assert.NotContains(t, body, "order_modify/", tt.path)
		}
	}
	hidden := map[string]int{}
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if f.Key == "queue" || f.Key == "group" {
				hidden[f.String]++
			}
		}
	}
	assert.Equal(t, map[string]int{
		`"` + planted + `"`: 1, `"` + plantedArchive + `"`: 1, `"default"`: 1,
		`"../aggregating_tasks:delete_all"`: 1, `"a b"`: 1,
	}, hidden, "each hidden name is logged once, quoted")

	// The pages of a hidden queue or group are not found.
	g := newGuardedWith(t, "/asynq", queues, `{"tasks":[]}`, "")
	for _, p := range []string{
		"/asynq/api/queues/order_modify%2Fpending_tasks:delete_all",
		"/asynq/api/queues/default",
		"/asynq/api/queues/default/pending_tasks",
		"/asynq/api/queues/order_modify:7/tasks/evt-1",
	} {
		status, body := g.do(t, http.MethodGet, p, "")
		assert.Equal(t, http.StatusNotFound, status, p)
		assertRefusalCode(t, body, errorCodeUnknownQueue)
	}
	status, body := g.do(t, http.MethodGet, "/asynq/api/queues/order_modify/groups/a%20b/aggregating_tasks", "")
	assert.Equal(t, http.StatusNotFound, status)
	assertRefusalCode(t, body, errorCodeInvalidGroup)
	assert.Empty(t, g.take())
	status, _ = g.do(t, http.MethodGet, "/asynq/api/queues/order_modify/pending_tasks", "")
	assert.Equal(t, http.StatusOK, status)
	assert.Len(t, g.take(), 1)
}

// TestQueueNoteIsBounded checks that a flood of planted names cannot grow
// what the guard remembers having logged.
func TestQueueNoteIsBounded(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.WarnLevel)
	queues := newQueueSet(tasks.Shards{}, tasks.Kinds(), zap.New(core))
	var list []any
	for i := range 3 * maxNotedNames {
		list = append(list, map[string]any{"queue": strings.Repeat("q", i+1)})
	}
	doc := map[string]any{"queues": list}
	require.True(t, queues.hideNames(doc, false))
	assert.Empty(t, doc["queues"])
	assert.Equal(t, maxNotedNames, logs.Len())
	assert.Len(t, queues.noted, maxNotedNames)
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	assert.JSONEq(t, `{"queues":[]}`, string(b))
}

func TestSafeGroup(t *testing.T) {
	t.Parallel()
	for _, g := range []string{"g1", "batch-2024.07:a_b", "...", strings.Repeat("g", 128)} {
		assert.True(t, safeGroup(g), g)
	}
	for _, g := range []string{"", ".", "..", "a/b", "a b", "a#", "a?", "a%", `a\b`, "é", strings.Repeat("g", 129), "a\n"} {
		assert.False(t, safeGroup(g), "%q", g)
	}
}

// Planted queue names of the issue: asynqmon's UI turns a click on Delete
// in the row of the first into DELETE .../order_modify/pending_tasks:delete_all,
// and a click on Pause in the row of the second into
// POST .../order_modify/pending_tasks:archive_all.
const (
	plantedDelete  = "order_modify/pending_tasks:delete_all"
	plantedArchive = "order_modify/pending_tasks:archive_all#"
)

// plantQueues adds names to asynq's set of queues, as anything that can
// write asynq:* can, and removes them when the test ends.
func plantQueues(t *testing.T, db *redistest.DB, names ...string) {
	t.Helper()
	members := make([]any, len(names))
	for i, n := range names {
		members[i] = n
	}
	require.NoError(t, db.Client.SAdd(t.Context(), asynqredis.AllQueues, members...).Err())
	t.Cleanup(func() { _ = db.Client.SRem(context.Background(), asynqredis.AllQueues, members...).Err() })
}

// TestPlantedQueues checks, on a writable dashboard against a real Redis,
// that planted queues are hidden from asynqmon's API, refused in writes
// and listed as suspicious on the order page's search view, and that
// nothing of the real queue changes.
func TestPlantedQueues(t *testing.T) {
	db := redistest.New(t)
	enqueueOrders(t, db)
	plantQueues(t, db, plantedDelete, plantedArchive, "default")
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/api/queues", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	var qs struct {
		Queues []struct {
			Queue string `json:"queue"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &qs))
	require.Len(t, qs.Queues, 1, r.body)
	assert.Equal(t, queue, qs.Queues[0].Queue)
	r = d.get(t, "/api/queue_stats", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	var stats struct {
		Stats map[string]json.RawMessage `json:"stats"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &stats))
	assert.Len(t, stats.Stats, 1, r.body)
	assert.Contains(t, stats.Stats, queue)

	for _, w := range []struct{ method, path string }{
		{http.MethodPost, "/api/queues/order_modify%2Fpending_tasks:archive_all%23:pause"},
		{http.MethodDelete, "/api/queues/order_modify%2Fpending_tasks:delete_all"},
		{http.MethodDelete, "/api/queues/default"},
		{http.MethodPost, "/api/queues/default:pause"},
		{http.MethodDelete, "/api/queues/default/pending_tasks:delete_all"},
	} {
		r := d.do(t, w.method, w.path, basic)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s", w.method, w.path, r.body)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	}
	assert.Equal(t, 2, pending(t, d), "the real queue did not change")
	paused, err := asynq.NewInspectorFromRedisClient(db.Client).GetQueueInfo(queue)
	require.NoError(t, err)
	assert.False(t, paused.Paused)

	r = d.get(t, "/orders", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<section id="suspicious"`)
	assert.Contains(t, r.body, "asynq knows 3 queue(s) that this deployment does not define")
	assert.Contains(t, r.body, `<li>&#34;default&#34;</li><li>&#34;order_modify/pending_tasks:archive_all#&#34;</li><li>&#34;order_modify/pending_tasks:delete_all&#34;</li>`)
	assert.Contains(t, d.logs.String(), `"queue":"\"order_modify/pending_tasks:delete_all\""`, "the hidden queue is logged")
	requireNoSecrets(t, d.logs.String())

	// Without planted queues the search view says nothing of them.
	require.NoError(t, db.Client.SRem(t.Context(), asynqredis.AllQueues, plantedDelete, plantedArchive, "default").Err())
	r = d.get(t, "/orders", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.NotContains(t, r.body, "suspicious")
}

// TestUnknownQueuesIsBounded plants more queues than the order page lists:
// it counts them all, lists maxListedQueues of them, and reads a bounded
// part of the set.
func TestUnknownQueuesIsBounded(t *testing.T) {
	db := redistest.New(t)
	var planted []string
	for i := range 2000 {
		planted = append(planted, fmt.Sprintf("planted-%04d", i))
	}
	plantQueues(t, db, append(planted, "order_modify:1", "order_exchange")...)
	queues := newQueueSet(testShards, tasks.Kinds(), zap.NewNop())
	names, total, err := queues.unknownQueues(t.Context(), db.Client)
	require.NoError(t, err)
	assert.Equal(t, 2000, total, "the known queues are not counted")
	assert.Len(t, names, maxListedQueues)
	assert.True(t, slices.IsSorted(names))
	for _, n := range names {
		assert.True(t, strings.HasPrefix(n, "planted-"), n)
	}

	require.NoError(t, db.Client.SRem(t.Context(), asynqredis.AllQueues, "order_modify:1").Err())
	names, total, err = newQueueSet(tasks.Shards{}, tasks.Kinds(), zap.NewNop()).unknownQueues(t.Context(), db.Client)
	require.NoError(t, err)
	assert.Equal(t, 2000, total)
	assert.Len(t, names, maxListedQueues)
}

// TestAConfiguredKindIsTheDashboards: the dashboard reads its kinds from
// its settings (settings.Kinds), not from the contract alone: the queues
// of a kind configured beside the contract's, every shard of them, are
// the deployment's (the guard lets asynqmon's writes to them through),
// and the order page links asynqmon's pages of their tasks.
func TestAConfiguredKindIsTheDashboards(t *testing.T) {
	t.Parallel()
	// A kind of the test's own (a test name, which no real kind takes);
	// its payload is the modify's, which is enough to place, guard and link
	// its queues.
	custom := tasks.NewKind[tasks.ModifyPayload]("test:custom-kind", "test-custom-kind", "test_custom_kind", 4)
	kinds := append(tasks.Kinds(), custom)
	shards := tasks.Shards{Count: 3, Draining: []int{1}}
	queues := newQueueSet(shards, kinds, zap.NewNop())
	for _, q := range append(custom.ShardQueues(3), "test_custom_kind") {
		assert.True(t, queues.defines(q), q)
	}
	assert.False(t, newQueueSet(shards, tasks.Kinds(), zap.NewNop()).defines("test_custom_kind:0"), "not without the kind")

	pages, err := newOrderPages(nil, nil, nil, queues, kinds, "/asynq", false, zap.NewNop())
	require.NoError(t, err)
	assert.Equal(t, "/asynq/queues/test_custom_kind:1/tasks/custom-1", pages.taskURL("test_custom_kind:1", "custom-1"))
	assert.Equal(t, "/asynq/queues/test_custom_kind?status=retry", pages.queueURL("test_custom_kind", "retry"))
	assert.NotEmpty(t, pages.actions(orderview.Task{TaskID: "custom-1", Queue: "test_custom_kind:1", State: "retry"}))
	contract, err := newOrderPages(nil, nil, nil, queues, tasks.Kinds(), "/asynq", false, zap.NewNop())
	require.NoError(t, err)
	assert.Equal(t, "#", contract.taskURL("test_custom_kind:1", "custom-1"), "no link to the queue of a kind it was not given")
}
