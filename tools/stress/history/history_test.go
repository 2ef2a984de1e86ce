package history_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tools/stress/history"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

var items = []orders.Item{{SKU: "A", Qty: 1}}

// good is a history that keeps every rule: SO1 is put, modified twice in
// one hold and once in a later one (a repeat answered as a replay in
// between), and exchanged to SO2, which is then modified.
func good() (history.History, map[string]orders.Order) {
	h := history.History{
		"SO1": {
			{Kind: history.KindPut, Put: orders.Order{Address: "a0", Items: items}},
			{Kind: history.KindModify, EventID: "m1", Fence: 10, Worker: "w1", Seq: 1, Changes: orders.Changes{Address: new("a1")}},
			{Kind: history.KindModify, EventID: "m2", Fence: 10, Worker: "w1", Seq: 2, Changes: orders.Changes{Remark: new("r2")}},
			{Kind: history.KindModify, EventID: "m2", Fence: 12, Worker: "w2", Seq: 2, Replayed: true},
			{Kind: history.KindModify, EventID: "m3", Fence: 12, Worker: "w2", Seq: 3, Changes: orders.Changes{Address: new("a3")}},
			{Kind: history.KindExchange, EventID: "x4", Fence: 13, Worker: "w1", Seq: 4,
				Exchange: orders.Exchange{Items: []orders.Item{{SKU: "B", Qty: 2}}, NewOrderNo: "SO2"}},
		},
		"SO2": {
			{Kind: history.KindCreated, EventID: "x4", Fence: 13, Worker: "w1", From: "SO1",
				Exchange: orders.Exchange{Items: []orders.Item{{SKU: "B", Qty: 2}}, NewOrderNo: "SO2"}},
			{Kind: history.KindModify, EventID: "m5", Fence: 20, Worker: "w3", Seq: 1, Changes: orders.Changes{Items: []orders.Item{{SKU: "C", Qty: 3}}}},
		},
	}
	final := map[string]orders.Order{
		"SO1": {No: "SO1", Status: orders.StatusExchanged, Address: "a3", Remark: "r2", Items: items, ExchangedTo: "SO2"},
		"SO2": {No: "SO2", Status: orders.StatusActive, Address: "a3", Remark: "r2", Items: []orders.Item{{SKU: "C", Qty: 3}}, ExchangedFrom: "SO1"},
	}
	return h, final
}

func TestCheckPassesAGoodHistory(t *testing.T) {
	t.Parallel()
	h, final := good()
	assert.Empty(t, history.Check(h, final))
}

// A replacement's own lock may hand out fences below its creation's (the
// exchange's, from another key; or a promoted master's clock behind): the
// contract starts the replacement without a fence, and so does the check.
func TestCheckComparesAReplacementsFencesFromItsOwnLock(t *testing.T) {
	t.Parallel()
	h, final := good()
	h["SO2"][1].Fence = 5 // below the creation's 13
	assert.Empty(t, history.Check(h, final))
	h["SO2"] = append(h["SO2"], history.Write{Kind: history.KindModify, EventID: "m6", Fence: 4, Worker: "w4", Seq: 2,
		Changes: orders.Changes{Items: []orders.Item{{SKU: "C", Qty: 3}}}})
	found := history.Check(h, final)
	require.Len(t, found, 1, "%v", found)
	assert.Equal(t, history.RuleFence, found[0].Rule, "under its own lock, a fence may not go down")
}

// TestCheckFindsEachBrokenRule: each case breaks one rule of a good
// history, and the checker finds that rule broken, and only that one.
func TestCheckFindsEachBrokenRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rule  string
		order string
		// breaks the good history h, or its final state.
		breaks func(h history.History, final map[string]orders.Order)
	}{
		{"a position accepted after a later one", history.RulePosition, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"][4].Seq = 2 // m3 at m2's position
		}},
		{"a fence that goes down", history.RuleFence, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"][4].Fence = 9 // m3 below m1 and m2's fence
		}},
		{"an equal fence from another hold", history.RuleHold, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"][2].Worker = "w9" // m2 under m1's fence, by another worker
		}},
		{"an event applied twice", history.RuleOnce, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"][3].Replayed = false // the repeat of m2 applied again (it changes nothing)
			h["SO1"][3].Seq = 0
		}},
		{"a replay of an event never applied", history.RuleOnce, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"][3].EventID = "m-never"
		}},
		{"a final state that is not the replay", history.RuleReplay, "SO2", func(_ history.History, final map[string]orders.Order) {
			o := final["SO2"]
			o.Address = "a1" // a lost update of SO1's address, carried over
			final["SO2"] = o
		}},
		{"a write to an exchanged order", history.RuleReplay, "SO1", func(h history.History, _ map[string]orders.Order) {
			h["SO1"] = append(h["SO1"], history.Write{Kind: history.KindModify, EventID: "m6", Fence: 14, Worker: "w1", Seq: 5,
				Changes: orders.Changes{Address: new("a3")}})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, final := good()
			tt.breaks(h, final)
			found := history.Check(h, final)
			require.Len(t, found, 1, "%v", found)
			assert.Equal(t, tt.rule, found[0].Rule, found[0].String())
			assert.Equal(t, tt.order, found[0].OrderNo, found[0].String())
		})
	}
}

