package intake

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

const specPath = "../../api/openapi.yaml"

// spec is the part of the OpenAPI document the tests compare with the code.
type spec struct {
	OpenAPI    string                          `yaml:"openapi"`
	Security   []map[string][]string           `yaml:"security"`
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas map[string]schema `yaml:"schemas"`
	} `yaml:"components"`
}

// operation is one operation of a path item.
type operation struct {
	OperationID string                 `yaml:"operationId"`
	Security    *[]map[string][]string `yaml:"security"`
	Responses   map[string]yaml.Node   `yaml:"responses"`
}

// schema is the part of a schema object the tests read: the members, and
// the constraints TestSpecConstraintsMatchValidate holds the payloads to.
type schema struct {
	Ref           string               `yaml:"$ref"`
	Type          string               `yaml:"type"`
	Pattern       string               `yaml:"pattern"`
	Enum          []string             `yaml:"enum"`
	Required      []string             `yaml:"required"`
	Properties    map[string]yaml.Node `yaml:"properties"`
	Items         yaml.Node            `yaml:"items"`
	MinLength     *int                 `yaml:"minLength"`
	MaxLength     *int                 `yaml:"maxLength"`
	MinItems      *int                 `yaml:"minItems"`
	MaxItems      *int                 `yaml:"maxItems"`
	MinProperties *int                 `yaml:"minProperties"`
	Minimum       *float64             `yaml:"minimum"`
	Maximum       *float64             `yaml:"maximum"`
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadSpec(tb testing.TB) spec {
	tb.Helper()
	b, err := os.ReadFile(specPath)
	require.NoError(tb, err)
	var s spec
	require.NoError(tb, yaml.Unmarshal(b, &s))
	return s
}

// operations returns the spec's operations by "METHOD /path".
func (s spec) operations(tb testing.TB) map[string]operation {
	tb.Helper()
	out := make(map[string]operation)
	for path, item := range s.Paths {
		for key, node := range item {
			if !slices.Contains(httpMethods, key) {
				continue
			}
			var op operation
			require.NoError(tb, node.Decode(&op), "%s %s", key, path)
			out[strings.ToUpper(key)+" "+path] = op
		}
	}
	return out
}

// TestSpecRoutes checks that the server's routes are the spec's operations,
// with the same authentication and the same rate limit.
func TestSpecRoutes(t *testing.T) {
	s := loadSpec(t)
	require.True(t, strings.HasPrefix(s.OpenAPI, "3.1."), "OpenAPI version %q", s.OpenAPI)
	require.Equal(t, []map[string][]string{{"bearerAuth": {}}}, s.Security, "authentication is the default")
	ops := s.operations(t)

	var inSpec, inCode []string
	for k := range ops {
		inSpec = append(inSpec, k)
	}
	for _, rt := range Routes(tasks.Kinds()) {
		inCode = append(inCode, rt.Method+" "+rt.Path)
	}
	slices.Sort(inSpec)
	slices.Sort(inCode)
	require.Equal(t, inCode, inSpec, "routes registered by the server vs operations in %s", specPath)

	for _, rt := range Routes(tasks.Kinds()) {
		op := ops[rt.Method+" "+rt.Path]
		public := op.Security != nil && len(*op.Security) == 0
		assert.Equal(t, rt.Public, public, "%s %s: public (security: [])", rt.Method, rt.Path)
		// Every route with a key may answer 429: the enqueues for their
		// key's rate limit, the operator actions for their principal's
		// (orderops), the others for too many refusals only.
		node, limited := op.Responses["429"]
		assert.Equal(t, !rt.Public, limited, "%s %s: a 429 response", rt.Method, rt.Path)
		var ref struct {
			Ref string `yaml:"$ref"`
		}
		require.NoError(t, node.Decode(&ref))
		want := "#/components/responses/TooManyRefusals"
		switch {
		case rt.Limited:
			want = "#/components/responses/RateLimited"
		case strings.Contains(rt.Path, "/actions/"):
			want = "#/components/responses/ActionRateLimited"
		}
		if limited {
			assert.Equal(t, want, ref.Ref, "%s %s: the 429 of a rate-limited route, an action or too many refusals", rt.Method, rt.Path)
		}
		assert.NotEmpty(t, op.OperationID, "%s %s", rt.Method, rt.Path)
	}
}

// TestSpecSchemas checks that the spec's schemas have the members of the Go
// values the server reads and writes, and that a response schema requires
// exactly the members the server always writes.
func TestSpecSchemas(t *testing.T) {
	s := loadSpec(t)
	tests := []struct {
		schema   string
		value    any
		drop     []string // members of value the schema leaves out
		response bool
	}{
		{"Item", tasks.Item{}, nil, false},
		{"Changes", tasks.Changes{}, nil, false},
		{"EnqueueResult", producer.Result{}, nil, true},
		{"ErrorDetail", errorDetail{}, nil, true},
		{"Error", errorBody{}, []string{"task_id", "queue", "event_id", "state"}, true},
		{"DuplicateError", errorBody{existingTask: &existingTask{}}, nil, false},
		{"KeyReusedError", errorBody{existingTask: &existingTask{}}, []string{"state"}, false},
		{"Order", orders.Order{}, nil, true},
		{"HistoryEntry", orders.Entry{}, nil, true},
		{"History", orderview.History{}, nil, true},
		{"Skip", orderview.Skip{}, nil, true},
		{"OrderStatus", orderview.Status{}, nil, true},
		{"OrderLock", orderview.Lock{}, nil, true},
		{"OrderSequence", orderview.Sequence{}, nil, true},
		{"Position", orderview.Position{}, nil, true},
		{"Gap", orderview.Gap{}, nil, true},
		{"BlockedPage", orderview.BlockedPage{}, nil, true},
		{"BlockedOrder", orderview.BlockedOrder{}, nil, true},
		{"BlockedFailing", orderview.Failing{}, nil, true},
		{"BlockedLock", orderview.StaleLock{}, nil, true},
		{"BlockedCreation", orderview.Creation{}, nil, true},
		{"BlockedScheduled", orderview.Scheduled{}, nil, true},
		{"BlockedHold", orderview.Hold{}, nil, true},
		{"SequenceLogEntry", orderview.LogEntry{}, nil, true},
		{"OrderTask", orderview.Task{}, nil, true},
		{"Task", taskView{}, nil, true},
		{"Health", status{}, nil, true},
		{"ActionRequest", orderops.Body{}, nil, false},
		{"ActionResult", orderops.Result{}, nil, true},
	}
	// The body of each kind's POST route, from the kinds table: a kind
	// added without its schema fails here (and TestSpecKindRequests).
	for _, k := range tasks.Kinds() {
		zero, err := k.Decode([]byte("{}"))
		require.NoError(t, err, k.Type)
		tests = append(tests, struct {
			schema   string
			value    any
			drop     []string
			response bool
		}{requestSchema(k), zero, []string{"seq", "trace"}, false})
	}
	for _, tt := range tests {
		t.Run(tt.schema, func(t *testing.T) {
			sc, ok := s.Components.Schemas[tt.schema]
			require.True(t, ok, "schema %s missing", tt.schema)
			all, always := jsonMembers(reflect.TypeOf(tt.value))
			all = slices.DeleteFunc(all, func(m string) bool { return slices.Contains(tt.drop, m) })
			always = slices.DeleteFunc(always, func(m string) bool { return slices.Contains(tt.drop, m) })
			var props []string
			for p := range sc.Properties {
				props = append(props, p)
			}
			slices.Sort(props)
			assert.Equal(t, all, props, "members")
			if tt.response {
				assert.ElementsMatch(t, always, sc.Required, "required = members never omitted")
			}
		})
	}
}

// requestSchema is the name of the spec's schema of the body of kind k's
// POST route: the kind's name in upper camel case, then "Request"
// ("ModifyRequest"; "GiftCardRequest" for gift_card).
func requestSchema(k *tasks.Kind) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(k.Name, func(r rune) bool { return r == '_' || r == '-' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String() + "Request"
}

// TestSpecKindRequests checks that the POST route of every kind of the
// table takes the kind's request schema (requestSchema) as its JSON body,
// required, so that a kind added to the table is documented as the others
// are.
func TestSpecKindRequests(t *testing.T) {
	s := loadSpec(t)
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			node, ok := s.Paths["/v1/orders/{order_no}/"+k.Name]["post"]
			require.True(t, ok, "%s has no POST /v1/orders/{order_no}/%s in %s", k.Type, k.Name, specPath)
			var op struct {
				RequestBody struct {
					Required bool `yaml:"required"`
					Content  map[string]struct {
						Schema struct {
							Ref string `yaml:"$ref"`
						} `yaml:"schema"`
					} `yaml:"content"`
				} `yaml:"requestBody"`
			}
			require.NoError(t, node.Decode(&op))
			assert.True(t, op.RequestBody.Required, "the body is required")
			assert.Equal(t, "#/components/schemas/"+requestSchema(k), op.RequestBody.Content["application/json"].Schema.Ref)
			assert.Contains(t, s.Components.Schemas, requestSchema(k))
		})
	}
}

