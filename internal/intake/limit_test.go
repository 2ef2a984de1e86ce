package intake

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
