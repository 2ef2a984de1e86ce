package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/tasks"
)

// asynqmonRoute is one route of asynqmon's API, as its handler.go registers
// it.
type asynqmonRoute struct{ method, path string }

// asynqmonRoutes reads the routes of asynqmon's API from the source of the
// version this module builds with, so that a new write route in an upgrade
// is checked too.
func asynqmonRoutes(t *testing.T) []asynqmonRoute {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/hibiken/asynqmon").Output()
	require.NoError(t, err, "find asynqmon's source")
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "handler.go"))
	require.NoError(t, err)
	re := regexp.MustCompile(`api\.HandleFunc\("([^"]+)",.*\)\.Methods\("([A-Z]+)"\)`)
	var routes []asynqmonRoute
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		routes = append(routes, asynqmonRoute{method: m[2], path: m[1]})
	}
	require.Greater(t, len(routes), 50, "asynqmon's routes were not found in its handler.go")
	return routes
}

// guarded serves guardAPI over a real socket in front of a handler that
// records what reached it.
type guarded struct {
	srv     *httptest.Server
	mu      sync.Mutex
	reached []string // "METHOD path body"
}

// newGuarded answers every request that gets through with answer and, if
// not empty, the Content-Type contentType (asynqmon sets none).
func newGuarded(t *testing.T, root, answer, contentType string) *guarded {
	t.Helper()
	return newGuardedWith(t, root, newQueueSet(tasks.Shards{}, tasks.Kinds(), zap.NewNop()), answer, contentType)
}

// newGuardedWith is newGuarded for a deployment of queues.
func newGuardedWith(t *testing.T, root string, queues *queueSet, answer, contentType string) *guarded {
	t.Helper()
	g := &guarded{}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		g.reached = append(g.reached, r.Method+" "+r.URL.EscapedPath()+" "+string(b))
		g.mu.Unlock()
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		_, _ = io.WriteString(w, answer)
	})
	g.srv = httptest.NewServer(guardAPI(root+"/api/", queues, next))
	t.Cleanup(g.srv.Close)
	return g
}

// do sends a request with the path as given, unescaped or not.
func (g *guarded) do(t *testing.T, method, rawPath, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, g.srv.URL, strings.NewReader(body))
	require.NoError(t, err)
	req.URL.Opaque = rawPath // sent as it is, like a browser's request line
	resp, err := g.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func (g *guarded) take() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.reached
	g.reached = nil
	return out
}

// badTaskIDs are task IDs outside the contract, as a path segment: raw where
// a path can carry them, and as the dashboard's own display form.
var badTaskIDs = []string{
	"a%20b", "crm%3F7", "crm%237", "..%2Fpending_tasks:delete_all", "~..%2Fpending_tasks:delete_all",
	"%25", ".hidden", "-flag", "%C3%A9vt", strings.Repeat("e", 129),
}

// TestGuardCoversEveryWriteRoute sends every write route of asynqmon's API
// through the guard with task IDs outside the contract, in the path and in
// batch bodies: each is refused with a JSON error and reaches nothing. With
// valid IDs, and on the write routes without a task ID, the request goes
// through unchanged.
func TestGuardCoversEveryWriteRoute(t *testing.T) {
	t.Parallel()
	for _, root := range []string{"", "/asynq"} {
		g := newGuarded(t, root, `{}`, "")
		withID, batch, other := 0, 0, 0
		for _, rt := range asynqmonRoutes(t) {
			if rt.method == http.MethodGet {
				continue
			}
			p := root + "/api" + strings.NewReplacer("{qname}", "order_modify", "{gname}", "g1").Replace(rt.path)
			switch {
			case strings.Contains(p, "{task_id}"):
				withID++
				for _, bad := range badTaskIDs {
					status, body := g.do(t, rt.method, strings.Replace(p, "{task_id}", bad, 1), "")
					assert.Equal(t, http.StatusBadRequest, status, "%s %s with %s", rt.method, rt.path, bad)
					assertRefusal(t, body)
				}
				require.Empty(t, g.take(), "%s %s: a refused request reached asynqmon", rt.method, rt.path)
				good := strings.Replace(p, "{task_id}", "crm:order-7:v3", 1)
				status, _ := g.do(t, rt.method, good, "")
				assert.Equal(t, http.StatusOK, status, "%s %s", rt.method, good)
				assert.Equal(t, []string{rt.method + " " + good + " "}, g.take())
			case strings.Contains(p, ":batch_"):
				batch++
				for _, bad := range []string{"../pending_tasks:delete_all", "a b", "~..%2Fx", "evt?x", ""} {
					b, err := json.Marshal(map[string][]string{"task_ids": {"evt-1", bad}})
					require.NoError(t, err)
					status, body := g.do(t, rt.method, p, string(b))
					assert.Equal(t, http.StatusBadRequest, status, "%s %s with %q", rt.method, rt.path, bad)
					assertRefusal(t, body)
				}
				for _, malformed := range []string{`{"task_ids":"x"}`, `{"ids":["evt-1"]}`, `[`} {
					status, body := g.do(t, rt.method, p, malformed)
					assert.Equal(t, http.StatusBadRequest, status, "%s %s with %s", rt.method, rt.path, malformed)
					assertRefusal(t, body)
				}
				require.Empty(t, g.take(), "%s %s: a refused request reached asynqmon", rt.method, rt.path)
				good := `{"task_ids":["evt-1","crm:order-7:v3"]}`
				status, _ := g.do(t, rt.method, p, good)
				assert.Equal(t, http.StatusOK, status, "%s %s", rt.method, p)
				assert.Equal(t, []string{rt.method + " " + p + " " + good}, g.take(), "the body reaches asynqmon unchanged")
			default:
				other++
				status, _ := g.do(t, rt.method, p, "")
				assert.Equal(t, http.StatusOK, status, "%s %s", rt.method, p)
				assert.Equal(t, []string{rt.method + " " + p + " "}, g.take())
			}
		}
		// v0.7.2 has 15 single-task and 15 batch write routes.
		assert.GreaterOrEqual(t, withID, 15, "single-task write routes")
		assert.GreaterOrEqual(t, batch, 15, "batch write routes")
		assert.Positive(t, other, "write routes without a task ID")
	}
}