// TestSpecKindNames checks the places of the spec that name the kinds
// against the table: the Queue pattern must match every kind's queue and
// shard queues and name no other queue, and the task type enums must be
// the kinds' types (a history entry's, those and the types of the writes
// no task makes). A kind added to the table fails here until the spec
// names it.
func TestSpecKindNames(t *testing.T) {
	s := loadSpec(t)
	kinds := tasks.Kinds()
	fix := func(where string) string {
		return fmt.Sprintf("name every kind of tasks.Kinds in %s, %s", specPath, where)
	}
	t.Run("Queue", func(t *testing.T) {
		pattern := s.Components.Schemas["Queue"].Pattern
		re, err := regexp.Compile(pattern)
		require.NoError(t, err)
		var queues []string
		for _, k := range kinds {
			require.True(t, strings.HasPrefix(k.Queue, "order_"), "%s: a kind's queue begins with order_", k.Queue)
			queues = append(queues, strings.TrimPrefix(k.Queue, "order_"))
			var misses []string
			for _, q := range append(k.ShardQueues(tasks.MaxShards), k.Queue) {
				if !re.MatchString(q) {
					misses = append(misses, q)
				}
			}
			assert.Empty(t, misses, "%s matches none of these: %s", pattern, fix("components.schemas.Queue.pattern"))
		}
		m := regexp.MustCompile(`^\^order_\(([a-z0-9_|]+)\)`).FindStringSubmatch(pattern)
		require.NotNil(t, m, "the Queue pattern begins ^order_(<queues without order_, separated by |>): %s", pattern)
		assert.ElementsMatch(t, queues, strings.Split(m[1], "|"), fix("components.schemas.Queue.pattern"))
	})
	enum := func(t *testing.T, schemaName, prop string) []string {
		t.Helper()
		node, ok := s.Components.Schemas[schemaName].Properties[prop]
		require.True(t, ok, "%s.%s missing", schemaName, prop)
		var p struct {
			Enum []string `yaml:"enum"`
		}
		require.NoError(t, node.Decode(&p))
		return p.Enum
	}
	t.Run("TaskType", func(t *testing.T) {
		assert.ElementsMatch(t, kinds.Types(), s.Components.Schemas["TaskType"].Enum, fix("components.schemas.TaskType.enum"))
		for _, name := range []string{"Task", "OrderTask"} {
			var ref struct {
				Ref string `yaml:"$ref"`
			}
			node := s.Components.Schemas[name].Properties["type"]
			require.NoError(t, node.Decode(&ref))
			assert.Equal(t, "#/components/schemas/TaskType", ref.Ref, "%s.type is a TaskType", name)
		}
	})
	t.Run("HistoryEntry", func(t *testing.T) {
		want := append(kinds.Types(), orders.TypeCreated, orders.TypePut, orders.TypeNote)
		assert.ElementsMatch(t, want, enum(t, "HistoryEntry", "type"),
			fix("components.schemas.HistoryEntry.properties.type.enum")+", with order:created, order:put and order:note")
	})
}

