package intake

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orderworker/orderworker/internal/testkit/fakeclock"
	"github.com/orderworker/orderworker/tasks"
)

// postAs enqueues body at path with the given key and Idempotency-Key.
func (e *env) postAs(t *testing.T, apiKey, path, eventID, body string) response {
	t.Helper()
	return e.do(t, http.MethodPost, path, body, map[string]string{
		"Authorization": "Bearer " + apiKey, HeaderIdempotencyKey: eventID})
}

// requireLimited checks that r is the 429 of an empty bucket with the given
// Retry-After.
func requireLimited(t *testing.T, r response, retryAfter string) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	assert.Equal(t, retryAfter, r.header.Get("Retry-After"))
	body := r.errorBody(t)
	assert.Equal(t, codeRateLimited, body.Error.Code)
	assert.Contains(t, body.Error.Message, "retry in "+retryAfter+" s")
}

// requireNoTask checks that no queue holds a task with the event's ID.
func requireNoTask(t *testing.T, e *env, eventID string) {
	t.Helper()
	for _, q := range []string{tasks.QueueModify, tasks.QueueExchange} {
		_, err := e.insp.GetTaskInfo(q, eventID)
		require.True(t, errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound),
			"%s in %s: %v", eventID, q, err)
	}
}

// TestRateLimit checks that a key past its burst gets 429 with Retry-After
// and the JSON error on every enqueue route, that nothing is enqueued or
// claimed for it, that the other key and the reads are unaffected, and that
// the same request passes once Retry-After has gone by.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) { c.Rate, c.Burst, c.now = 0.4, 2, clk.Now })

	r := e.postAs(t, key1, "/v1/orders/SO1/modify", "evt-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	r = e.postAs(t, key1, "/v1/orders/SO1/exchange", "evt-2", exchangeBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)

	// The bucket is empty: a token is back in 1/0.4 = 2.5 s, rounded up.
	requireLimited(t, e.postAs(t, key1, "/v1/orders/SO2/modify", "evt-3", modifyBody), "3")
	requireLimited(t, e.postAs(t, key1, "/v1/orders/SO2/exchange", "evt-4", exchangeBody), "3")
	// A refusal takes no token: the wait stays the same.
	requireLimited(t, e.postAs(t, key1, "/v1/orders/SO2/modify", "evt-3", modifyBody), "3")
	requireNoTask(t, e, "evt-3")
	requireNoTask(t, e, "evt-4")
	assert.Equal(t, 2, e.queued(t), "nothing is enqueued for a 429")

	// The other key has a bucket of its own.
	r = e.postAs(t, key2, "/v1/orders/SO3/modify", "evt-5", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	// Reads take no token.
	for range 5 {
		r = e.do(t, http.MethodGet, "/v1/tasks/evt-1", "", nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}

	// Once Retry-After has gone by, the retry with the same key is
	// accepted: the 429 claimed nothing.
	clk.Add(3 * time.Second)
	r = e.postAs(t, key1, "/v1/orders/SO2/modify", "evt-3", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	requireLimited(t, e.postAs(t, key1, "/v1/orders/SO2/exchange", "evt-4", exchangeBody), "2")

	// The access log names the key by position, with the code.
	var limited []string
	for _, en := range e.logs.All() {
		m := en.ContextMap()
		if m["error_code"] == codeRateLimited {
			limited = append(limited, fmt.Sprint(m["principal"]))
		}
	}
	assert.Equal(t, []string{"key#1", "key#1", "key#1", "key#1"}, limited)
}

// TestRateLimitPerKey checks KeyLimits: one key unlimited, one with its own
// burst and the Config's rate.
func TestRateLimitPerKey(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) {
		c.Rate, c.Burst, c.now = 1, 1, clk.Now
		c.KeyLimits = map[int]Limit{1: {Rate: Unlimited}, 2: {Burst: 3}}
	})

	for i := range 5 {
		r := e.postAs(t, key1, "/v1/orders/SO1/modify", fmt.Sprintf("evt-a%d", i), modifyBody)
		require.Equal(t, http.StatusAccepted, r.status, "key#1, request %d: %s", i, r.body)
	}
	for i := range 3 {
		r := e.postAs(t, key2, "/v1/orders/SO2/modify", fmt.Sprintf("evt-b%d", i), modifyBody)
		require.Equal(t, http.StatusAccepted, r.status, "key#2, request %d: %s", i, r.body)
	}
	requireLimited(t, e.postAs(t, key2, "/v1/orders/SO2/modify", "evt-b3", modifyBody), "1")
	requireNoTask(t, e, "evt-b3")
	assert.Equal(t, 8, e.queued(t))
}

// TestRateLimitNoAuth checks that without keys every caller shares one
// bucket.
func TestRateLimitNoAuth(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) { c.APIKeys, c.InsecureNoAuth, c.Rate, c.Burst, c.now = nil, true, 1, 1, clk.Now })
	r := e.do(t, http.MethodPost, "/v1/orders/SO1/modify", modifyBody, map[string]string{"Authorization": "", HeaderIdempotencyKey: "evt-1"})
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	requireLimited(t, e.do(t, http.MethodPost, "/v1/orders/SO1/exchange", exchangeBody,
		map[string]string{"Authorization": "", HeaderIdempotencyKey: "evt-2"}), "1")
	assert.Equal(t, 1, e.queued(t))
}

