package httpstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/token"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

var _ TokenSource = (*token.Cache)(nil)

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		url      string
		cfg      Config
		wantBase string
	}{
		{"plain, allowed", "http://orders.example", Config{AllowInsecureHTTP: true}, "http://orders.example"},
		{"plain to loopback", "http://127.0.0.1:8080/v1", Config{}, "http://127.0.0.1:8080/v1"},
		{"plain to localhost", "http://localhost/v1", Config{}, "http://localhost/v1"},
		{"plain to ::1", "http://[::1]:1", Config{}, "http://[::1]:1"},
		{"https with path and slash", "https://orders.example/v1/", Config{Timeout: time.Second, Client: &http.Client{}}, "https://orders.example/v1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(tt.url, &staticTokens{tok: "t"}, tt.cfg)
			require.NoError(t, err)
			assert.Equal(t, tt.wantBase+"/orders/SO1/modify", s.orderPath("SO1", "/modify"))
		})
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	tokens := &staticTokens{tok: "t"}
	tests := []struct {
		name    string
		url     string
		tokens  TokenSource
		cfg     Config
		wantErr string
	}{
		{"empty", "", tokens, Config{}, "absolute http or https"},
		{"relative", "/v1", tokens, Config{}, "absolute http or https"},
		{"other scheme", "ftp://orders.example", tokens, Config{}, "absolute http or https"},
		{"credentials", "https://user:hunter2@orders.example", tokens, Config{}, "credentials"},
		{"query", "https://orders.example/?a=1", tokens, Config{}, "query"},
		{"fragment", "https://orders.example/#x", tokens, Config{}, "fragment"},
		{"unparseable", "http://[::1", tokens, Config{}, "does not parse"},
		{"no tokens", "https://orders.example", nil, Config{}, "nil token source"},
		{"negative timeout", "https://orders.example", tokens, Config{Timeout: -time.Second}, "negative"},
		{"plain to a host", "http://orders.example/v1", tokens, Config{}, "not loopback"},
		{"plain to an address", "http://10.0.0.1/v1", tokens, Config{}, "not loopback"},
		{"plain to a look-alike", "http://localhost.evil.example/v1", tokens, Config{}, "not loopback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tt.url, tt.tokens, tt.cfg)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.NotContains(t, err.Error(), "hunter2", "no password in errors")
		})
	}
}

// An http:// base URL to a host that is not loopback is ErrInsecureURL,
// before anything is sent: the token would cross the network in clear.
func TestNewRefusesPlainHTTP(t *testing.T) {
	t.Parallel()
	_, err := New("http://orders.example/v1", &staticTokens{tok: "t"}, Config{})
	require.ErrorIs(t, err, ErrInsecureURL)
}