// TestGuardRefusesAmbiguousPaths checks writes whose path asynqmon's router
// would read, clean or redirect differently from what it says.
func TestGuardRefusesAmbiguousPaths(t *testing.T) {
	t.Parallel()
	g := newGuarded(t, "/asynq", `{}`, "")
	for _, p := range []string{"/asynq%2Fapi%2Fqueues:pause", "/asynq/api%2Fx", "/asynq/api/"} {
		status, body := g.do(t, http.MethodPost, p, "")
		assert.Equal(t, http.StatusBadRequest, status, p)
		assertRefusal(t, body)
	}
	assert.Empty(t, g.take())

	g = newGuarded(t, "", `{}`, "")
	for _, p := range []string{
		"/api/queues/order_modify/pending_tasks/..%2F..%2Fother/pending_tasks:delete_all",
		"/api/queues/order_modify%2Fpending_tasks:delete_all",
		"/api/queues/order_modify/pending_tasks/x/../../other/pending_tasks:delete_all",
		"/api/queues//order_modify:pause",
		"/api/queues/order_modify/pending_tasks/evt-1/",
	} {
		status, body := g.do(t, http.MethodDelete, p, "")
		assert.Equal(t, http.StatusBadRequest, status, p)
		assertRefusal(t, body)
	}
	assert.Empty(t, g.take())
}

func assertRefusal(t *testing.T, body string) {
	t.Helper()
	assertRefusalCode(t, body, errorCodeInvalidTaskID)
}

// assertRefusalCode checks that body is the guard's JSON error with one of
// codes.
func assertRefusalCode(t *testing.T, body string, codes ...string) {
	t.Helper()
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&e), body)
	assert.Contains(t, codes, e.Error.Code, body)
	assert.NotEmpty(t, e.Error.Message)
}

// TestGuardRewritesTaskIDs checks that GET answers of the API show task IDs
// outside the contract in their display form, and leave the rest alone.
func TestGuardRewritesTaskIDs(t *testing.T) {
	t.Parallel()
	const answer = `{"tasks":[{"id":"../pending_tasks:delete_all","queue":"order_modify","payload":"{\"event_id\":\"../x\"}","max_retry":25},` +
		`{"id":"crm:order-7:v3","retried":0}],"stats":{"size":2,"memory_usage_bytes":12345678901234567890},` +
		`"workers":[{"task_id":"a b?c#d\\e%f","id":"srv-1"}],"id":7}` + "\n"
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8"} {
		g := newGuarded(t, "", answer, ct)
		status, body := g.do(t, http.MethodGet, "/api/queues/order_modify/pending_tasks", "")
		require.Equal(t, http.StatusOK, status)
		var got map[string]any
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&got), "Content-Type %q", ct)
		list := got["tasks"].([]any)
		assert.Equal(t, "~..%2Fpending_tasks:delete_all", list[0].(map[string]any)["id"])
		assert.Equal(t, `{"event_id":"../x"}`, list[0].(map[string]any)["payload"], "payloads are not task IDs")
		assert.Equal(t, json.Number("25"), list[0].(map[string]any)["max_retry"])
		assert.Equal(t, "crm:order-7:v3", list[1].(map[string]any)["id"])
		assert.Equal(t, json.Number("12345678901234567890"), got["stats"].(map[string]any)["memory_usage_bytes"], "numbers are kept exactly")
		assert.Equal(t, "~a%20b%3Fc%23d%5Ce%25f", got["workers"].([]any)[0].(map[string]any)["task_id"])
		assert.Equal(t, json.Number("7"), got["id"], "a number is no task ID")
	}

	// An answer without such IDs is passed on byte for byte, and so are a
	// text answer and anything outside the API.
	for _, tt := range []struct{ path, answer, ct string }{
		{"/api/queues/order_modify/pending_tasks", `{"tasks":[{"id":"evt-1"}]}`, ""},
		{"/api/queues/order_modify/tasks/x", "task not found: ../x\n", "text/plain; charset=utf-8"},
		{"/static/x.json", `{"id":"../x"}`, "application/json"},
	} {
		g := newGuarded(t, "", tt.answer, tt.ct)
		_, body := g.do(t, http.MethodGet, tt.path, "")
		assert.Equal(t, tt.answer, body, tt.path)
	}
}

