package main

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"gopkg.in/yaml.v3"

	"github.com/orderworker/orderworker/cmd/internal/orderstore"
	"github.com/orderworker/orderworker/internal/intake"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
)

// TestEveryKindEverywhere is the kinds table's conformance test: it goes
// over every kind of tasks.Kinds and checks that each layer has it, so that
// a kind missed in one place fails here rather than in production. Per
// kind: its position label reads back (tasks.ParseLabel, which the gap
// check uses), it is placed on its queue and its shard queues and found by
// them, the worker has its entry (worker.Kinds) with an Apply that succeeds
// against the Redis store and the HTTP store (over the fake upstream), the
// intake has its POST route, the CLI has its command, which enqueues it
// through the producer, and the worker applies that task, counted in the
// metrics under the kind's own task_type label (not "unknown"), and the
// order status finds that task by the history entry it wrote. And the
// spots that vary by kind outside the code: its queue's three shards land
// on three different masters of a three-master cluster (see
// tasks.TestShardsSpreadOverThreeMasters), and api/openapi.yaml documents
// its route with a request schema (the intake's spec tests check the
// schema's members, TestSpecSchemas).
//
// It lives here, in cmd/producer, because the CLI is package main, which
// no other package can import; this test package may import every other
// layer (worker, intake, both stores, the test upstream) without a cycle.
func TestEveryKindEverywhere(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	ctx := t.Context()

	// The two order stores, and the store of each that seeds it.
	redisStore, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	up := upstreamtest.New(t, orderapitest.NewHandler(oracle))
	httpStore, err := orderstore.Open(db.Client, db.Prefix, &orderstore.Settings{Store: orderstore.HTTP,
		OrderAPIURL: up.APIURL(), OrderAPITimeout: 5 * time.Second, TokenURL: up.TokenURL(),
		TokenClientID: upstreamtest.ClientID, TokenClientSecret: upstreamtest.ClientSecret,
		TokenRefreshBefore: 10 * time.Second, TokenWaitTimeout: 5 * time.Second}, orderstore.Hooks{}, zaptest.NewLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, httpStore.Close()) })
	stores := []struct {
		name        string
		store, seed orders.Store
	}{
		{"redis", redisStore, redisStore},
		{"http", httpStore.Store, oracle},
	}
	seed := func(store orders.Store, no string) {
		t.Helper()
		require.NoError(t, store.Put(ctx, orders.Order{No: no, Address: "1 Old Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	}

	// A worker on the Redis store, with its metrics, for the CLI's tasks.
	reg := prometheus.NewRegistry()
	metrics, err := worker.NewMetrics(reg)
	require.NoError(t, err)
	done := make(chan worker.Done, 100)
	w, err := worker.New(db.Client, redisStore, worker.Config{KeyPrefix: db.Prefix, Metrics: metrics, Logger: zaptest.NewLogger(t),
		TaskCheckInterval: 50 * time.Millisecond, OnDone: func(d worker.Done) { done <- d }})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Shutdown)
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)

	entries := map[string]worker.Kind{}
	for _, k := range worker.Kinds() {
		entries[k.Kind.Type] = k
	}
	routes := map[string]bool{}
	for _, rt := range intake.Routes(tasks.Kinds()) {
		routes[rt.Method+" "+rt.Path] = true
	}
	help := usage(tasks.Kinds())
	views, err := orderview.New(db.Client, redisStore, orderview.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	spec := loadAPISpec(t)

	require.NotEmpty(t, tasks.Kinds())
	require.NoError(t, tasks.Kinds().Validate())
	require.Len(t, worker.Kinds(), len(tasks.Kinds()), "the worker has one entry per kind, and no other")
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			// The label of its positions reads back.
			typ, ev, from, ok := tasks.Kinds().ParseLabel(tasks.PositionLabel(k.Type, "ev-1"))
			require.True(t, ok, "ParseLabel reads the label of a %s position", k.Type)
			assert.Equal(t, []string{k.Type, "ev-1", ""}, []string{typ, ev, from})

			// Its placement: its queue and shard queues are its own.
			require.Same(t, k, tasks.Kinds().Of(k.Type))
			require.Same(t, k, tasks.Kinds().OfQueue(k.Queue))
			assert.Positive(t, k.Weight)
			assert.Equal(t, k.Weight, worker.DefaultQueues()[k.Queue], "the worker serves its queue with its weight")
			for _, q := range k.ShardQueues(3) {
				require.Same(t, k, tasks.Kinds().OfQueue(q), q)
			}
			assert.Contains(t, tasks.Shards{}.AllQueues(tasks.Kinds()), k.Queue)
			assert.Contains(t, tasks.Shards{Count: 3}.Placements(k, "SO1001"), k.QueueFor("SO1001", 3))
			assert.True(t, tasks.Shards{Count: 3}.Accepts(k, "SO1001", k.QueueFor("SO1001", 3)))
			masters := map[int]bool{}
			for _, q := range k.ShardQueues(3) {
				masters[redisproc.Slot(asynqredis.PendingKey(q))*3/16384] = true
			}
			assert.Len(t, masters, 3, "the 3 shard queues of %s land on 3 different masters of 3: name its queue otherwise (docs/adding-a-task-type.md)", k.Queue)

			// The API spec documents its route and the route's body.
			ref, ok := spec.requestRef("/v1/orders/{order_no}/" + k.Name)
			require.True(t, ok, "api/openapi.yaml has no POST /v1/orders/{order_no}/%s", k.Name)
			assert.Contains(t, spec.Components.Schemas, strings.TrimPrefix(ref, "#/components/schemas/"), "api/openapi.yaml: the request schema of %s", k.Type)

			// The worker's entry.
			entry, ok := entries[k.Type]
			require.True(t, ok, "worker.Kinds has no entry for %s", k.Type)
			require.Same(t, k, entry.Kind)
			require.NotNil(t, entry.Apply)
			require.NoError(t, entry.Wait.Validate())

			// A valid payload of the kind, as JSON without order_no (the
			// CLI's -json and the intake's body): the kind's example
			// (tasks.WithExample).
			sample := k.Example()
			require.NotEmpty(t, sample, "give %s an example (tasks.WithExample)", k.Type)
			payload := func(eventID, no string) tasks.Payload {
				t.Helper()
				p, err := k.ExamplePayload(eventID, no)
				require.NoError(t, err)
				return p
			}

			// Each order store applies it: a write of the order's, with its
			// history entry of the kind's type (a store whose write did
			// nothing fails here).
			for _, s := range stores {
				no := "SO-KIND-" + k.Name + "-" + s.name
				seed(s.seed, no)
				before, err := s.store.Get(ctx, no)
				require.NoError(t, err)
				ev := "kind-" + k.Name + "-" + s.name
				wctx := orders.WithWrite(ctx, orders.Write{Fence: 1, Worker: "conformance"})
				require.NoError(t, entry.Apply(wctx, s.store, payload(ev, no)),
					"the %s store applies %s", s.name, k.Type)
				h, err := orders.AllHistory(ctx, s.store, no)
				require.NoError(t, err)
				require.Greater(t, len(h), 1)
				last := h[len(h)-1]
				assert.Equal(t, k.Type, last.Type, "the %s store's history entry of %s", s.name, k.Type)
				assert.Equal(t, ev, last.EventID, "the %s store's history entry of %s", s.name, k.Type)
				assert.Equal(t, before.Version+1, last.Version, "the %s store's write of %s bumped the version", s.name, k.Type)
			}

			// The intake's route.
			assert.True(t, routes[http.MethodPost+" /v1/orders/{order_no}/"+k.Name], "the intake has no route for %s", k.Type)

			// The CLI's command, in the help, and its JSON form enqueues
			// the kind through the producer.
			_, ok = kindCommand(tasks.Kinds(), k.Name)
			require.True(t, ok, "the CLI has no command for %s", k.Type)
			assert.Contains(t, help, "\n  "+k.Name+" <order_no> ")
			no := "SO-KIND-" + k.Name + "-cli"
			seed(redisStore, no)
			id := "kind-" + k.Name + "-cli"
			res, err := jsonCommand(k).run(ctx, p, []string{no, "-json", sample, "-event-id", id})
			require.NoError(t, err)
			assert.Equal(t, k.Queue, res.Queue)

			// The worker applies it, and the metrics count it under its
			// own task_type.
			timeout := time.After(15 * time.Second)
			for d := (worker.Done{}); d.EventID != id; {
				select {
				case d = <-done:
				case <-timeout:
					t.Fatalf("the worker did not run %s", id)
				}
				if d.EventID == id {
					require.Equal(t, worker.OutcomeOK, d.Outcome, "%v", d.Err)
				}
			}
			require.Equal(t, 1, countRuns(t, reg, k.Type), "orderworker_task_duration_seconds{task_type=%q}", k.Type)

			// The order status finds the task by its history entry.
			st, err := views.Status(ctx, no)
			require.NoError(t, err)
			var found bool
			for _, task := range st.Tasks {
				if task.TaskID == id {
					found = true
					assert.Equal(t, []string{k.Type, res.Queue, orderview.SourceHistory}, []string{task.Type, task.Queue, task.Source})
				}
			}
			assert.True(t, found, "the order status of %s lists task %s: %+v", no, id, st.Tasks)
		})
	}
}