// TestHTTPRoundTrip writes through the HTTP store and checks each answer
// against the oracle behind the upstream, and what the upstream saw.
func TestHTTPRoundTrip(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	s := u.store(t, Config{})
	ctx := t.Context()

	require.NoError(t, s.Put(orders.WithWrite(ctx, orders.Write{Worker: "admin"}), orders.Order{
		No: "SO1", Address: "1 Old Street", Remark: "ring twice", Items: []orders.Item{{SKU: "shirt-m", Qty: 1}},
	}))
	got, err := s.Get(ctx, "SO1")
	require.NoError(t, err)
	want, err := u.oracle.Get(ctx, "SO1")
	require.NoError(t, err)
	assert.Equal(t, want, got)

	started := time.Now().Add(-time.Second)
	w := orders.Write{Fence: baseFence, Worker: "worker-1", StartedAt: started}
	res, err := s.Modify(orders.WithWrite(ctx, w), "evt-m", "SO1", orders.Changes{Address: new("2 New Road"), Items: []orders.Item{{SKU: "shirt-l", Qty: 2}}})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	want, err = u.oracle.Get(ctx, "SO1")
	require.NoError(t, err)
	assert.Equal(t, want, res.Order)
	assert.Equal(t, "2 New Road", res.Order.Address)
	assert.Equal(t, int64(2), res.Order.Version)

	w.Fence++
	res, err = s.Exchange(orders.WithWrite(ctx, w), "evt-x", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "shirt-s", Qty: 1}}, Reason: "wrong size"})
	require.NoError(t, err)
	newNo := tasks.ReplacementOrderNo("SO1", "evt-x")
	want, err = u.oracle.Get(ctx, newNo)
	require.NoError(t, err)
	assert.Equal(t, want, res.Order, "the answer is the replacement")
	assert.Equal(t, "SO1", res.Order.ExchangedFrom)
	a, err := s.Get(ctx, "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.StatusExchanged, a.Status)
	assert.Equal(t, newNo, a.ExchangedTo)

	h, err := orders.AllHistory(ctx, s, "SO1")
	require.NoError(t, err)
	wantH, err := orders.AllHistory(ctx, u.oracle, "SO1")
	require.NoError(t, err)
	assert.Equal(t, wantH, h)
	require.Len(t, h, 3)
	assert.Equal(t, orders.Entry{
		EventID: "evt-m", Type: orders.TypeModify, Fence: baseFence, Worker: "worker-1",
		StartedAt: started.UTC().Truncate(time.Microsecond), EndedAt: h[1].EndedAt,
		Version: 2, Detail: "changed address, items",
	}, h[1], "the headers became the write")
	assert.Equal(t, "admin", h[0].Worker)
	assert.Equal(t, baseFence+1, h[2].Fence)
	hb, err := orders.AllHistory(ctx, s, newNo)
	require.NoError(t, err)
	require.Len(t, hb, 1)
	assert.Equal(t, orders.TypeCreated, hb[0].Type)

	issued := u.Tokens()
	require.Len(t, issued, 1, "one token for every request")
	writes := 0
	for _, r := range u.seen() {
		assert.Equal(t, issued[0], r.Token, "%s %s", r.Method, r.Path)
		if r.Method == http.MethodPost {
			writes++
			assert.Equal(t, "worker-1", r.Worker)
			assert.Equal(t, started.UTC().Format(startedAtLayout), r.StartedAt)
		}
	}
	assert.Equal(t, 2, writes)
	assert.Equal(t, []apiRequest{{
		Method: http.MethodPost, Path: "/api/orders/SO1/modify", Token: issued[0], IdempotencyKey: "evt-m",
		Fence: strconv.FormatInt(baseFence, 10), Worker: "worker-1", StartedAt: started.UTC().Format(startedAtLayout), Status: http.StatusOK,
	}}, u.seenFor("evt-m"))
	assert.Equal(t, strconv.FormatInt(baseFence+1, 10), u.seenFor("evt-x")[0].Fence)

	_, err = s.Get(ctx, "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
	_, err = orders.AllHistory(ctx, s, "NOPE")
	assert.ErrorIs(t, err, orders.ErrNotFound)
}

func TestHTTPReplay(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	s := u.store(t, Config{})
	storetest.Seed(t, u.oracle, "SO1")

	first, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("gift")})
	require.NoError(t, err)
	_, err = s.Modify(storetest.Fenced(t, baseFence+1), "evt-2", "SO1", orders.Changes{Remark: new("later")})
	require.NoError(t, err)
	again, err := s.Modify(storetest.Fenced(t, baseFence+2), "evt-1", "SO1", orders.Changes{Remark: new("gift")})
	require.NoError(t, err)
	now, err := u.oracle.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, orders.Result{Order: now, Replayed: true}, again, "the reference upstream answers a repeat with the order as it is now")
	assert.Equal(t, "gift", first.Order.Remark)

	x := orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}}
	created, err := s.Exchange(storetest.Fenced(t, baseFence+3), "evt-x", "SO1", x)
	require.NoError(t, err)
	replayed, err := s.Exchange(storetest.Fenced(t, baseFence+4), "evt-x", "SO1", x)
	require.NoError(t, err)
	assert.Equal(t, orders.Result{Order: created.Order, Replayed: true}, replayed)

	seen := u.seenFor("evt-1")
	require.Len(t, seen, 2)
	assert.Equal(t, []bool{false, true}, []bool{seen[0].Replayed, seen[1].Replayed})
	h, err := orders.AllHistory(t.Context(), u.oracle, "SO1")
	require.NoError(t, err)
	assert.Len(t, h, 4, "put, two modifies and the exchange: the replays wrote nothing")
}

// outcome is what a store call did, without timestamps, so that two stores
// can be compared.
type outcome struct {
	Result    orders.Result
	Orders    []orders.Order
	Entries   []orders.Entry
	Sentinels []string
	Closed    *orders.ClosedError
	Permanent bool
}

func outcomeOf(res orders.Result, err error) outcome {
	o := outcome{Result: res, Permanent: orders.Permanent(err)}
	o.Result.Order.UpdatedAt = time.Time{}
	for _, s := range []error{orders.ErrNotFound, orders.ErrStaleFence, orders.ErrClosed, orders.ErrPassed, orders.ErrNoFence, orders.ErrConflict, orders.ErrInvalid, ErrUpstream} {
		if errors.Is(err, s) {
			o.Sentinels = append(o.Sentinels, s.Error())
		}
	}
	var ce *orders.ClosedError
	if errors.As(err, &ce) {
		o.Closed = ce
	}
	return o
}

// fullStore is a store with the writes TestHTTPMatchesRedisStore plays.
type fullStore interface {
	orders.Store
	orders.Modifier
	orders.Exchanger
}

