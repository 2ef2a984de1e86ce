package intake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(specCoverage{m}))
}

// The API keys of the test servers.
const (
	key1 = "key-one-0123456789abcdef"
	key2 = "key-two-fedcba9876543210"
)

// env is an intake on a Redis of the test's own, served over a real socket.
type env struct {
	srv   *httptest.Server
	db    *redistest.DB
	rdb   redis.UniversalClient
	store *redisstore.Store
	insp  *asynq.Inspector
	logs  *observer.ObservedLogs
}

// newEnv serves an intake on the test's database with keys key1 and key2;
// configure, when not nil, adjusts the Config.
func newEnv(t *testing.T, configure func(*Config)) *env {
	t.Helper()
	db := redistest.New(t)
	e := newEnvOn(t, db.Client, db.Prefix, configure)
	e.db = db
	return e
}

// newEnvServer is newEnv with the test server's http.Server adjusted by
// server before it starts, for its timeouts.
func newEnvServer(t *testing.T, configure func(*Config), server func(*http.Server)) *env {
	t.Helper()
	db := redistest.New(t)
	e := newEnvOnServer(t, db.Client, db.Prefix, configure, server)
	e.db = db
	return e
}

// newEnvOn serves an intake on rdb, which may be unreachable.
func newEnvOn(t *testing.T, rdb redis.UniversalClient, prefix string, configure func(*Config)) *env {
	t.Helper()
	return newEnvOnServer(t, rdb, prefix, configure, nil)
}

// newEnvOnServer is newEnvOn with server, when not nil, adjusting the test
// server's http.Server before it starts.
func newEnvOnServer(t *testing.T, rdb redis.UniversalClient, prefix string, configure func(*Config), server func(*http.Server)) *env {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	cfg := Config{APIKeys: []string{key1, key2}, Logger: zap.New(core)}
	if configure != nil {
		configure(&cfg)
	}
	// The producer traces with the intake's provider, as serve sets them up.
	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix, TracerProvider: cfg.TracerProvider})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	store, err := redisstore.New(rdb, redisstore.Config{Prefix: prefix})
	require.NoError(t, err)
	s, err := New(rdb, p, store, cfg)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(record(t, s))
	if server != nil {
		server(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return &env{srv: srv, rdb: rdb, store: store, insp: asynq.NewInspectorFromRedisClient(rdb), logs: logs}
}

// response is an answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// errorResponse is the JSON of an error answer.
type errorResponse struct {
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Field     string `json:"field"`
		RequestID string `json:"request_id"`
	} `json:"error"`
	TaskID  string `json:"task_id"`
	Queue   string `json:"queue"`
	EventID string `json:"event_id"`
	State   string `json:"state"`
}

// errorBody decodes the answer as an error, strictly.
func (r response) errorBody(t *testing.T) errorResponse {
	t.Helper()
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var out errorResponse
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&out), "%s", r.body)
	require.NotEmpty(t, out.Error.Code, "%s", r.body)
	require.NotEmpty(t, out.Error.Message, "%s", r.body)
	require.Equal(t, r.header.Get(HeaderRequestID), out.Error.RequestID)
	return out
}

// decode decodes the answer's JSON into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.NoError(t, json.Unmarshal(r.body, v), "%s", r.body)
}

// do sends a request authenticated with key1 unless header sets
// Authorization ("" for none), with the given headers, and reads the answer.
func (e *env) do(t *testing.T, method, path, body string, header map[string]string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key1)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// post enqueues body at path with the given Idempotency-Key ("" for none).
func (e *env) post(t *testing.T, path, key, body string) response {
	t.Helper()
	return e.do(t, http.MethodPost, path, body, map[string]string{HeaderIdempotencyKey: key})
}

// queued returns how many tasks the queues hold, in any state.
func (e *env) queued(t *testing.T) int {
	t.Helper()
	queues, err := e.insp.Queues()
	require.NoError(t, err)
	n := 0
	for _, q := range queues {
		info, err := e.insp.GetQueueInfo(q)
		require.NoError(t, err)
		n += info.Size
	}
	return n
}

// closedRedis returns a client of a port that nothing listens on.
func closedRedis(t *testing.T) *redis.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// observed records, per route pattern ("POST /v1/..."), the statuses the
// test servers answered, for specCoverage.
var observed = struct {
	sync.Mutex
	m map[string]map[int]bool
}{m: make(map[string]map[int]bool)}

// routeMux finds a request's route pattern as the server's mux would.
var routeMux = sync.OnceValue(func() *http.ServeMux {
	mux := http.NewServeMux()
	for _, rt := range Routes(tasks.Kinds()) {
		mux.Handle(rt.Method+" "+rt.Path, http.NotFoundHandler())
	}
	return mux
})

// record wraps a test server's handler to note each answer's status, for
// specCoverage, and to check every answer against api/openapi.yaml with
// kin-openapi's openapi3filter (checkResponse): so every answer of every
// test of the package, whichever helper sent the request, is held to the
// spec, and a disagreement fails the test that saw it.
func record(t *testing.T, h http.Handler) http.Handler {
	doc := loadOpenAPI(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := routeMux().Handler(r)
		sw := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if err := checkResponse(doc, r, pattern, cmpStatus(sw.status), sw.Header(), sw.body.Bytes()); err != nil {
			t.Errorf("%s %s answered %d, not as %s says: %v\n%s", r.Method, r.URL.RequestURI(), cmpStatus(sw.status), specPath, err, sw.body.Bytes())
		}
		if pattern == "" {
			return
		}
		observed.Lock()
		defer observed.Unlock()
		if observed.m[pattern] == nil {
			observed.m[pattern] = make(map[int]bool)
		}
		observed.m[pattern][cmpStatus(sw.status)] = true
	})
}

// checkResponse validates an answer against the spec: with openapi3filter
// against its operation's response for the status (or the default one),
// headers and body; an answer to a route that is no operation (pattern
// "", a 404 or 405) against the Error schema.
func checkResponse(doc *openapi3.T, r *http.Request, pattern string, status int, header http.Header, body []byte) error {
	if pattern == "" {
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return fmt.Errorf("the body of an answer to no operation is not JSON: %w", err)
		}
		return doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.EnableFormatValidation())
	}
	method, path, _ := strings.Cut(pattern, " ")
	item := doc.Paths.Value(path)
	if item == nil || item.GetOperation(method) == nil {
		return fmt.Errorf("no operation %s in the spec", pattern)
	}
	route := &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: item.GetOperation(method)}
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, Route: route},
		Status:                 status,
		Header:                 header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus:   true,
			MultiError:              true,
			SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.EnableFormatValidation()},
		},
	}
	input.SetBodyBytes(body)
	return openapi3filter.ValidateResponse(context.Background(), input)
}

func cmpStatus(s int) int {
	if s == 0 {
		return http.StatusOK
	}
	return s
}

// statusRecorder notes the status and the body of an answer.
type statusRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// manyRefusals lets a test's client be refused a thousand times before
// the limit of refused requests answers 429.
func manyRefusals(c *Config) { c.refusal, c.refusalGlobal = Limit{Burst: 1000}, Limit{Burst: 1000} }