// countRuns returns how many runs of task type typ the worker's metrics
// counted.
func countRuns(t *testing.T, reg *prometheus.Registry, typ string) int {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range families {
		if f.GetName() != "orderworker_task_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%s", l.GetName(), l.GetValue()))
			}
			if strings.Contains(strings.Join(labels, ","), "task_type="+typ) {
				n += int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return n
}

// apiSpec is the part of api/openapi.yaml the conformance test reads.
type apiSpec struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas map[string]yaml.Node `yaml:"schemas"`
	} `yaml:"components"`
}

func loadAPISpec(t *testing.T) apiSpec {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var s apiSpec
	require.NoError(t, yaml.Unmarshal(b, &s))
	return s
}

// requestRef returns the $ref of the JSON body of the POST operation of
// path; ok is false when the spec has no such operation, or it does not
// read.
func (s apiSpec) requestRef(path string) (ref string, ok bool) {
	node, ok := s.Paths[path]["post"]
	if !ok {
		return "", false
	}
	var op struct {
		RequestBody struct {
			Content map[string]struct {
				Schema struct {
					Ref string `yaml:"$ref"`
				} `yaml:"schema"`
			} `yaml:"content"`
		} `yaml:"requestBody"`
	}
	if err := node.Decode(&op); err != nil {
		return "", false
	}
	return op.RequestBody.Content["application/json"].Schema.Ref, true
}