// TestHTTPMatchesRedisStore plays one script against a Redis store and an
// HTTP store (over another Redis store) and expects the same outcome from
// every step.
func TestHTTPMatchesRedisStore(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	stores := map[string]fullStore{"redis": newOracle(t), "http": u.store(t, Config{})}
	items := []orders.Item{{SKU: "x", Qty: 1}}
	type step struct {
		name string
		do   func(ctx context.Context, s fullStore) outcome
	}
	modify := func(fence int64, ev, no string, c orders.Changes) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(s.Modify(orders.WithWrite(ctx, orders.Write{Fence: fence, Worker: "w1"}), ev, no, c))
		}
	}
	exchange := func(fence int64, ev, no string, x orders.Exchange) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(s.Exchange(orders.WithWrite(ctx, orders.Write{Fence: fence, Worker: "w1"}), ev, no, x))
		}
	}
	modifyAt := func(fence, seq int64, ev, no string, c orders.Changes) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(s.Modify(orders.WithWrite(ctx, orders.Write{Fence: fence, Seq: seq, Worker: "w1"}), ev, no, c))
		}
	}
	exchangeAt := func(fence, seq int64, ev, no string, x orders.Exchange) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(s.Exchange(orders.WithWrite(ctx, orders.Write{Fence: fence, Seq: seq, Worker: "w1"}), ev, no, x))
		}
	}
	outOfTurn := func(fence, seq int64, ev, no string, c orders.Changes) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(s.Modify(orders.WithWrite(ctx, orders.Write{Fence: fence, Seq: seq, SeqOutOfTurn: true, Worker: "w1"}), ev, no, c))
		}
	}
	put := func(o orders.Order) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			return outcomeOf(orders.Result{}, s.Put(ctx, o))
		}
	}
	get := func(no string) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			o, err := s.Get(ctx, no)
			o.UpdatedAt = time.Time{}
			out := outcomeOf(orders.Result{}, err)
			out.Orders = []orders.Order{o}
			return out
		}
	}
	history := func(no string) func(context.Context, fullStore) outcome {
		return func(ctx context.Context, s fullStore) outcome {
			h, err := orders.AllHistory(ctx, s, no)
			for i := range h {
				h[i].StartedAt, h[i].EndedAt = time.Time{}, time.Time{}
			}
			out := outcomeOf(orders.Result{}, err)
			out.Entries = h
			return out
		}
	}
	steps := []step{
		{"put SO1", put(orders.Order{No: "SO1", Address: "a", Remark: "r", Items: []orders.Item{{SKU: "s", Qty: 1}}})},
		{"put SO9", put(orders.Order{No: "SO9", Items: items})},
		{"put SO3 cancelled", put(orders.Order{No: "SO3", Status: orders.StatusCancelled})},
		{"put SO5", put(orders.Order{No: "SO5", Items: items})},
		{"modify at 20", modifyAt(baseFence, 20, "evt-s20", "SO5", orders.Changes{Remark: new("20")})},
		{"modify at 10, after 20", modifyAt(baseFence+1, 10, "evt-s10", "SO5", orders.Changes{Remark: new("10")})},
		{"modify at 20 again", modifyAt(baseFence+1, 20, "evt-s20", "SO5", orders.Changes{Remark: new("20")})},
		{"modify without a position", modify(baseFence+1, "evt-s0", "SO5", orders.Changes{Address: new("no seq")})},
		{"exchange at 15, after 20", exchangeAt(baseFence+1, 15, "evt-s15", "SO5", orders.Exchange{Items: items})},
		{"modify at 30", modifyAt(baseFence+1, 30, "evt-s30", "SO5", orders.Changes{Remark: new("30")})},
		{"out of turn at 25, after 30", outOfTurn(baseFence+1, 25, "evt-o25", "SO5", orders.Changes{Remark: new("25")})},
		{"out of turn far ahead", outOfTurn(baseFence+1, 9000000000000000, "evt-o9", "SO5", orders.Changes{Remark: new("forged")})},
		{"modify at 31, after the forged one", modifyAt(baseFence+1, 31, "evt-s31", "SO5", orders.Changes{Remark: new("31")})},
		{"get SO5", get("SO5")},
		{"history SO5", history("SO5")},
		{"put invalid", put(orders.Order{No: "SO 4"})},
		{"modify", modify(baseFence, "evt-1", "SO1", orders.Changes{Address: new("b")})},
		{"modify replay", modify(baseFence+5, "evt-1", "SO1", orders.Changes{Address: new("b")})},
		{"event reused", modify(baseFence, "evt-1", "SO1", orders.Changes{Address: new("c")})},
		{"stale fence", modify(baseFence-1, "evt-2", "SO1", orders.Changes{Remark: new("late")})},
		{"equal fence", modify(baseFence, "evt-3", "SO1", orders.Changes{Remark: new("same lock")})},
		{"not found", modify(baseFence, "evt-4", "NOPE", orders.Changes{})},
		{"empty items", modify(baseFence, "evt-5", "SO1", orders.Changes{Items: []orders.Item{}})},
		{"no fence", modify(0, "evt-6", "SO1", orders.Changes{})},
		{"empty event", modify(baseFence, "", "SO1", orders.Changes{})},
		{"replacement taken", exchange(baseFence, "evt-7", "SO1", orders.Exchange{Items: items, NewOrderNo: "SO9"})},
		{"exchange without items", exchange(baseFence, "evt-8", "SO1", orders.Exchange{})},
		{"exchange", exchange(baseFence+1, "evt-9", "SO1", orders.Exchange{Items: items, Reason: "why"})},
		{"exchange replay", exchange(baseFence+2, "evt-9", "SO1", orders.Exchange{Items: items, Reason: "why"})},
		{"exchange event reused", exchange(baseFence+2, "evt-9", "SO1", orders.Exchange{Items: items, Reason: "other"})},
		{"modify exchanged", modify(baseFence+3, "evt-10", "SO1", orders.Changes{})},
		{"modify cancelled", modify(baseFence+3, "evt-11", "SO3", orders.Changes{})},
		{"modify replacement", modify(1, "evt-12", tasks.ReplacementOrderNo("SO1", "evt-9"), orders.Changes{Remark: new("new")})},
		{"get SO1", get("SO1")},
		{"get replacement", get(tasks.ReplacementOrderNo("SO1", "evt-9"))},
		{"get unknown", get("NOPE")},
		{"get invalid", get("SO/1")},
		{"history SO1", history("SO1")},
		{"history replacement", history(tasks.ReplacementOrderNo("SO1", "evt-9"))},
		{"history unknown", history("NOPE")},
	}
	for _, st := range steps {
		want := st.do(t.Context(), stores["redis"])
		got := st.do(t.Context(), stores["http"])
		assert.Equal(t, want, got, st.name)
	}
}