// TestRateLimitDefaults checks the documented defaults, on which every
// other test of the package runs without meeting the limit.
func TestRateLimitDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.withDefaults()
	assert.Equal(t, DefaultRate, c.Rate)
	assert.Equal(t, 2000.0, float64(c.Rate))
	assert.Equal(t, 10000, c.Burst)
	assert.NotNil(t, c.now)
}

// Requests refused without a valid key are limited per client: past the
// burst the next request without a valid key is answered 429
// too_many_refusals with Retry-After on every /v1 route and logged at
// debug, while a valid key is still served, the probes are not limited,
// and a refusal is allowed again once the bucket refills.
func TestRefusalsLimited(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	const adminKey = "admin-key-0123456789abcdef"
	e := newEnv(t, func(c *Config) {
		c.now, c.AdminKeys = clk.Now, []string{adminKey}
		c.refusal = Limit{Rate: 0.5, Burst: 4} // the global default stays
	})
	wrong := map[string]string{"Authorization": "Bearer wrong-key-0123456789abcdef"}
	// Four refusals: a wrong key on a read and on an action, no such
	// route, no such method.
	require.Equal(t, http.StatusUnauthorized, e.do(t, http.MethodGet, "/v1/orders/SO1", "", wrong).status)
	require.Equal(t, http.StatusUnauthorized, e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", `{"reason":"r"}`, wrong).status)
	require.Equal(t, http.StatusNotFound, e.do(t, http.MethodGet, "/v1/nothing", "", map[string]string{"Authorization": ""}).status)
	require.Equal(t, http.StatusMethodNotAllowed, e.do(t, http.MethodDelete, "/v1/orders/SO1", "", map[string]string{"Authorization": ""}).status)
	// A valid key's answers are no refusals: a 404 of an order, an
	// enqueue key's 403 on an action (an insider, not an outsider).
	require.Equal(t, http.StatusNotFound, e.do(t, http.MethodGet, "/v1/orders/SO1", "", nil).status)
	require.Equal(t, http.StatusForbidden, e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", `{"reason":"r"}`, nil).status)

	for _, rt := range Routes(tasks.Kinds()) {
		path := strings.NewReplacer("{order_no}", "SO1", "{task_id}", "evt-0", "{action}", "hold").Replace(rt.Path)
		r := e.do(t, rt.Method, path, modifyBody, map[string]string{"Authorization": wrong["Authorization"], HeaderRequestID: "req-" + path})
		if rt.Public {
			require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, r.status, "%s %s: %s", rt.Method, path, r.body)
		assert.Equal(t, codeTooManyRefusals, r.errorBody(t).Error.Code)
		assert.Equal(t, "2", r.header.Get("Retry-After"), "a token back in 2 s")
		entries := e.logs.FilterMessage("request").FilterField(zap.String("request_id", "req-"+path)).All()
		require.Len(t, entries, 1)
		assert.Equal(t, zapcore.DebugLevel, entries[0].Level, "a limited refusal is logged at debug")
	}
	require.Equal(t, http.StatusTooManyRequests, e.do(t, http.MethodGet, "/v1/other", "", map[string]string{"Authorization": ""}).status)
	// A valid key from the same address is served, enqueue and action alike.
	r := e.post(t, "/v1/orders/SO1/modify", "evt-ok", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/v1/orders/SO1/actions/hold", `{"reason":"r"}`, map[string]string{"Authorization": "Bearer " + adminKey})
	assert.NotEqual(t, http.StatusTooManyRequests, r.status, "%s", r.body)

	clk.Add(2 * time.Second) // one token back
	require.Equal(t, http.StatusUnauthorized, e.do(t, http.MethodGet, "/v1/orders/SO1", "", wrong).status)
	require.Equal(t, http.StatusTooManyRequests, e.do(t, http.MethodGet, "/v1/orders/SO1", "", wrong).status)
}

// The global bucket limits refusals of every client together.
func TestRefusalsLimitedGlobally(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	r := newRefusals(Config{now: clk.Now, refusalGlobal: Limit{Rate: 1, Burst: 3}})
	for i := range 3 {
		c := client(fmt.Sprintf("10.0.0.%d:1234", i))
		require.Zero(t, r.full(c))
		r.take(c)
	}
	assert.EqualValues(t, 1, r.full(client("10.0.0.9:1")), "a new client meets the empty global bucket")
	clk.Add(time.Second)
	assert.Zero(t, r.full(client("10.0.0.9:1")))
}

// A client is its IPv4 address or its IPv6 /64; the clients remembered are
// bounded, two generations of refusalClients.
func TestRefusalClients(t *testing.T) {
	t.Parallel()
	assert.Equal(t, client("192.0.2.1:80"), client("[::ffff:192.0.2.1]:443"))
	assert.NotEqual(t, client("192.0.2.1:80"), client("192.0.2.2:80"))
	assert.Equal(t, client("[2001:db8:1:2:aaaa::1]:80"), client("[2001:db8:1:2:bbbb::2]:81"), "one /64")
	assert.NotEqual(t, client("[2001:db8:1:2::1]:80"), client("[2001:db8:1:3::1]:80"))
	assert.False(t, client("not an address").IsValid())

	r := newRefusals(Config{now: time.Now, refusalGlobal: Limit{Rate: Unlimited}})
	for i := range 3 * refusalClients {
		r.take(client(fmt.Sprintf("[2001:db8:%x::1]:1", i)))
	}
	assert.LessOrEqual(t, len(r.cur)+len(r.prev), 2*refusalClients)
}
