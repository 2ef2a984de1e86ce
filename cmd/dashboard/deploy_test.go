package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
)

// The files of deploy/, from this package's directory.
const (
	alertsFile  = "../../deploy/prometheus/alerts.yml"
	grafanaFile = "../../deploy/grafana/orderworker.json"
	opsDoc      = "../../docs/operations.md"
)

// fromPrometheus are the series Prometheus makes itself for each target it
// scrapes.
var fromPrometheus = []string{"up"}

// TestDeployNamesRegisteredMetrics loads the alert rules and the Grafana
// dashboard of deploy/, reads the series each expression selects and
// checks that each is one the binaries register: read from the registries that the dashboard (registerMetrics)
// and the worker (worker.NewMetrics) build, not from a list.
func TestDeployNamesRegisteredMetrics(t *testing.T) {
	registered := registeredSeries(t)
	for _, n := range fromPrometheus {
		registered[n] = true
	}
	queries := append(alertQueries(t), grafanaQueries(t)...)
	require.NotEmpty(t, queries)
	used := map[string]bool{}
	for _, q := range queries {
		for _, name := range selectedSeries(t, q) {
			used[name] = true
			assert.True(t, registered[name], "%s: %s is registered by no binary", q.where, name)
		}
	}
	for _, n := range []string{"orderworker_changes_archived_total", "orderworker_lock_lost_total",
		"orderworker_stale_fence_total", "orderworker_token_refreshes_total", "asynq_queue_latency_seconds", "up"} {
		assert.True(t, used[n], "deploy/ never uses %s, which an alert of issue 23 needs", n)
	}
}

// query is one PromQL expression of deploy/ and where it is.
type query struct{ where, expr string }

// alertQueries returns the rules' expressions, and checks that each rule
// has a summary, a description and a runbook that is a section of
// docs/operations.md.
func alertQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(b, &file))
	anchors := docAnchors(t, opsDoc)
	var out []query
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			where := alertsFile + ": " + r.Alert
			require.NotEmpty(t, r.Alert, "%s: a rule without a name", alertsFile)
			assert.NotEmpty(t, r.Annotations["summary"], where)
			assert.NotEmpty(t, r.Annotations["description"], where)
			assert.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], where)
			anchor, ok := strings.CutPrefix(r.Annotations["runbook"], "docs/operations.md#")
			assert.True(t, ok && anchors[anchor], "%s: runbook %q is not a section of docs/operations.md", where, r.Annotations["runbook"])
			out = append(out, query{where, r.Expr})
		}
	}
	return out
}