func TestHTTPStatusMapping(t *testing.T) {
	t.Parallel()
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	tests := []struct {
		name      string
		status    int
		header    http.Header
		body      string
		want      error
		permanent bool
		msg       string
	}{
		{"404 not found", 404, jsonHeader, `{"error":{"code":"not_found","message":"no order SO1"}}`, orders.ErrNotFound, true, "no order SO1"},
		{"404 from a wrong URL", 404, nil, "404 page not found\n", ErrUpstream, false, "URL"},
		{"404 with another code", 404, jsonHeader, `{"error":{"code":"no_route"}}`, ErrUpstream, false, "no_route"},
		{"409 stale fence", 409, jsonHeader, `{"error":{"code":"stale_fence","message":"fence 1 < 2"}}`, orders.ErrStaleFence, false, "fence 1 < 2"},
		{"409 passed", 409, jsonHeader, `{"error":{"code":"passed","message":"position 1 comes before 2"}}`, orders.ErrPassed, true, "position 1 comes before 2"},
		{"409 order closed", 409, jsonHeader, `{"error":{"code":"order_closed","status":"exchanged","exchanged_to":"SO2"}}`, orders.ErrClosed, true, "replacement is order SO2"},
		{"409 conflict", 409, jsonHeader, `{"error":{"code":"conflict","message":"SO2 exists"}}`, orders.ErrConflict, true, "SO2 exists"},
		{"409 unknown code", 409, jsonHeader, `{"error":{"code":"locked"}}`, orders.ErrConflict, true, "locked"},
		{"409 without body", 409, nil, "", orders.ErrConflict, true, "409"},
		{"400 no fence", 400, jsonHeader, `{"error":{"code":"no_fence"}}`, orders.ErrNoFence, true, "no_fence"},
		{"400 invalid", 400, jsonHeader, `{"error":{"code":"invalid","message":"bad JSON"}}`, orders.ErrInvalid, true, "bad JSON"},
		{"422 invalid", 422, jsonHeader, `{"error":{"code":"invalid","message":"items[0].qty must be positive"}}`, orders.ErrInvalid, true, "items[0].qty must be positive"},
		{"403 forbidden", 403, jsonHeader, `{"error":{"code":"forbidden","message":"not your order"}}`, orders.ErrInvalid, true, "not your order"},
		{"413 too large", 413, nil, "", orders.ErrInvalid, true, "413"},
		{"408 request timeout", 408, nil, "", ErrUpstream, false, "408"},
		{"429 too many requests", 429, http.Header{"Retry-After": {"1"}}, "", ErrUpstream, false, "429"},
		{"500", 500, jsonHeader, `{"error":{"code":"internal","message":"db down"}}`, ErrUpstream, false, "db down"},
		{"502 from a proxy", 502, http.Header{"Content-Type": {"text/html"}}, "<html>Bad Gateway</html>", ErrUpstream, false, "502"},
		{"503", 503, nil, "", ErrUpstream, false, "503"},
		{"redirect is not followed", 307, http.Header{"Location": {"/elsewhere"}}, "", ErrUpstream, false, "307"},
		{"200 not JSON", 200, nil, "<html>", ErrUpstream, false, "undecodable answer"},
		{"200 another order", 200, jsonHeader, orderJSON("SO7"), ErrUpstream, false, `"SO7"`},
		{"200 null", 200, jsonHeader, "null", ErrUpstream, false, "instead of"},
		{"message with control characters", 422, jsonHeader, `{"error":{"code":"invalid","message":"line1\nline2\u0000"}}`, orders.ErrInvalid, true, "line1line2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCanned(t, tt.status, tt.header, tt.body)
			tokens := &staticTokens{tok: "tok"}
			s, err := New(c.srv.URL, tokens, Config{})
			require.NoError(t, err)
			t.Cleanup(s.CloseIdleConnections)

			_, err = s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("x")})
			assert.ErrorIs(t, err, tt.want)
			assert.Equal(t, tt.permanent, orders.Permanent(err), "permanent: %v", err)
			assert.ErrorContains(t, err, tt.msg)
			var ue *UpstreamError
			require.ErrorAs(t, err, &ue)
			assert.Equal(t, tt.status, ue.StatusCode)
			assert.EqualValues(t, 1, c.requests.Load(), "one request, no retry, no redirect")
			assert.Zero(t, tokens.invalidated.Load())
		})
	}
}