func TestDisplayTaskID(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"../pending_tasks:delete_all", "~..%2Fpending_tasks:delete_all"},
		{".", "~."},
		{"..", "~.."},
		{"a b", "~a%20b"},
		{"é", "~%C3%A9"},
		{"~", "~%7E"},
		{"", "~"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := displayTaskID(tt.in)
			assert.Equal(t, tt.want, got)
			assert.NotContains(t, got, "/")
			assert.False(t, bytes.ContainsAny([]byte(got), "?#\\"))
		})
	}
}

// fuzzQueues are the queues of FuzzGuardWrite's deployment.
var fuzzQueues = newQueueSet(tasks.Shards{Count: 2, Draining: []int{1}}, tasks.Kinds(), zap.NewNop())

// FuzzGuardWrite sends any path and body through the guard as a write: it
// never panics, and what it lets through has a canonical path under
// queues/{qname} of a queue the deployment defines, with a safe group if
// any, whose task IDs, in the path and in a batch body, are valid event
// IDs.
func FuzzGuardWrite(f *testing.F) {
	for _, s := range []struct{ path, body string }{
		{"/api/queues/order_modify/pending_tasks/evt-1", ""},
		{"/api/queues/order_modify/pending_tasks/..%2Fpending_tasks:delete_all", ""},
		{"/api/queues/order_modify/scheduled_tasks/crm:7:run", ""},
		{"/api/queues/order_modify/pending_tasks:batch_delete", `{"task_ids":["evt-1","../x"]}`},
		{"/api/queues/order_modify/groups/g/aggregating_tasks:batch_run", `{"task_ids":["a"]}`},
		{"/api%2F", ""},
		{"/api/queues//x", ""},
		{"/api/queues/order_modify:pause", ""},
		{"/api/queues/order_modify:1:resume", ""},
		{"/api/queues/order_modify/pending_tasks:archive_all", ""},
		{"/api/queues/order_modify%2Fpending_tasks:delete_all", ""},
		{"/api/queues/default/pending_tasks:delete_all", ""},
		{"/api/queues/order_exchange:0/groups/g.1/aggregating_tasks:run_all", ""},
	} {
		f.Add(s.path, s.body)
	}
	f.Fuzz(func(t *testing.T, rawPath, body string) {
		req, err := http.NewRequest(http.MethodPost, "http://dashboard"+rawPath, strings.NewReader(body))
		if err != nil {
			return
		}
		var reached *http.Request
		var reachedBody []byte
		h := guardAPI("/api/", fuzzQueues, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			reached = r
			reachedBody, _ = io.ReadAll(r.Body)
		}))
		h.ServeHTTP(httptest.NewRecorder(), req)
		if reached == nil || !strings.HasPrefix(reached.URL.Path, "/api/") {
			return
		}
		p := reached.URL.Path
		require.Equal(t, path.Clean(p), p, "a path that is not canonical got through")
		segs := strings.Split(p, "/")
		require.GreaterOrEqual(t, len(segs), 4, "a write outside queues/{qname} got through: %q", p)
		require.Equal(t, "queues", segs[2], "a write outside queues/{qname} got through: %q", p)
		qname := segs[3]
		if len(segs) == 4 {
			qname = strings.TrimSuffix(strings.TrimSuffix(qname, ":pause"), ":resume")
		}
		require.True(t, fuzzQueues.defines(qname), "a write on queue %q got through", qname)
		if len(segs) > 5 && segs[4] == "groups" {
			require.True(t, safeGroup(segs[5]), "a write on group %q got through", segs[5])
		}
		for i := 1; i < len(segs); i++ {
			if strings.HasSuffix(segs[i-1], "_tasks") {
				id := segs[i]
				for _, a := range taskActions {
					if s, ok := strings.CutSuffix(id, a); ok {
						id = s
						break
					}
				}
				require.True(t, tasks.ValidEventID(id), "task ID %q got through", id)
			}
		}
		if strings.Contains(segs[len(segs)-1], "_tasks:batch_") {
			var b struct {
				TaskIDs []string `json:"task_ids"`
			}
			require.NoError(t, json.NewDecoder(bytes.NewReader(reachedBody)).Decode(&b))
			for _, id := range b.TaskIDs {
				require.True(t, tasks.ValidEventID(id), "task ID %q got through in a batch", id)
			}
		}
	})
}
