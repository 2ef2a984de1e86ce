package main

import (
	"encoding/json"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// seedScheduled accepts, for each order of nos, a modify (event ID
// no+"-later") that asynq keeps in its scheduled set for an hour: with
// BLOCKED_AFTER=1ms each order is blocked, as scheduled. It deletes the
// queues when the test ends.
func seedScheduled(t *testing.T, db *redistest.DB, nos ...string) {
	t.Helper()
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(db.Client)
		for _, k := range tasks.Kinds() {
			_ = insp.DeleteQueue(k.Queue, true)
		}
	})
	for _, no := range nos {
		_, err := p.EnqueueModify(t.Context(), no, tasks.Changes{Remark: new("ring twice")},
			producer.WithEventID(no+"-later"), producer.WithProcessIn(time.Hour))
		require.NoError(t, err)
	}
}

// seedHeld holds order no by by for reason with keyorder.Sequencer.Pause, as
// the operator action does, then moves the hold's time back to at (the
// pause's record, field h of the sequence: {"by","reason","at": ms}, and
// its index entry), so that the list shows an hour-old hold.
func seedHeld(t *testing.T, db *redistest.DB, no, by, reason string, at time.Time) {
	t.Helper()
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	// The pause's own checks refuse a reason with control or format
	// characters; a Redis user that may write the sequences can still
	// write one by hand (below), which the pages must escape.
	_, err = seq.Pause(t.Context(), no, by, "held")
	require.NoError(t, err)
	rec, err := json.Marshal(map[string]string{"by": by, "reason": reason, "at": strconv.FormatInt(at.UnixMilli(), 10)})
	require.NoError(t, err)
	require.NoError(t, db.Client.HSet(t.Context(), seq.SeqKey(no), "h", rec).Err())
	require.NoError(t, db.Client.ZAdd(t.Context(), seq.PausedKey(), redis.Z{Score: float64(at.UnixMilli()), Member: no}).Err())
}

// getBlocked fetches path, a query of the blocked-orders data, and decodes
// its answer.
func getBlocked(t *testing.T, d *dashboard, path string) blockedView {
	t.Helper()
	r := d.get(t, path, basicAuth(testUser, testPassword))
	require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
	var v blockedView
	require.NoError(t, json.Unmarshal([]byte(r.body), &v), r.body)
	return v
}

func orderNos(v blockedView) []string {
	nos := []string{}
	for _, b := range v.Orders {
		nos = append(nos, b.OrderNo)
	}
	return nos
}