func TestHTTPClosedErrorNamesReplacement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want orders.ClosedError
	}{
		{"exchanged", `{"error":{"code":"order_closed","status":"exchanged","exchanged_to":"SO2"}}`, orders.ClosedError{OrderNo: "SO1", Status: orders.StatusExchanged, ExchangedTo: "SO2"}},
		{"cancelled", `{"error":{"code":"order_closed","status":"cancelled"}}`, orders.ClosedError{OrderNo: "SO1", Status: orders.StatusCancelled}},
		{"status left out", `{"error":{"code":"order_closed","exchanged_to":"SO2"}}`, orders.ClosedError{OrderNo: "SO1", Status: orders.StatusExchanged, ExchangedTo: "SO2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCanned(t, http.StatusConflict, nil, tt.body)
			s, err := New(c.srv.URL, &staticTokens{tok: "tok"}, Config{})
			require.NoError(t, err)
			t.Cleanup(s.CloseIdleConnections)
			_, err = s.Exchange(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Exchange{Items: []orders.Item{{SKU: "x", Qty: 1}}})
			var ce *orders.ClosedError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tt.want, *ce)
		})
	}
}

func TestHTTPReplayedHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header http.Header
		want   bool
	}{
		{"absent", nil, false},
		{"true", http.Header{HeaderReplayed: {"true"}}, true},
		{"True", http.Header{HeaderReplayed: {"True"}}, true},
		{"false", http.Header{HeaderReplayed: {"false"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCanned(t, http.StatusOK, tt.header, orderJSON("SO1"))
			s, err := New(c.srv.URL, &staticTokens{tok: "tok"}, Config{})
			require.NoError(t, err)
			t.Cleanup(s.CloseIdleConnections)
			res, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
			require.NoError(t, err)
			assert.Equal(t, tt.want, res.Replayed)
		})
	}
}

// TestHTTP401RefreshesOnce: a refused token is invalidated and the request
// sent once more with a new one, and a burst of 401s costs one refresh.
func TestHTTP401RefreshesOnce(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	s := u.store(t, Config{})
	const n = 8
	for i := range n {
		storetest.Seed(t, u.oracle, "SO"+strconv.Itoa(i))
	}
	_, err := s.Get(t.Context(), "SO0")
	require.NoError(t, err)
	require.EqualValues(t, 1, u.Issued.Load())

	// One request: refused, then sent once more with one new token.
	u.Expire() // as if the upstream's clock ran ahead of expires_in
	res, err := s.Modify(storetest.Fenced(t, baseFence), "evt-one", "SO0", orders.Changes{Remark: new("after 401")})
	require.NoError(t, err)
	assert.Equal(t, "after 401", res.Order.Remark)
	issued := u.Tokens()
	require.Len(t, issued, 2, "exactly one extra token")
	seen := u.seenFor("evt-one")
	require.Len(t, seen, 2)
	assert.Equal(t, []int{http.StatusUnauthorized, http.StatusOK}, []int{seen[0].Status, seen[1].Status})
	assert.Equal(t, []string{issued[0], issued[1]}, []string{seen[0].Token, seen[1].Token})

	// A burst: every caller holds the refused token, one refresh for all.
	u.Expire()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = s.Modify(storetest.Fenced(t, baseFence), "evt-"+strconv.Itoa(i), "SO"+strconv.Itoa(i), orders.Changes{Remark: new("burst")})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "modify %d", i)
	}
	issued = u.Tokens()
	require.Len(t, issued, 3, "exactly one extra token for the whole burst")
	refused := 0
	for i := range n {
		// A caller that started after the first 401 already had the new
		// token; the others were refused once.
		seen := u.seenFor("evt-" + strconv.Itoa(i))
		require.NotEmpty(t, seen)
		require.LessOrEqual(t, len(seen), 2, "modify %d: at most one retry", i)
		last := seen[len(seen)-1]
		assert.Equal(t, http.StatusOK, last.Status)
		assert.Equal(t, issued[2], last.Token)
		for _, r := range seen[:len(seen)-1] {
			assert.Equal(t, http.StatusUnauthorized, r.Status)
			assert.Equal(t, issued[1], r.Token)
			refused++
		}
	}
	assert.Positive(t, refused)
}

