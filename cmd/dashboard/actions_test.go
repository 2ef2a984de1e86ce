package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// withReason sends {"reason": reason} as the request's JSON body.
func withReason(reason string) func(*http.Request) {
	return func(r *http.Request) {
		body := `{"reason":"` + reason + `"}`
		r.Body = io.NopCloser(strings.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Type", "application/json")
	}
}

// TestOrderActionsWritable holds, resumes and skips an order from its page
// on a writable dashboard, over a real socket: the buttons are there, each
// action acts as the dashboard user, a cross-site request is refused, and
// the sequence log and the order's history (noted by the dashboard-write
// Redis user) show who did it and why.
func TestOrderActionsWritable(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	// As the writing dashboard's Redis user (acl.DashboardWrite).
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.DashboardWrite), "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	for _, a := range []string{"retry", "skip", "hold", "resume"} {
		assert.Contains(t, r.body, `data-method="POST" data-url="/orders/SO1001/actions/`+a+`"`)
	}
	assert.Contains(t, r.body, `id="action-reason"`)

	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", noAuth, withReason("x"))
	assert.Equal(t, http.StatusUnauthorized, r.status)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("x"), func(r *http.Request) {
		r.Header.Set("Origin", "https://evil.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	})
	assert.Equal(t, http.StatusForbidden, r.status, "a cross-site action is refused")

	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic)
	assert.Equal(t, http.StatusBadRequest, r.status, "hold needs a reason: %s", r.body)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("customer called"))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `"by":"`+testUser+`"`)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("again"))
	assert.Equal(t, http.StatusConflict, r.status, r.body)
	assert.Contains(t, r.body, `"error":`)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/resume", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/skip", basic, withReason("sent twice"))
	require.Equal(t, http.StatusOK, r.status, r.body)
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "crm-7f3a9c")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateArchived, info.State)
	assert.Equal(t, "skipped by "+testUser+": sent twice", info.LastErr, "archived with the skip's reason, by the dashboard-write user")
	r = d.do(t, http.MethodGet, "/orders/SO1001/actions/skip", basic)
	assert.Equal(t, http.StatusMethodNotAllowed, r.status)

	r = d.get(t, "/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	for _, want := range []string{"hold by " + testUser + ": customer called", "resume by " + testUser, "skipped by " + testUser + ": sent twice"} {
		assert.Contains(t, r.body, want)
	}
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	h, err := orders.AllHistory(t.Context(), store, "SO1001")
	require.NoError(t, err)
	var notes []string
	for _, e := range h {
		if e.Type == orders.TypeNote && e.Worker == testUser {
			notes = append(notes, e.Detail)
		}
	}
	require.Len(t, notes, 3, "each action is noted in the order's history: %+v", h)
	assert.Equal(t, "hold by "+testUser+": customer called", notes[0])
	assert.Equal(t, "resume by "+testUser, notes[1])
	assert.True(t, strings.HasPrefix(notes[2], "skipped position "), notes[2])
	assert.True(t, strings.HasSuffix(notes[2], " by "+testUser+": sent twice"), notes[2])
	assert.Contains(t, r.body, "order:note", "the order page lists the notes")
}

// TestOrderActionsReadOnly refuses every action, 403 with a JSON error,
// on a read-only dashboard, and shows no action button.
func TestOrderActionsReadOnly(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.Dashboard), "KEY_PREFIX", db.Prefix))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/orders/SO1001", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.NotContains(t, r.body, "/actions/")
	for _, a := range []string{"retry", "skip", "hold", "resume"} {
		r = d.do(t, http.MethodPost, "/orders/SO1001/actions/"+a, basic, withReason("x"))
		assert.Equal(t, http.StatusForbidden, r.status, a)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
		assert.Contains(t, r.body, `"error":"the dashboard is read-only`)
	}
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "crm-7f3a9c")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State, "nothing was done")
}

// TestOrderActionsEscape escapes, in the action endpoint's answers, the
// text they quote from Redis or the request (a hold's reason), as the
// pages escape it: the blocked-orders page shows these answers.
func TestOrderActionsEscape(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	// A reason with a format character is refused, its echo escaped.
	r := d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("check the \u202eaddress"))
	require.Equal(t, http.StatusBadRequest, r.status, r.body)
	assert.NotContains(t, r.body, "\u202e")
	// One written by hand into the order's sequence is quoted escaped.
	seedHeld(t, db, "SO1001", testUser, "check the \u202eaddress", time.Now())
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/retry", basic)
	assert.Equal(t, http.StatusConflict, r.status, r.body)
	assert.Contains(t, r.body, `on hold (by `+testUser+`: check the \\u202eaddress)`)
	assert.NotContains(t, r.body, "\u202e")
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/resume", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `(hold by `+testUser+`: check the \\u202eaddress) ended`)
	assert.NotContains(t, r.body, "\u202e")
}

// TestOrderActionsStrictAndRateLimited refuses an action body with an
// unknown or repeated field (400, JSON), and a user's actions past
// DASHBOARD_ACTION_BURST (429 with Retry-After, JSON): nothing is done.
func TestOrderActionsStrictAndRateLimited(t *testing.T) {
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(asDashboard(t, db, acl.DashboardWrite), "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false",
		"DASHBOARD_ACTION_RATE", "0.001", "DASHBOARD_ACTION_BURST", "2"))
	basic := basicAuth(testUser, testPassword)
	body := func(b string) func(*http.Request) {
		return func(r *http.Request) {
			r.Body = io.NopCloser(strings.NewReader(b))
			r.ContentLength = int64(len(b))
			r.Header.Set("Content-Type", "application/json")
		}
	}
	for _, b := range []string{`{"reason":"a","reason":"b"}`, `{"reason":"a","by":"admin#1"}`, `{"reason":"a"} {}`} {
		r := d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, body(b))
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", b, r.body)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	}
	r := d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("customer called"))
	require.Equal(t, http.StatusOK, r.status, r.body)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/resume", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	r = d.do(t, http.MethodPost, "/orders/SO1001/actions/hold", basic, withReason("again"))
	require.Equal(t, http.StatusTooManyRequests, r.status, r.body)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Contains(t, r.body, `"error":"too many operator actions`)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	held, err := db.Client.HExists(t.Context(), db.Prefix+"lock:{SO1001}:seq", "h").Result()
	require.NoError(t, err)
	assert.False(t, held, "the refused hold did nothing")
}