// labelValues is a Grafana variable's query of a metric's label values.
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*\w+\s*\)$`)

// grafanaQueries returns the dashboard's expressions (its panels' targets
// and its variables' label_values queries, as the selector of the metric
// they read), and checks that it reads its data source from the
// DS_PROMETHEUS variable.
func grafanaQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(grafanaFile)
	require.NoError(t, err)
	type source struct{ Type, UID string }
	type panel struct {
		ID         int
		Type       string
		Title      string
		Datasource *source
		Targets    []struct {
			RefID      string
			Expr       string
			Datasource *source
		}
		Panels []json.RawMessage
	}
	var dash struct {
		Title      string
		Templating struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage
			}
		}
		Panels []panel
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Title)
	var out []query
	hasDS := false
	for _, v := range dash.Templating.List {
		if v.Name == "DS_PROMETHEUS" {
			hasDS = v.Type == "datasource"
			continue
		}
		var q struct{ Query string }
		require.NoError(t, json.Unmarshal(v.Query, &q), "variable %s", v.Name)
		m := labelValues.FindStringSubmatch(q.Query)
		require.NotNil(t, m, "variable %s: %q is not label_values(metric, label)", v.Name, q.Query)
		out = append(out, query{grafanaFile + ": variable " + v.Name, m[1]})
	}
	require.True(t, hasDS, "no datasource variable DS_PROMETHEUS")
	ids := map[int]bool{}
	ds := &source{Type: "prometheus", UID: "${DS_PROMETHEUS}"}
	for _, p := range dash.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		require.Empty(t, p.Panels, "panel %q: nested panels are not read here", p.Title)
		if p.Type == "row" {
			continue
		}
		where := fmt.Sprintf("%s: panel %q", grafanaFile, p.Title)
		assert.Equal(t, ds, p.Datasource, where)
		require.NotEmpty(t, p.Targets, where)
		for _, tg := range p.Targets {
			assert.Equal(t, ds, tg.Datasource, where)
			require.NotEmpty(t, tg.Expr, where)
			out = append(out, query{where + " " + tg.RefID, tg.Expr})
		}
	}
	return out
}

// grafanaVars are Grafana's variables in an expression: its intervals, and
// the dashboard's own (which stand in label matchers' strings).
var (
	grafanaIntervals = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)
	grafanaVars      = regexp.MustCompile(`\$\{?[A-Za-z_]\w*\}?`)
)

// selectedSeries returns the metric name of each selector of q's
// expression, Grafana's variables replaced as Grafana would (an interval,
// a regexp that matches all). Prometheus's PromQL parser is not used: its
// module's dependency graph breaks `go mod tidy` here (ambiguous imports of
// genproto and cloud.google.com/go), so this reads the names with a small
// lexer of its own, checking that brackets and quotes pair up; Prometheus
// (promtool check rules) and Grafana parse the expressions for real.
func selectedSeries(t *testing.T, q query) []string {
	t.Helper()
	expr := grafanaIntervals.ReplaceAllString(q.expr, "5m")
	expr = grafanaVars.ReplaceAllString(expr, ".*")
	names, err := seriesNames(expr)
	require.NoError(t, err, "%s: %s", q.where, q.expr)
	require.NotEmpty(t, names, "%s: selects no series", q.where)
	return names
}

// promqlWords are PromQL's keywords and aggregation operators (which may
// stand before their "by (...)"): never a metric name here; promqlLabels
// are those that take a list of labels in parentheses.
var (
	promqlWords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan",
		"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
	promqlLabels = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
)

// seriesNames returns the metric names that expr selects: its identifiers
// outside strings, label matchers ({...}), label lists (by (...)) and
// ranges ([...]) that are neither a function (followed by "(") nor a
// keyword. It returns an error for brackets or quotes that do not pair up.
func seriesNames(expr string) ([]string, error) {
	var names []string
	var stack []byte // open brackets
	labelList := false
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
	}
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++ // an escaped character
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			i = j
		case c == '(' || c == '{' || c == '[':
			if c == '(' && labelList {
				c = 'L' // a label list: no metric names inside
			}
			labelList = false
			stack = append(stack, c)
		case c == ')' || c == '}' || c == ']':
			want := map[byte]string{')': "(L", '}': "{", ']': "["}[c]
			if len(stack) == 0 || !strings.ContainsRune(want, rune(stack[len(stack)-1])) {
				return nil, fmt.Errorf("unpaired %q at %d", c, i)
			}
			stack = stack[:len(stack)-1]
		case isIdent(c, true):
			j := i + 1
			for j < len(expr) && isIdent(expr[j], false) {
				j++
			}
			word := expr[i:j]
			i = j - 1
			inLabels := len(stack) > 0 && strings.ContainsRune("{[L", rune(stack[len(stack)-1]))
			rest := strings.TrimLeft(expr[j:], " \t\n")
			switch {
			case inLabels:
			case slices.Contains(promqlLabels, strings.ToLower(word)):
				labelList = true
			case slices.Contains(promqlWords, strings.ToLower(word)), strings.HasPrefix(rest, "("):
			default:
				names = append(names, word)
			}
		case '0' <= c && c <= '9' || c == '.':
			for i+1 < len(expr) && (isIdent(expr[i+1], false) || expr[i+1] == '.') {
				i++ // a number or a duration
			}
		}
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("unclosed %q", stack[len(stack)-1])
	}
	return names, nil
}

// registeredSeries returns the names of every series the dashboard's and
// the worker's registries can expose: a histogram's _bucket, _sum and
// _count, a summary's name, _sum and _count, any other metric's name (a
// counter's keeps the _total it is registered with). It reads the
// collectors' descriptions (a vector with no child yet is described, not
// gathered) and what the registries gather (asynq's queue collector, which
// describes nothing, from a real Redis with one order queue).
func registeredSeries(t *testing.T) map[string]bool {
	t.Helper()
	db := redistest.New(t)
	cli := asynq.NewClientFromRedisClient(db.Client)
	t.Cleanup(func() { _ = cli.Close() })
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	_, err := cli.Enqueue(asynq.NewTask(tasks.TypeModify, []byte(`{}`)), asynq.Queue(tasks.QueueModify))
	require.NoError(t, err)
	t.Cleanup(func() { _ = insp.DeleteQueue(tasks.QueueModify, true) })

	out := map[string]bool{}
	dashboard := &recorder{Registerer: prometheus.NewRegistry()}
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	views, err := orderview.New(db.Client, store, orderview.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	seq, err := orderkeys.Sequencer(db.Client, db.Prefix, orderkeys.Use{})
	require.NoError(t, err)
	require.NoError(t, registerMetrics(dashboard, db.Client, tasks.Shards{}.AllQueues(tasks.Kinds()), zap.NewNop(),
		newBlockedCollector(views, time.Second, zap.NewNop()), newBacklogCollector(seq, time.Second, zap.NewNop())))
	// The worker's registry, as cmd/worker builds it (its Go and process
	// collectors are the dashboard's too).
	workers := &recorder{Registerer: prometheus.NewRegistry()}
	_, err = worker.NewMetrics(workers)
	require.NoError(t, err)
	for _, r := range []*recorder{dashboard, workers} {
		r.described(t, out)
		families, err := r.Registerer.(prometheus.Gatherer).Gather()
		require.NoError(t, err)
		for _, f := range families {
			addSeries(out, f.GetName(), f.GetType())
		}
	}
	require.True(t, out["asynq_queue_latency_seconds"], "asynq's queue gauges were not gathered")
	return out
}

// recorder is a Registerer that keeps what is registered on it.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// fqName reads a description's fully-qualified name from its String().
var fqName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// described adds the series of the recorded collectors' descriptions to
// out, with the type their Go type says. A single metric (a Histogram, a
// Counter) is left to Gather, which reports its type (a Histogram and a
// Summary cannot be told apart by their interfaces).
func (r *recorder) described(t *testing.T, out map[string]bool) {
	t.Helper()
	for _, c := range r.collectors {
		typ := dto.MetricType_UNTYPED
		switch c.(type) {
		case *prometheus.HistogramVec:
			typ = dto.MetricType_HISTOGRAM
		case *prometheus.SummaryVec:
			typ = dto.MetricType_SUMMARY
		case prometheus.Metric:
			continue // one metric without labels: gathered, with its type
		}
		// Drained before any check, so that a failed check never leaves
		// Describe blocked on its send.
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		var descs []*prometheus.Desc
		for d := range ch {
			descs = append(descs, d)
		}
		for _, d := range descs {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, "a description without a name: %s", d)
			addSeries(out, m[1], typ)
		}
	}
}

// addSeries adds the series a metric family of name and typ exposes.
func addSeries(out map[string]bool, name string, typ dto.MetricType) {
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
	case dto.MetricType_SUMMARY:
		out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
	default:
		out[name] = true
	}
}

// docAnchors returns the anchors of a Markdown file's headings, as GitHub
// makes them.
func docAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		anchor := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9':
				return r
			}
			return -1
		}, strings.ToLower(strings.TrimSpace(title)))
		out[anchor] = true
	}
	return out
}

func TestSeriesNames(t *testing.T) {
	tests := []struct {
		name, expr string
		want       []string
		bad        bool
	}{
		{"histogram", `histogram_quantile(0.99, sum by (le, queue) (rate(a_bucket{x="}", y=~"a.*"}[5m])))`, []string{"a_bucket"}, false},
		{"binary", `sum(increase(a_total[15m])) > 0 unless sum without (pod) (b) > 0`, []string{"a_total", "b"}, false},
		{"absent", `sum(up{job="w"}) == 0 or absent(up{job="w"})`, []string{"up", "up"}, false},
		{"escaped quote", `a{x="\"}"} offset 5m`, []string{"a"}, false},
		{"unclosed", `sum(a`, nil, true},
		{"unpaired", `a{x="y"]`, nil, true},
		{"unterminated", `a{x="y}`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			names, err := seriesNames(tt.expr)
			require.Equal(t, tt.want, names)
			require.Equal(t, tt.bad, err != nil, "%v", err)
		})
	}
}