func TestHTTPSecond401IsAnError(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	s := u.store(t, Config{})
	storetest.Seed(t, u.oracle, "SO1")
	u.RejectAll.Store(true)

	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{Remark: new("x")})
	assert.ErrorIs(t, err, ErrUpstream)
	assert.False(t, orders.Permanent(err), "an auth problem is retried, not archived: %v", err)
	var ue *UpstreamError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, http.StatusUnauthorized, ue.StatusCode)
	assert.EqualValues(t, 2, u.Issued.Load(), "the first token and exactly one more")
	assert.Len(t, u.seen(), 2, "two requests, no loop")
	for _, tok := range u.Tokens() {
		assert.NotContains(t, err.Error(), tok, "no token in errors")
	}
}

func TestHTTPUnknownTokenRetriedOnce(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	storetest.Seed(t, u.oracle, "SO1")
	tokens := &staticTokens{tok: "not-a-token"}
	s, err := New(u.APIURL(), tokens, Config{})
	require.NoError(t, err)
	t.Cleanup(s.CloseIdleConnections)

	_, err = s.Get(t.Context(), "SO1")
	assert.ErrorIs(t, err, ErrUpstream)
	assert.EqualValues(t, 1, tokens.invalidated.Load())
	assert.EqualValues(t, 2, tokens.gets.Load())
	assert.Len(t, u.seen(), 1, "the same token again is not sent again")
	assert.NotContains(t, err.Error(), "not-a-token")
}

func TestHTTPTokenUnavailableIsRetryable(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	u.FailTokens.Store(true)
	s := u.store(t, Config{})

	_, err := s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, token.ErrUnavailable)
	assert.False(t, orders.Permanent(err))
	assert.Empty(t, u.seen(), "nothing sent without a token")
}

// hanging is an order API that answers nothing until the client gives up;
// arrived is signalled once per request.
func hanging(t *testing.T) (url string, arrived chan struct{}) {
	t.Helper()
	arrived = make(chan struct{}, 10)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv.URL, arrived
}

func TestHTTPTimeout(t *testing.T) {
	t.Parallel()
	url, arrived := hanging(t)
	s, err := New(url, &staticTokens{tok: "tok"}, Config{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.CloseIdleConnections)

	_, err = s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, ErrUpstream)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "no answer within 50ms")
	assert.False(t, orders.Permanent(err))
	assert.Len(t, arrived, 1)
}

func TestHTTPCallerCancelled(t *testing.T) {
	t.Parallel()
	url, arrived := hanging(t)
	s, err := New(url, &staticTokens{tok: "tok"}, Config{})
	require.NoError(t, err)
	t.Cleanup(s.CloseIdleConnections)

	lost := errors.New("lock lost")
	ctx, cancel := context.WithCancelCause(storetest.Fenced(t, baseFence))
	defer cancel(nil)
	go func() {
		select {
		case <-arrived:
			cancel(lost)
		case <-ctx.Done():
		}
	}()
	_, err = s.Modify(ctx, "evt-1", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, lost, "the context's cause reaches the caller")
	assert.NotErrorIs(t, err, ErrUpstream)
	assert.False(t, orders.Permanent(err))
}

func TestHTTPConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s, err := New("http://"+addr, &staticTokens{tok: "tok"}, Config{})
	require.NoError(t, err)

	_, err = s.Modify(storetest.Fenced(t, baseFence), "evt-1", "SO1", orders.Changes{})
	assert.ErrorIs(t, err, ErrUpstream)
	assert.False(t, orders.Permanent(err))
}