// TestCheckNamesOrdersWithoutWrites: an order the store has without an
// accepted write, and one the history has but the store lacks.
func TestCheckNamesOrdersWithoutWrites(t *testing.T) {
	t.Parallel()
	h, final := good()
	final["SO9"] = orders.Order{No: "SO9", Status: orders.StatusActive, Items: items}
	delete(final, "SO2")
	found := history.Check(h, final)
	require.Len(t, found, 2, "%v", found)
	assert.Equal(t, "SO2", found[0].OrderNo)
	assert.Equal(t, "SO9", found[1].OrderNo)
}

// TestFromLogAndFromEntryAgree: the reference order API's log and the
// Redis store's history behind it give the same history, which passes
// against the store's orders; the refused writes are left out.
func TestFromLogAndFromEntryAgree(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	oracle, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	api := orderapitest.NewHandler(oracle)
	fence := time.Now().UnixMicro()
	send := func(method, path, event string, f, seq int64, worker, body string) int {
		req := httptest.NewRequestWithContext(t.Context(), method, path, strings.NewReader(body))
		if event != "" {
			req.Header.Set("Idempotency-Key", event)
			req.Header.Set("Fencing-Token", strconv.FormatInt(f, 10))
			req.Header.Set("Order-Sequence", strconv.FormatInt(seq, 10))
			req.Header.Set("X-Worker-Id", worker)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		return rec.Code
	}
	require.Equal(t, http.StatusNoContent, send(http.MethodPut, "/orders/SO1", "", 0, 0, "", `{"address":"a0","items":[{"sku":"A","qty":1}]}`))
	require.Equal(t, http.StatusOK, send(http.MethodPost, "/orders/SO1/modify", "m1", fence, 1, "w1", `{"address":"a1"}`))
	require.Equal(t, http.StatusOK, send(http.MethodPost, "/orders/SO1/modify", "m1", fence, 1, "w1", `{"address":"a1"}`))
	require.Equal(t, http.StatusConflict, send(http.MethodPost, "/orders/SO1/modify", "m2", fence-1, 2, "w0", `{"remark":"late"}`))
	require.Equal(t, http.StatusOK, send(http.MethodPost, "/orders/SO1/modify", "m2", fence+1, 2, "w2", `{"remark":"r2"}`))
	require.Equal(t, http.StatusOK, send(http.MethodPost, "/orders/SO1/exchange", "x3", fence+2, 3, "w2", `{"items":[{"sku":"B","qty":2}],"new_order_no":"SO2"}`))
	require.Equal(t, http.StatusOK, send(http.MethodPost, "/orders/SO2/modify", "m4", fence+3, 1, "w1", `{"items":[{"sku":"C","qty":3}]}`))

	fromLog, err := history.FromLog(api.Log())
	require.NoError(t, err)
	final := map[string]orders.Order{}
	fromStore := history.History{}
	bodies := map[string]history.Write{}
	for _, ws := range fromLog {
		for _, w := range ws {
			if !w.Replayed {
				bodies[w.EventID+"/"+w.Kind] = w
			}
		}
	}
	for _, no := range []string{"SO1", "SO2"} {
		final[no], err = oracle.Get(t.Context(), no)
		require.NoError(t, err)
		entries, err := orders.AllHistory(t.Context(), oracle, no)
		require.NoError(t, err)
		for _, e := range entries {
			w, ok := history.FromEntry(no, e)
			require.True(t, ok)
			b := bodies[w.EventID+"/"+w.Kind]
			w.Put, w.Changes, w.Exchange, w.From = b.Put, b.Changes, b.Exchange, b.From
			fromStore[no] = append(fromStore[no], w)
		}
	}
	assert.Empty(t, history.Check(fromLog, final))
	assert.Empty(t, history.Check(fromStore, final))
	type key struct {
		Kind, EventID, Worker string
		Fence, Seq            int64
		Replayed              bool
	}
	keys := func(h history.History, skipReplays bool) map[string][]key {
		out := map[string][]key{}
		for no, ws := range h {
			for _, w := range ws {
				if !skipReplays || !w.Replayed {
					out[no] = append(out[no], key{w.Kind, w.EventID, w.Worker, w.Fence, w.Seq, w.Replayed})
				}
			}
		}
		return out
	}
	assert.Equal(t, keys(fromStore, false), keys(fromLog, true), "the store's history is the log's applied writes")
	assert.Len(t, fromLog["SO1"], 5, "put, m1, its replay, m2 and x3; the stale m2 left out")
}

// TestFromLogRefusesADroppedLog: a log that dropped writes cannot be
// checked.
func TestFromLogRefusesADroppedLog(t *testing.T) {
	t.Parallel()
	_, err := history.FromLog(orderapitest.Log{Dropped: 1})
	require.Error(t, err)
}