// The autoscalers of deploy/kubernetes scale the workers on the backlog of
// every kind's queue, all its shards: a kind whose queue they do not read
// would pile up without adding a worker. They read it in one query whose
// queue label regular expression names no kind (the kinds' queue naming,
// order_<name>, and :N for a shard), so that a kind added to the table
// needs no change there. This checks that the expression, the same in both
// overlays, matches every queue of every kind of the table under every
// shard count and the deployment's own QUEUE_SHARDS, and no queue that is
// not a kind's. (The manifests' own module, deploy/kubernetes/check, checks
// the queries' form.)
func TestEveryKindScalesTheWorkers(t *testing.T) {
	matcher := regexp.MustCompile(`queue=~"([^"]*)",state="pending"`)
	var expr string
	for _, path := range []string{
		"../../deploy/kubernetes/overlays/keda/scaledobject.yaml",
		"../../deploy/kubernetes/overlays/hpa/prometheus-adapter-values.yaml",
	} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		found := matcher.FindAllStringSubmatch(string(b), -1)
		require.NotEmpty(t, found, "%s: no query on the pending backlog", path)
		for _, m := range found {
			if expr == "" {
				expr = m[1]
			}
			require.Equal(t, expr, m[1], "%s: one queue expression, the same in both overlays", path)
		}
	}
	// Prometheus anchors a label's regular expression at both ends (and
	// uses Go's RE2 syntax).
	queues, err := regexp.Compile("^(?:" + expr + ")$")
	require.NoError(t, err, expr)

	// The queues a deployment's workers serve: every kind's queues under
	// its QUEUE_SHARDS (the base's ConfigMap), draining counts included.
	config, err := os.ReadFile("../../deploy/kubernetes/base/config.yaml")
	require.NoError(t, err)
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	require.NoError(t, yaml.Unmarshal(config, &cm))
	setting, ok := cm.Data["QUEUE_SHARDS"]
	require.True(t, ok, "the base's ConfigMap sets QUEUE_SHARDS")
	deployed, err := tasks.ParseShards(setting)
	require.NoError(t, err)
	for _, q := range deployed.AllQueues(tasks.Kinds()) {
		assert.True(t, queues.MatchString(q), "queue %s, which the deployment serves (QUEUE_SHARDS %s), is not in the autoscalers' backlog (queue=~%q)", q, setting, expr)
	}
	// And under any shard count a deployment may set: each kind's own
	// queue and its shard queues (tasks.Kind.ShardQueues).
	for _, k := range tasks.Kinds() {
		var missed []string
		for n := 1; n <= tasks.MaxShards; n++ {
			for _, q := range k.ShardQueues(n) {
				if !queues.MatchString(q) {
					missed = append(missed, q)
				}
			}
		}
		assert.Empty(t, missed, "queues of %s the autoscalers do not read (queue=~%q): name its queue as the kinds' are, or widen the expression in both overlays and deploy/kubernetes/check", k.Type, expr)
	}
	// Not so wide that it reads queues no worker serves, which would scale
	// the workers on others' backlogs.
	for _, q := range []string{"default", "critical", "low", "orders", "order_", "order_modify:", "order_modify:x"} {
		assert.False(t, queues.MatchString(q), "the autoscalers read queue %s, which no kind has (queue=~%q)", q, expr)
		assert.Nil(t, tasks.Kinds().OfQueue(q), "%s is no kind's queue", q)
	}
}
