package intake

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// TestAuth checks that both configured keys work (rotation), that anything
// else gets 401 with a challenge, and that the probes need no key.
func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, manyRefusals)

	for i, key := range []string{key1, key2} {
		r := e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{
			"Authorization": "Bearer " + key, HeaderIdempotencyKey: fmt.Sprintf("evt-%d", i)})
		require.Equal(t, http.StatusAccepted, r.status, "key #%d: %s", i+1, r.body)
		r = e.do(t, http.MethodGet, "/v1/orders/SO1", "", map[string]string{"Authorization": "bearer " + key})
		require.Equal(t, http.StatusNotFound, r.status, "key #%d (lower-case scheme): %s", i+1, r.body)
	}

	refused := map[string]string{
		"none":             "",
		"wrong key":        "Bearer " + strings.Repeat("x", 24),
		"key prefix":       "Bearer " + key1[:len(key1)-1],
		"key with suffix":  "Bearer " + key1 + "x",
		"basic":            "Basic a2V5OnZhbHVl",
		"key without type": key1,
	}
	for name, auth := range refused {
		for _, rt := range Routes(tasks.Kinds()) {
			if rt.Public {
				continue
			}
			path := strings.NewReplacer("{order_no}", "SO1", "{task_id}", "evt-0").Replace(rt.Path)
			r := e.do(t, rt.Method, path, modifyBody, map[string]string{"Authorization": auth, HeaderIdempotencyKey: "evt-auth"})
			require.Equal(t, http.StatusUnauthorized, r.status, "%s %s %s: %s", name, rt.Method, path, r.body)
			assert.Equal(t, []string{`Bearer realm="orderworker intake"`}, r.header.Values("WWW-Authenticate"))
			assert.Equal(t, codeUnauthorized, r.errorBody(t).Error.Code)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(t, http.MethodGet, path, "", map[string]string{"Authorization": ""})
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
	}
	assert.Equal(t, 2, e.queued(t), "nothing is enqueued without a valid key")
}

// TestAuthSeveralHeaders checks, over a real socket, that a request with
// more than one Authorization header gets 401 on every /v1 route, whichever
// of them is valid, and enqueues nothing.
func TestAuthSeveralHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, manyRefusals)
	wrong := "Bearer " + strings.Repeat("x", 24)
	for _, headers := range [][]string{
		{"Bearer " + key1, wrong},
		{wrong, "Bearer " + key1},
		{"Bearer " + key1, "Bearer " + key1},
		{"Bearer " + key1, "Bearer " + key2},
	} {
		for _, rt := range Routes(tasks.Kinds()) {
			if rt.Public {
				continue
			}
			path := strings.NewReplacer("{order_no}", "SO1", "{task_id}", "evt-0").Replace(rt.Path)
			req, err := http.NewRequestWithContext(t.Context(), rt.Method, e.srv.URL+path, strings.NewReader(modifyBody))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(HeaderIdempotencyKey, "evt-auth")
			for _, h := range headers {
				req.Header.Add("Authorization", h)
			}
			resp, err := e.srv.Client().Do(req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			r := response{status: resp.StatusCode, header: resp.Header, body: b}
			require.Equal(t, http.StatusUnauthorized, r.status, "%s %s with %d headers: %s", rt.Method, path, len(headers), r.body)
			assert.Equal(t, []string{`Bearer realm="orderworker intake"`}, r.header.Values("WWW-Authenticate"))
			assert.Equal(t, codeUnauthorized, r.errorBody(t).Error.Code)
		}
	}
	assert.Equal(t, 0, e.queued(t), "nothing is enqueued")
}

// TestSecretsNotLogged checks that no log entry contains a key, valid or
// not, while the access log tells the keys apart by position.
func TestSecretsNotLogged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const wrong = "wrong-key-but-secret-0123456789"
	for i, auth := range []string{key1, key2, wrong} {
		e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{
			"Authorization": "Bearer " + auth, HeaderIdempotencyKey: fmt.Sprintf("evt-%d", i)})
		e.do(t, http.MethodGet, "/v1/orders/SO.1", "", map[string]string{"Authorization": "Bearer " + auth})
	}

	entries := e.logs.All()
	require.Len(t, entries, 6, "one line per request")
	var principals []string
	for _, en := range entries {
		line := fmt.Sprint(en.Message, en.LoggerName, en.ContextMap())
		for _, secret := range []string{key1, key2, wrong} {
			require.NotContains(t, line, secret)
		}
		if p, ok := en.ContextMap()["principal"].(string); ok {
			principals = append(principals, p)
		}
	}
	assert.Equal(t, []string{"key#1", "key#1", "key#2", "key#2"}, principals)
}

func TestInsecureNoAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.APIKeys, c.InsecureNoAuth = nil, true })
	r := e.post(t, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	r = e.do(t, http.MethodGet, "/v1/orders/SO1", "", map[string]string{"Authorization": ""})
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	rdb := closedRedis(t)
	p, err := producer.New(rdb, producer.Config{})
	require.NoError(t, err)
	store, err := redisstore.New(rdb, redisstore.Config{})
	require.NoError(t, err)
	const short = "short-secret"
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no keys", Config{}, "no APIKeys"},
		{"keys and insecure", Config{APIKeys: []string{key1}, InsecureNoAuth: true}, "InsecureNoAuth given together"},
		{"short key", Config{APIKeys: []string{key1, short}}, "key #2 is shorter"},
		{"key with space", Config{APIKeys: []string{"has a space in it, sadly"}}, "key #1 has a space"},
		{"body over payload limit", Config{APIKeys: []string{key1}, MaxBody: 1 << 20}, "MaxBody"},
		{"negative timeout", Config{APIKeys: []string{key1}, RequestTimeout: -1}, "RequestTimeout"},
		{"negative rate", Config{APIKeys: []string{key1}, Rate: -1}, "negative rate"},
		{"NaN rate", Config{APIKeys: []string{key1}, Rate: rate.Limit(math.NaN())}, "negative rate"},
		{"negative burst", Config{APIKeys: []string{key1}, Burst: -1}, "negative burst"},
		{"limit of no key", Config{APIKeys: []string{key1}, KeyLimits: map[int]Limit{2: {Rate: 1}}}, "no key #2"},
		{"limit of key 0", Config{APIKeys: []string{key1}, KeyLimits: map[int]Limit{0: {Rate: 1}}}, "no key #0"},
		{"negative key rate", Config{APIKeys: []string{key1}, KeyLimits: map[int]Limit{1: {Rate: -1}}}, "key #1: negative rate"},
		{"key limits without keys", Config{InsecureNoAuth: true, KeyLimits: map[int]Limit{1: {Rate: 1}}}, "KeyLimits given with InsecureNoAuth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(rdb, p, store, tt.cfg)
			require.ErrorContains(t, err, tt.want)
			require.NotContains(t, err.Error(), short)
		})
	}
	_, err = New(rdb, p, store, Config{APIKeys: []string{short}})
	require.ErrorIs(t, err, httpauth.ErrConfig)
	_, err = New(nil, p, store, Config{InsecureNoAuth: true})
	require.Error(t, err)
	_, err = New(rdb, nil, store, Config{InsecureNoAuth: true})
	require.Error(t, err)
	_, err = New(rdb, p, nil, Config{InsecureNoAuth: true})
	require.Error(t, err)
}