// jsonMembers returns the JSON member names of struct type t, sorted, and
// those of them that encoding/json never omits. Embedded structs are
// flattened; their members count as omittable when the embedding is a
// pointer.
func jsonMembers(t reflect.Type) (all, always []string) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for f := range t.Fields() {
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			a, w := jsonMembers(f.Type)
			all = append(all, a...)
			if f.Type.Kind() != reflect.Pointer {
				always = append(always, w...)
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always = append(always, name)
		}
	}
	slices.Sort(all)
	slices.Sort(always)
	return all, always
}

// specCoverage runs the tests and then, on a full run, checks that every
// response the spec documents was answered by some test and that no test
// saw an answer the spec does not document.
type specCoverage struct{ m interface{ Run() int } }

func (c specCoverage) Run() int {
	code := c.m.Run()
	if code != 0 || !fullRun() {
		return code
	}
	if err := checkCoverage(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: spec coverage:", err)
		return 1
	}
	return code
}

// fullRun reports whether every test ran: no -run, -skip, -fuzz or -list.
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip", "test.fuzz", "test.list"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

func checkCoverage() error {
	s := loadSpec(failer{})
	var problems []string
	observed.Lock()
	defer observed.Unlock()
	for key, op := range s.operations(failer{}) {
		documented := make(map[int]bool)
		for code := range op.Responses {
			if code == "default" {
				// Any other answer: the 404 and 405 of routes that are
				// no operation, which have no pattern to record.
				continue
			}
			n, err := strconv.Atoi(code)
			if err != nil {
				return fmt.Errorf("%s: response %q is not a status code", key, code)
			}
			documented[n] = true
			if !observed.m[key][n] {
				problems = append(problems, fmt.Sprintf("%s: documented %d, answered by no test", key, n))
			}
		}
		for n := range observed.m[key] {
			if !documented[n] {
				problems = append(problems, fmt.Sprintf("%s: answered %d, not documented", key, n))
			}
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return fmt.Errorf("\n\t%s", strings.Join(problems, "\n\t"))
	}
	return nil
}

// failer is a testing.TB for loading the spec outside a test: it panics
// on failure, which fails the test binary.
type failer struct{ testing.TB }

func (failer) Helper() {}
func (failer) Errorf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (failer) FailNow() { panic("spec coverage: cannot load the spec") }

// specPatterns returns the spec's patterns of the event ID, the
// Idempotency-Key header and the order number, compiled.
func specPatterns(tb testing.TB) (eventID, key, orderNo *regexp.Regexp) {
	tb.Helper()
	b, err := os.ReadFile(specPath)
	require.NoError(tb, err)
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Pattern string `yaml:"pattern"`
			} `yaml:"schemas"`
			Parameters map[string]struct {
				Schema struct {
					Pattern string `yaml:"pattern"`
				} `yaml:"schema"`
			} `yaml:"parameters"`
		} `yaml:"components"`
	}
	require.NoError(tb, yaml.Unmarshal(b, &doc))
	compile := func(name, p string) *regexp.Regexp {
		require.NotEmpty(tb, p, "%s has no pattern", name)
		re, err := regexp.Compile(p)
		require.NoError(tb, err, name)
		return re
	}
	return compile("EventID", doc.Components.Schemas["EventID"].Pattern),
		compile("IdempotencyKey", doc.Components.Parameters["IdempotencyKey"].Schema.Pattern),
		compile("OrderNo", doc.Components.Schemas["OrderNo"].Pattern)
}