// TestHTTPChecksBeforeSending: requests that can never succeed fail as in
// the Redis store, without a token or a request.
func TestHTTPChecksBeforeSending(t *testing.T) {
	t.Parallel()
	c := newCanned(t, http.StatusOK, nil, orderJSON("SO1"))
	tokens := &staticTokens{tok: "tok"}
	s, err := New(c.srv.URL, tokens, Config{})
	require.NoError(t, err)
	items := []orders.Item{{SKU: "x", Qty: 1}}
	tests := []struct {
		name string
		call func(ctx context.Context) error
		want error
	}{
		{"modify without fence", func(ctx context.Context) error {
			_, err := s.Modify(ctx, "evt", "SO1", orders.Changes{})
			return err
		}, orders.ErrNoFence},
		{"exchange without fence", func(ctx context.Context) error {
			_, err := s.Exchange(ctx, "evt", "SO1", orders.Exchange{Items: items})
			return err
		}, orders.ErrNoFence},
		{"event ID with a newline", func(ctx context.Context) error {
			_, err := s.Modify(orders.WithWrite(ctx, orders.Write{Fence: 1}), "evt\r\nX-Evil: 1", "SO1", orders.Changes{})
			return err
		}, orders.ErrInvalid},
		{"event ID too long", func(ctx context.Context) error {
			_, err := s.Exchange(orders.WithWrite(ctx, orders.Write{Fence: 1}), strings.Repeat("e", 129), "SO1", orders.Exchange{Items: items})
			return err
		}, orders.ErrInvalid},
		{"bad order number", func(ctx context.Context) error {
			_, err := s.Get(ctx, "../admin")
			return err
		}, orders.ErrInvalid},
		{"bad history order number", func(ctx context.Context) error {
			_, err := orders.AllHistory(ctx, s, "")
			return err
		}, orders.ErrInvalid},
		{"exchange to itself", func(ctx context.Context) error {
			_, err := s.Exchange(orders.WithWrite(ctx, orders.Write{Fence: 1}), "evt", "SO1", orders.Exchange{Items: items, NewOrderNo: "SO1"})
			return err
		}, orders.ErrInvalid},
		{"put with bad status", func(ctx context.Context) error {
			return s.Put(ctx, orders.Order{No: "SO1", Status: "lost"})
		}, orders.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(t.Context())
			assert.ErrorIs(t, err, tt.want)
			assert.True(t, orders.Permanent(err))
		})
	}
	assert.Zero(t, c.requests.Load())
	assert.Zero(t, tokens.gets.Load())
}

func TestHTTPWorkerHeaderIsSafe(t *testing.T) {
	t.Parallel()
	u := newRefUpstream(t)
	s := u.store(t, Config{})
	storetest.Seed(t, u.oracle, "SO1")
	ctx := orders.WithWrite(t.Context(), orders.Write{Fence: baseFence, Worker: "host\nX-Evil: 1 é"})
	_, err := s.Modify(ctx, "evt-1", "SO1", orders.Changes{})
	require.NoError(t, err)
	seen := u.seenFor("evt-1")
	require.Len(t, seen, 1)
	assert.Equal(t, "host%0AX-Evil:%201%20%C3%A9", seen[0].Worker)
}

func TestHTTPHandlerRejectsBadRequests(t *testing.T) {
	t.Parallel()
	oracle := newOracle(t)
	storetest.Seed(t, oracle, "SO1")
	h := orderapitest.NewHandler(oracle)
	fence := strconv.FormatInt(baseFence, 10)
	tests := []struct {
		name   string
		method string
		path   string
		header map[string]string
		body   string
		status int
		code   string
	}{
		{"no idempotency key", "POST", "/orders/SO1/modify", map[string]string{HeaderFencingToken: fence}, `{}`, 400, CodeInvalid},
		{"no fence", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e"}, `{}`, 400, CodeNoFence},
		{"zero fence", "POST", "/orders/SO1/exchange", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: "0"}, `{"items":[{"sku":"x","qty":1}]}`, 400, CodeNoFence},
		{"fence not a number", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: "1e9"}, `{}`, 400, CodeNoFence},
		{"bad started at", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence, HeaderStartedAt: "yesterday"}, `{}`, 400, CodeInvalid},
		{"unknown field", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence}, `{"adress":"x"}`, 400, CodeInvalid}, //nolint:misspell // a misspelt field on purpose
		{"two values", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence}, `{} {}`, 400, CodeInvalid},
		{"too large", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence}, `{"remark":"` + strings.Repeat("x", orderapitest.MaxRequest) + `"}`, 413, CodeInvalid},
		{"both sequence headers", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence, HeaderSequence: "5", HeaderSequenceCheck: "5"}, `{}`, 400, CodeInvalid},
		{"sequence check not a number", "POST", "/orders/SO1/modify", map[string]string{HeaderIdempotencyKey: "e", HeaderFencingToken: fence, HeaderSequenceCheck: "-5"}, `{}`, 400, CodeInvalid},
		{"put naming another order", "PUT", "/orders/SO1", nil, `{"order_no":"SO2"}`, 422, CodeInvalid},
		{"bad order number", "GET", "/orders/SO%201", nil, ``, 422, CodeInvalid},
		{"not found", "GET", "/orders/NOPE/history", nil, ``, 404, CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequestWithContext(t.Context(), tt.method, tt.path, strings.NewReader(tt.body))
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tt.status, rec.Code, rec.Body.String())
			e := decodeError(rec.Code, rec.Body.Bytes(), "SO1")
			assert.Equal(t, tt.code, e.Code)
		})
	}
	o, err := oracle.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), o.Version, "nothing was written")
}