// Grafana's dashboard schema versions this file may carry: 36 (Grafana
// 9.0) to 41 (Grafana 12). Older versions are migrated on import, so
// fields this file uses could be rewritten; newer ones are refused by the
// Grafana versions in use.
const (
	grafanaMinSchema = 36
	grafanaMaxSchema = 41
)

// TestGrafanaDashboardLoads checks what Grafana needs to import
// deploy/grafana's dashboard as it is: the top-level fields of its
// schema and nothing else (a misspelled field is dropped silently by
// Grafana), a schema version it reads, a valid uid, unique positive
// panel IDs, panels that fit the 24-column grid without overlapping, and
// data sources only through the DS_PROMETHEUS variable, every variable
// an expression uses being defined.
func TestGrafanaDashboardLoads(t *testing.T) {
	b, err := os.ReadFile(grafanaFile)
	require.NoError(t, err)
	assert.Empty(t, grafanaProblems(b))

	// Each mistake is found.
	var dash map[string]any
	require.NoError(t, json.Unmarshal(b, &dash))
	for name, mutate := range map[string]func(d map[string]any){
		"misspelled field": func(d map[string]any) { d["schemaVerison"] = d["schemaVersion"] },
		"old schema":       func(d map[string]any) { d["schemaVersion"] = 16 },
		"string schema":    func(d map[string]any) { d["schemaVersion"] = "39" },
		"duplicate id":     func(d map[string]any) { panelAt(d, 2)["id"] = panelAt(d, 3)["id"] },
		"fixed datasource": func(d map[string]any) {
			panelAt(d, 2)["datasource"] = map[string]any{"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
		},
		"undefined variable": func(d map[string]any) {
			panelAt(d, 2)["targets"].([]any)[0].(map[string]any)["expr"] = `sum(up{job="$jobb"})`
		},
		"overlap": func(d map[string]any) { panelAt(d, 3)["gridPos"] = panelAt(d, 2)["gridPos"] },
		"too wide": func(d map[string]any) {
			panelAt(d, 2)["gridPos"] = map[string]any{"h": 8, "w": 25, "x": 0, "y": 1}
		},
	} {
		var d map[string]any
		require.NoError(t, json.Unmarshal(b, &d))
		mutate(d)
		m, err := json.Marshal(d)
		require.NoError(t, err)
		assert.NotEmpty(t, grafanaProblems(m), "%s: not found", name)
	}
}

// panelAt returns the i-th top-level panel of a decoded dashboard.
func panelAt(d map[string]any, i int) map[string]any {
	return d["panels"].([]any)[i].(map[string]any)
}

// grafanaVarUse is a use of a dashboard variable in an expression.
var grafanaVarUse = regexp.MustCompile(`\$\{?([A-Za-z_]\w*)`)

// grafanaProblems returns what keeps the dashboard JSON b from loading
// as intended; none when it loads.
func grafanaProblems(b []byte) []string {
	type source struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	type gridPos struct{ H, W, X, Y int }
	type panel struct {
		ID          int             `json:"id"`
		Type        string          `json:"type"`
		Title       string          `json:"title"`
		Description string          `json:"description"`
		Collapsed   bool            `json:"collapsed"`
		GridPos     *gridPos        `json:"gridPos"`
		Datasource  *source         `json:"datasource"`
		FieldConfig json.RawMessage `json:"fieldConfig"`
		Options     json.RawMessage `json:"options"`
		Panels      []any           `json:"panels"`
		Targets     []struct {
			RefID        string  `json:"refId"`
			Expr         string  `json:"expr"`
			LegendFormat string  `json:"legendFormat"`
			Datasource   *source `json:"datasource"`
			Instant      bool    `json:"instant"`
			Range        bool    `json:"range"`
			Format       string  `json:"format"`
		} `json:"targets"`
	}
	var dash struct {
		Title         string          `json:"title"`
		UID           string          `json:"uid"`
		Tags          []string        `json:"tags"`
		Description   string          `json:"description"`
		Editable      bool            `json:"editable"`
		GraphTooltip  int             `json:"graphTooltip"`
		SchemaVersion int             `json:"schemaVersion"`
		Version       int             `json:"version"`
		Refresh       string          `json:"refresh"`
		Time          json.RawMessage `json:"time"`
		Timezone      string          `json:"timezone"`
		Links         []any           `json:"links"`
		Annotations   json.RawMessage `json:"annotations"`
		Templating    struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	var out []string
	// The variables carry many of Grafana's fields; they are read apart.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return []string{err.Error()}
	}
	vars := top["templating"]
	top["templating"] = json.RawMessage(`{}`)
	stripped, err := json.Marshal(top)
	if err != nil {
		return []string{err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(stripped))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&dash); err != nil {
		return []string{"decode: " + err.Error()}
	}
	if err := json.Unmarshal(vars, &dash.Templating); err != nil {
		return []string{"templating: " + err.Error()}
	}
	if dash.SchemaVersion < grafanaMinSchema || dash.SchemaVersion > grafanaMaxSchema {
		out = append(out, fmt.Sprintf("schemaVersion %d outside %d..%d", dash.SchemaVersion, grafanaMinSchema, grafanaMaxSchema))
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{1,40}$`).MatchString(dash.UID) {
		out = append(out, fmt.Sprintf("uid %q: 1 to 40 letters, digits, - and _", dash.UID))
	}
	defined := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range dash.Templating.List {
		defined[v.Name] = true
	}
	if !defined["DS_PROMETHEUS"] {
		out = append(out, "no DS_PROMETHEUS variable")
	}
	ds := source{Type: "prometheus", UID: "${DS_PROMETHEUS}"}
	ids := map[int]bool{}
	var cells []gridPos
	for _, p := range dash.Panels {
		if p.ID <= 0 || ids[p.ID] {
			out = append(out, fmt.Sprintf("panel %q: id %d not positive or not unique", p.Title, p.ID))
		}
		ids[p.ID] = true
		g := p.GridPos
		if g == nil || g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			out = append(out, fmt.Sprintf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g))
			continue
		}
		for _, c := range cells {
			if g.X < c.X+c.W && c.X < g.X+g.W && g.Y < c.Y+c.H && c.Y < g.Y+g.H {
				out = append(out, fmt.Sprintf("panel %q: gridPos %+v overlaps %+v", p.Title, *g, c))
			}
		}
		cells = append(cells, *g)
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || *p.Datasource != ds {
			out = append(out, fmt.Sprintf("panel %q: data source %+v, not the DS_PROMETHEUS variable", p.Title, p.Datasource))
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || *tg.Datasource != ds {
				out = append(out, fmt.Sprintf("panel %q %s: data source %+v, not the DS_PROMETHEUS variable", p.Title, tg.RefID, tg.Datasource))
			}
			for _, m := range grafanaVarUse.FindAllStringSubmatch(tg.Expr, -1) {
				if !defined[m[1]] {
					out = append(out, fmt.Sprintf("panel %q %s: variable $%s is not defined", p.Title, tg.RefID, m[1]))
				}
			}
		}
	}
	return out
}