// FuzzSpecPatterns checks that the spec's patterns accept exactly what the
// server accepts: event IDs (body and path), Idempotency-Key values and
// order numbers. Its seeds run with the tests.
func FuzzSpecPatterns(f *testing.F) {
	for _, s := range []string{
		"crm-7f3a9c", "0190f8a2-5b7e-7c3d-9a41-2f6e8b1c0d3e", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "crm:order-7:v3.1",
		"x", "7", "", "a b", "../pending_tasks:delete_all", "crm/7", "evt?x=1", "evt#1", "evt%2F1", ".evt", "-evt",
		"_evt", "SO_1-a", "SO.1", "évt", "a\n", "\"abc\"", `"a\"b"`, `"`, `""`, "\"../x\"",
		strings.Repeat("e", 64), strings.Repeat("e", 65), strings.Repeat("e", 128), strings.Repeat("e", 129),
		`"` + strings.Repeat("e", 128) + `"`,
	} {
		f.Add(s)
	}
	eventID, key, orderNo := specPatterns(f)
	f.Fuzz(func(t *testing.T, s string) {
		assert.Equal(t, tasks.ValidEventID(s), eventID.MatchString(s), "EventID %q", s)
		// A header value reaches the server trimmed of white space at its
		// ends (net/http trims spaces and tabs and refuses other controls).
		if s == strings.TrimSpace(s) {
			_, present, aerr := idempotencyKey([]string{s})
			assert.Equal(t, present && aerr == nil, key.MatchString(s), "Idempotency-Key %q", s)
		}
		assert.Equal(t, tasks.ValidOrderNo(s), orderNo.MatchString(s), "OrderNo %q", s)
	})
}

// TestSpecErrorCodes checks that the spec's list of error codes is every
// code the intake answers (the constants named code…), and nothing else.
func TestSpecErrorCodes(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var codes []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !strings.HasPrefix(n.Name, "code") || !ok || lit.Kind != token.STRING {
						continue
					}
					c, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					codes = append(codes, c)
				}
			}
		}
	}
	require.NotEmpty(t, codes)
	s := loadSpec(t)
	var enum struct {
		Enum []string `yaml:"enum"`
	}
	node := s.Components.Schemas["ErrorDetail"].Properties["code"]
	require.NoError(t, node.Decode(&enum))
	slices.Sort(codes)
	slices.Sort(enum.Enum)
	assert.Equal(t, codes, enum.Enum, "ErrorDetail.code's enum in %s", specPath)
}