// TestBlockedPage checks the blocked-orders page and its data over HTTP:
// behind the same authentication as the rest, the order page's content
// security policy, reached from the order page; the data lists the
// blocked orders oldest first with their reason, age, explanation and
// links, counts them by reason, filters by reason, pages, escapes the
// text, and refuses bad parameters with a JSON error.
func TestBlockedPage(t *testing.T) {
	db := redistest.New(t)
	seedScheduled(t, db, "SO1", "SO2", "SO3", "SOH")
	heldAt := time.Now().Add(-time.Hour).Truncate(time.Millisecond).UTC()
	seedHeld(t, db, "SOH", "ops@example.com", "check the \u202eaddress", heldAt)
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))
	basic := basicAuth(testUser, testPassword)

	for _, path := range []string{"/blocked-orders", "/blocked-orders.json", "/blocked-orders.js", "/blocked-orders.css"} {
		r := d.get(t, path, noAuth)
		assert.Equal(t, http.StatusUnauthorized, r.status, path)
		assert.NotContains(t, r.body, "SOH", path)
	}

	r := d.get(t, "/orders", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<a href="/blocked-orders">Blocked orders</a>`, "the order page links to it")

	r = d.get(t, "/blocked-orders", bearerAuth(testToken))
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	assert.Equal(t, orderCSP, r.header.Get("Content-Security-Policy"))
	assert.Equal(t, "DENY", r.header.Get("X-Frame-Options"))
	assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
	assert.Contains(t, r.body, `<script src="/blocked-orders.js" defer></script>`)
	assert.Contains(t, r.body, `data-api="/blocked-orders.json"`)
	assert.Contains(t, r.body, `data-read-only="true"`)
	assert.NotContains(t, r.body, "<th>actions</th>", "no actions column when read-only")
	assert.NotContains(t, r.body, `id="action-reason"`, "no reason field when read-only")
	assert.NotContains(t, r.body, "<script>", "no inline script")

	r = d.get(t, "/blocked-orders.js", basic)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "text/javascript; charset=utf-8", r.header.Get("Content-Type"))
	assert.Contains(t, r.body, "textContent")
	assert.NotContains(t, r.body, "innerHTML")
	r = d.get(t, "/blocked-orders.css", basic)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "text/css; charset=utf-8", r.header.Get("Content-Type"))

	// The whole list, oldest first: the held order, then the scheduled ones.
	r = d.get(t, "/blocked-orders.json", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.NotContains(t, r.body, "\u202e", "no bidi override is sent raw")
	v := getBlocked(t, d, "/blocked-orders.json")
	assert.Equal(t, []string{"SOH", "SO1", "SO2", "SO3"}, orderNos(v))
	assert.Equal(t, 4, v.Total)
	assert.Equal(t, 3, v.Counts[orderview.ReasonScheduled])
	assert.Equal(t, 1, v.Counts[orderview.ReasonHeld])
	assert.Zero(t, v.Counts[orderview.ReasonFailing])
	assert.Equal(t, orderview.Reasons(), v.Reasons)
	assert.Empty(t, v.NextCursor)
	assert.False(t, v.Truncated)

	h := v.Orders[0]
	assert.Equal(t, orderview.ReasonHeld, h.Reason)
	assert.Equal(t, "/orders/SOH", h.OrderURL)
	require.NotNil(t, h.Head)
	assert.Equal(t, "order:modify SOH-later", h.Head.Label)
	assert.Contains(t, h.TaskURL, "/queues/order_modify/tasks/SOH-later", "a held order's head task links to asynqmon")
	assert.Equal(t, heldAt, h.Since)
	assert.InDelta(t, time.Hour.Milliseconds(), h.AgeMS, float64(time.Minute.Milliseconds()))
	require.NotNil(t, h.Hold)
	assert.Equal(t, `check the \u202eaddress`, h.Hold.Reason, "escaped as the order page escapes it")
	assert.Contains(t, h.Explanation, `Held by ops@example.com since `+heldAt.Format(time.RFC3339)+` (check the \u202eaddress)`)
	assert.Empty(t, h.Actions, "no actions when read-only")

	s := v.Orders[1]
	assert.Equal(t, orderview.ReasonScheduled, s.Reason)
	assert.Equal(t, "/orders/SO1", s.OrderURL)
	require.NotNil(t, s.Head)
	assert.Equal(t, "SO1-later", s.Head.TaskID)
	assert.Equal(t, "/queues/order_modify/tasks/SO1-later", s.TaskURL)
	assert.Equal(t, "/queues/order_modify?status=scheduled", s.StateURL)
	require.NotNil(t, s.Scheduled)
	assert.WithinDuration(t, time.Now().Add(time.Hour), s.Scheduled.RunAt, time.Minute)
	assert.Contains(t, s.Explanation, "Its next change, task SO1-later, is scheduled to run at ")
	assert.EqualValues(t, 1, s.Waiting)

	// A reason filters the list, not the counts.
	v = getBlocked(t, d, "/blocked-orders.json?reason=held")
	assert.Equal(t, []string{"SOH"}, orderNos(v))
	assert.Equal(t, 1, v.Total)
	assert.Equal(t, "held", v.Reason)
	assert.Equal(t, 3, v.Counts[orderview.ReasonScheduled])
	v = getBlocked(t, d, "/blocked-orders.json?reason=failing")
	assert.Empty(t, v.Orders)
	assert.NotNil(t, v.Orders, "an empty list is [], not null")

	// Pages follow each other by their cursor.
	v = getBlocked(t, d, "/blocked-orders.json?limit=3")
	assert.Equal(t, []string{"SOH", "SO1", "SO2"}, orderNos(v))
	require.NotEmpty(t, v.NextCursor)
	v = getBlocked(t, d, "/blocked-orders.json?limit=3&cursor="+v.NextCursor)
	assert.Equal(t, []string{"SO3"}, orderNos(v))
	assert.Empty(t, v.NextCursor)

	for _, q := range []string{"limit=0", "limit=1001", "limit=x", "reason=stuck", "cursor=nope"} {
		r := d.get(t, "/blocked-orders.json?"+q, basic)
		assert.Equal(t, http.StatusBadRequest, r.status, q)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"), q)
		assert.Contains(t, r.body, `{"error":{"code":"bad_parameter","message":`, q)
	}
	r = d.do(t, http.MethodPost, "/blocked-orders.json", basic)
	assert.Equal(t, http.StatusMethodNotAllowed, r.status)
	assert.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	requireNoSecrets(t, d.logs.String())
}

// TestBlockedPageUnderRoot serves the page, its data and its links under
// the root path, and nothing outside it; an order that waits for its
// creation links the order whose exchange creates it.
func TestBlockedPageUnderRoot(t *testing.T) {
	db := redistest.New(t)
	// SOX waits for its creation by exchange X2 of SOY, which waits for
	// its creation by exchange X1 of SOX; X1m, scheduled, puts SOX among
	// the list's candidates.
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	_, err = seq.Reserve(t.Context(), "SOX", tasks.CreationLabel("X2", "SOY"), keyorder.CreationRef("X2"))
	require.NoError(t, err)
	_, err = seq.Reserve(t.Context(), "SOY", tasks.CreationLabel("X1", "SOX"), keyorder.CreationRef("X1"))
	require.NoError(t, err)
	seedScheduled(t, db, "SO1")
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	_, err = p.EnqueueModify(t.Context(), "SOX", tasks.Changes{Remark: new("x")}, producer.WithEventID("X1m"), producer.WithProcessIn(time.Hour))
	require.NoError(t, err)
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms", "DASHBOARD_ROOT", "/ops", "DASHBOARD_READ_ONLY", "false"))
	basic := basicAuth(testUser, testPassword)

	r := d.get(t, "/ops/blocked-orders", basic)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Contains(t, r.body, `<script src="/ops/blocked-orders.js" defer></script>`)
	assert.Contains(t, r.body, `data-api="/ops/blocked-orders.json"`)
	assert.Contains(t, r.body, `<th>actions</th>`, "the place of the operator actions, with writes on")
	assert.Contains(t, r.body, `id="action-reason"`, "the reason of the rows' actions")
	assert.Contains(t, d.get(t, "/ops/orders", basic).body, `<a href="/ops/blocked-orders">Blocked orders</a>`)
	v := getBlocked(t, d, "/ops/blocked-orders.json")
	// Both were reserved within a few milliseconds: oldest first may tie.
	require.ElementsMatch(t, []string{"SOX", "SO1"}, orderNos(v))
	x := v.Orders[slices.Index(orderNos(v), "SOX")]
	assert.Equal(t, orderview.ReasonCreation, x.Reason)
	assert.Equal(t, "/ops/orders/SOX", x.OrderURL)
	assert.Equal(t, "/ops/orders/SOY", x.FromURL)
	assert.Empty(t, x.TaskURL, "the exchange X2 is not in asynq")
	require.NotNil(t, x.Creation)
	assert.True(t, x.Creation.Cycle)
	assert.Equal(t, []rowAction{
		{Action: "skip", Label: "Skip", URL: "/ops/orders/SOX/actions/skip", NeedsReason: true,
			Confirm: "Skip the change whose turn it is in SOX? It is archived and will not be applied; the changes behind it go on."},
		{Action: "hold", Label: "Hold", URL: "/ops/orders/SOX/actions/hold", NeedsReason: true},
	}, x.Actions, "the order page's actions, under the root")
	so1 := v.Orders[slices.Index(orderNos(v), "SO1")]
	var urls []string
	for _, a := range so1.Actions {
		urls = append(urls, a.URL)
	}
	assert.Equal(t, []string{"/ops/orders/SO1/actions/retry", "/ops/orders/SO1/actions/skip", "/ops/orders/SO1/actions/hold"}, urls)
	assert.Equal(t, "/ops/orders/SO1", so1.OrderURL)
	assert.Equal(t, "/ops/queues/order_modify/tasks/SO1-later", so1.TaskURL)
	assert.Equal(t, http.StatusNotFound, d.get(t, "/blocked-orders.json", basic).status, "only under the root")
}

// TestBlockedPageRedisDown answers the data with 503 and a JSON error when
// Redis is unreachable, and logs why; the page itself is served.
func TestBlockedPageRedisDown(t *testing.T) {
	t.Parallel()
	d := startDashboard(t, redisDownEnv(t))
	basic := basicAuth(testUser, testPassword)
	r := d.get(t, "/blocked-orders.json", basic)
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Contains(t, r.body, `{"error":{"code":"unavailable","message":"Could not read the blocked orders`)
	assert.Equal(t, http.StatusOK, d.get(t, "/blocked-orders", basic).status)
	assert.Contains(t, d.logs.String(), "blocked page: list read failed")
	assert.Contains(t, d.logs.String(), `"error_code":"unavailable"`)
}

// redisDownEnv is a dashboard's environment with a Redis nothing listens
// at.
func redisDownEnv(t *testing.T) map[string]string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return map[string]string{
		"REDIS_URL":          "redis://" + addr + "/0?dial_timeout=200ms&max_retries=-1",
		"DASHBOARD_USER":     testUser,
		"DASHBOARD_PASSWORD": testPassword,
	}
}

// TestBlockedViewEscapesEveryString fills every string of a blocked order,
// every detail set, with a bidi override and a control character: none
// reaches the page's JSON raw, and no link is built from what is not an
// order number or a task of the contract.
func TestBlockedViewEscapesEveryString(t *testing.T) {
	t.Parallel()
	const raw = "a\u202eb\x1bc"
	var b orderview.BlockedOrder
	fill(reflect.ValueOf(&b).Elem(), raw)
	require.NotNil(t, b.Creation)
	require.Equal(t, raw, b.Creation.Chain[0])

	pages, err := newOrderPages(nil, nil, nil, nil, tasks.Kinds(), "", true, zap.NewNop())
	require.NoError(t, err)
	p, err := newBlockedPages(nil, pages, "", true, zap.NewNop())
	require.NoError(t, err)
	v := p.view(orderview.BlockedPage{Orders: []orderview.BlockedOrder{b}}, "")
	out, err := json.Marshal(v)
	require.NoError(t, err)
	assert.NotContains(t, string(out), "\u202e")
	assert.NotContains(t, string(out), "\x1b")
	assert.NotContains(t, string(out), `\u001b`, "the control character is not sent as a JSON escape either")
	assert.Contains(t, string(out), `"explanation":"a\\u202eb\\x1bc"`)
	assert.Contains(t, string(out), `"chain":["a\\u202eb\\x1bc"]`)
	row := v.Orders[0]
	assert.Empty(t, row.OrderURL)
	assert.Empty(t, row.TaskURL)
	assert.Empty(t, row.StaleTaskURL)
	assert.Empty(t, row.FromURL)
}

// fill sets every string reachable from v to s, allocating every pointer
// and giving every slice one element.
func fill(v reflect.Value, s string) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), s)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				fill(v.Field(i), s)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), s)
	case reflect.String:
		v.SetString(s)
	default:
	}
}

