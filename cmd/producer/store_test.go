package main

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/internal/testkit/upstreamtest"
	"github.com/orderworker/orderworker/worker/orders"
)

// withHTTPStore adds ORDER_STORE=http and the settings of an upstream
// (the fake one, over a Redis store of its own: the oracle) to env, and
// returns the oracle.
func withHTTPStore(t *testing.T, db *redistest.DB, env map[string]string) (*upstreamtest.Server, *redisstore.Store) {
	t.Helper()
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix + "upstream:"})
	require.NoError(t, err)
	up := upstreamtest.New(t, orderapitest.NewHandler(oracle))
	env["ORDER_STORE"] = "http"
	env["ORDER_API_URL"] = up.APIURL()
	env["TOKEN_URL"] = up.TokenURL()
	env["TOKEN_CLIENT_ID"] = upstreamtest.ClientID
	env["TOKEN_CLIENT_SECRET"] = upstreamtest.ClientSecret
	return up, oracle
}

// intakeUser returns db as a new user with the intake's rules for
// ORDER_STORE=http.
func intakeUser(t *testing.T, db *redistest.DB) *redistest.DB {
	t.Helper()
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix, OrderAPI: true})
	require.NoError(t, err)
	return db.AsUser(t, rules...)
}

// With ORDER_STORE=http the intake reads the orders and their histories
// from the order API, as the worker writes them, not from Redis. It runs
// as a user with its rules for the order API.
func TestServeReadsTheHTTPStore(t *testing.T) {
	db := redistest.New(t)
	env := baseEnv(db)
	env["REDIS_URL"] = intakeUser(t, db).URL()
	up, oracle := withHTTPStore(t, db, env)
	require.NoError(t, oracle.Put(t.Context(), orders.Order{No: "SO7", Address: "7 Upstream Rd", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	s := startServe(t, env)

	get := func(path string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+s.addr+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testKey1)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/v1/orders/SO7")
	require.Equal(t, http.StatusOK, code, body)
	var o orders.Order
	require.NoError(t, json.Unmarshal([]byte(body), &o))
	assert.Equal(t, "7 Upstream Rd", o.Address)
	code, body = get("/v1/orders/SO7/history")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"type":"order:put"`)
	code, body = get("/v1/orders/SO7/status")
	require.Equal(t, http.StatusOK, code, body)
	http.DefaultClient.CloseIdleConnections()

	assert.NotEmpty(t, up.Requests(), "the intake asked the order API")
	assert.NotContains(t, s.logs.String(), upstreamtest.ClientSecret)
	assert.NotContains(t, s.logs.String(), "NOPERM")
}

// With ORDER_STORE=http the CLI's order commands read and write the orders
// through the order API, as the intake's user: `order put` writes no
// Redis key then.
func TestCLIUsesTheHTTPStore(t *testing.T) {
	db := redistest.New(t)
	env := map[string]string{"REDIS_URL": intakeUser(t, db).URL(), "KEY_PREFIX": db.Prefix}
	_, oracle := withHTTPStore(t, db, env)
	cli := cliWith(t, env)

	_, err := cli("order", "put", "SO8", "-address", "8 Upstream Rd", "-item", "TEA=2")
	require.NoError(t, err)
	o, err := oracle.Get(t.Context(), "SO8")
	require.NoError(t, err, "the order was put through the order API")
	assert.Equal(t, "8 Upstream Rd", o.Address)

	out, err := cli("order", "get", "SO8")
	require.NoError(t, err)
	assert.Contains(t, out, "8 Upstream Rd")
	out, err = cli("order", "history", "SO8")
	require.NoError(t, err)
	assert.Contains(t, out, `"type": "order:put"`)
	assert.Zero(t, db.Client.Exists(t.Context(), db.Prefix+"order:{SO8}").Val(), "no order in the worker's Redis")
}