// FuzzDecodeError: any answer maps to an error without panicking, only
// client errors are permanent, and the upstream's text is cut and cleaned.
func FuzzDecodeError(f *testing.F) {
	f.Add(404, []byte(`{"error":{"code":"not_found","message":"no"}}`))
	f.Add(409, []byte(`{"error":{"code":"order_closed","status":"exchanged","exchanged_to":"SO2"}}`))
	f.Add(409, []byte(`{"error":{"code":"stale_fence"}}`))
	f.Add(400, []byte(`{"error":{"code":"no_fence"}}`))
	f.Add(502, []byte(`<html>`))
	f.Add(422, []byte(`{"error":null}`))
	f.Add(429, []byte(`{"error":{"message":"\u0000\n\u00e9"}}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := decodeError(status, body, "SO1")
		require.NotNil(t, e.Err)
		assert.NotEmpty(t, e.Error())
		if orders.Permanent(e) {
			assert.True(t, status >= 400 && status <= 499, "status %d is permanent", status)
		}
		if status >= 500 || status < 400 {
			assert.ErrorIs(t, e, ErrUpstream)
		}
		assert.LessOrEqual(t, len(e.Message), maxMessage)
		assert.True(t, utf8.ValidString(e.Message) && utf8.ValidString(e.Code))
		assert.False(t, strings.ContainsFunc(e.Message+e.Code, unicode.IsControl), "control characters in %q", e.Message)
	})
}

// checkingStore is a orders.Store that checks writes as RedisStore does and
// answers them with the order, without keeping anything.
type checkingStore struct{ orders.Store }

func (checkingStore) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	if _, err := orders.FencedWrite(ctx); err != nil {
		return orders.Result{}, err
	}
	if err := orders.CheckModify(eventID, orderNo, c); err != nil {
		return orders.Result{}, err
	}
	return orders.Result{Order: orders.Order{No: orderNo, Status: orders.StatusActive, Items: []orders.Item{}}}, nil
}

func (checkingStore) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	if _, err := orders.FencedWrite(ctx); err != nil {
		return orders.Result{}, err
	}
	if err := orders.CheckExchange(eventID, orderNo, x.NewOrderNo, x); err != nil {
		return orders.Result{}, err
	}
	return orders.Result{Order: orders.Order{No: x.NewOrderNo, Status: orders.StatusActive, Items: x.Items}}, nil
}

// TestHandlerServesTheStoresWrites: the reference server serves the write
// endpoints of the writes its store implements, and leaves the others
// unknown paths (a bare 404), so a test store need not implement a write
// it is not asked for.
func TestHandlerServesTheStoresWrites(t *testing.T) {
	t.Parallel()
	type modifierOnly struct {
		orders.Store
		orders.Modifier
	}
	h := orderapitest.NewHandler(modifierOnly{Modifier: checkingStore{}})
	rec := postWrite(t, h, "/orders/SO1/modify", `{"remark":"x"}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	rec = postWrite(t, h, "/orders/SO1/exchange", `{"items":[{"sku":"x","qty":1}],"new_order_no":"SO2"}`)
	require.Equal(t, http.StatusNotFound, rec.Code, rec.Body.String())
	e := decodeError(rec.Code, rec.Body.Bytes(), "SO1")
	assert.NotErrorIs(t, e, orders.ErrNotFound, "an unknown path, not a missing order")
	assert.ErrorIs(t, e, ErrUpstream)
}

// FuzzHTTPHandler: whatever a client sends, the reference server answers
// with the order or with the API's error body, never anything else.
func FuzzHTTPHandler(f *testing.F) {
	f.Add(false, "evt-1", "1796264668538149", "", []byte(`{"address":"a","items":[{"sku":"x","qty":1}]}`))
	f.Add(true, "evt-1", "1", "2026-12-03T02:24:28.541123Z", []byte(`{"items":[{"sku":"x","qty":1}],"new_order_no":"SO2"}`))
	f.Add(false, "", "-1", "x", []byte(`{"items":[]}`))
	f.Add(true, "e", "9223372036854775808", "", []byte(`{"items":null} []`))
	h := orderapitest.NewHandler(checkingStore{})
	f.Fuzz(func(t *testing.T, exchange bool, key, fence, started string, body []byte) {
		path := "/orders/SO1/modify"
		if exchange {
			path = "/orders/SO1/exchange"
		}
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set(HeaderIdempotencyKey, key)
		req.Header.Set(HeaderFencingToken, fence)
		req.Header.Set(HeaderStartedAt, started)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var o orders.Order
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &o))
			assert.NotEmpty(t, o.No)
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			e := decodeError(rec.Code, rec.Body.Bytes(), "SO1")
			assert.Contains(t, []string{CodeInvalid, CodeNoFence}, e.Code, rec.Body.String())
			assert.True(t, orders.Permanent(e))
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