// TestBlockedActions goes over every reason: a held order is offered
// resume and nothing else, every other readable one hold, and retry now
// only where the head's task waits in asynq's retry or scheduled set. A
// replacement waiting for its creation is offered skip only when the
// exchange that creates it will never run (orderops refuses it otherwise).
func TestBlockedActions(t *testing.T) {
	t.Parallel()
	want := map[string][]orderops.Action{
		orderview.ReasonFailing:    {orderops.Retry, orderops.Skip, orderops.Hold},
		orderview.ReasonScheduled:  {orderops.Retry, orderops.Skip, orderops.Hold},
		orderview.ReasonGap:        {orderops.Skip, orderops.Hold},
		orderview.ReasonLockStale:  {orderops.Skip, orderops.Hold},
		orderview.ReasonCreation:   {orderops.Skip, orderops.Hold},
		orderview.ReasonWaiting:    {orderops.Skip, orderops.Hold},
		orderview.ReasonHeld:       {orderops.Resume},
		orderview.ReasonHalted:     {orderops.Retry, orderops.Skip},
		orderview.ReasonUnreadable: nil,
	}
	for _, reason := range orderview.Reasons() {
		got, ok := want[reason]
		assert.True(t, ok, "reason %q has no row in this test", reason)
		assert.Equal(t, got, blockedActions(reason, nil), reason)
	}
	for state, want := range map[string][]orderops.Action{
		"retry":               {orderops.Hold},
		"pending":             {orderops.Hold},
		"scheduled":           {orderops.Hold},
		"active":              {orderops.Hold},
		"archived":            {orderops.Skip, orderops.Hold},
		"completed":           {orderops.Skip, orderops.Hold},
		orderview.TaskMissing: {orderops.Skip, orderops.Hold},
	} {
		assert.Equal(t, want, blockedActions(orderview.ReasonCreation, &orderview.Creation{ExchangeState: state}), state)
	}
}
