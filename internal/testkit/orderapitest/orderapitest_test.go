package orderapitest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// fence is a realistic fence: microseconds from a clock.
var fence = time.Now().UnixMicro()

func newOracle(t *testing.T) *redisstore.Store {
	t.Helper()
	db := redistest.New(t)
	s, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	return s
}

// serve sends one request to h and returns the answer.
func serve(t *testing.T, h http.Handler, method, path string, hdr map[string]string, body string) *httptest.ResponseRecorder {
	t.Helper()
	return serveCtx(t.Context(), h, method, path, hdr, body)
}

func serveCtx(ctx context.Context, h http.Handler, method, path string, hdr map[string]string, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func writeHeaders(event string, f int64, worker string, seq int64) map[string]string {
	h := map[string]string{"Idempotency-Key": event, "Fencing-Token": strconv.FormatInt(f, 10), "X-Worker-Id": worker}
	if seq > 0 {
		h["Order-Sequence"] = strconv.FormatInt(seq, 10)
	}
	return h
}

// TestLogRecordsEveryWrite: the log has each write as it came (order,
// event, kind, fence, worker, position, body, arrival) and as it was
// answered: accepted, replayed, or refused with its status and code.
// Reads are not logged.
func TestLogRecordsEveryWrite(t *testing.T) {
	t.Parallel()
	h := orderapitest.NewHandler(newOracle(t))
	before := time.Now()
	require.Equal(t, http.StatusNoContent, serve(t, h, http.MethodPut, "/orders/SO1", nil, `{"address":"a0","items":[{"sku":"A","qty":1}]}`).Code)
	modify := `{"address":"a1"}`
	rec := serve(t, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e1", fence, "w1", 1), modify)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, http.StatusOK, serve(t, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e1", fence, "w1", 1), modify).Code)
	require.Equal(t, http.StatusConflict, serve(t, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e2", fence-1, "w2", 2), `{"remark":"r"}`).Code)
	require.Equal(t, http.StatusBadRequest, serve(t, h, http.MethodPost, "/orders/SO1/modify", map[string]string{"Idempotency-Key": "e3"}, `{}`).Code)
	exchange := `{"items":[{"sku":"B","qty":2}],"new_order_no":"SO2"}`
	require.Equal(t, http.StatusOK, serve(t, h, http.MethodPost, "/orders/SO1/exchange", writeHeaders("x1", fence+1, "w2", 2), exchange).Code)
	require.Equal(t, http.StatusOK, serve(t, h, http.MethodGet, "/orders/SO1", nil, ``).Code)

	log := h.Log()
	assert.Zero(t, log.Dropped)
	type seen struct {
		Kind, OrderNo, EventID, Worker string
		Fence, Seq                     int64
		Status                         int
		Code                           string
		Replayed, Accepted             bool
	}
	var got []seen
	for _, r := range log.Records {
		got = append(got, seen{r.Kind, r.OrderNo, r.EventID, r.Worker, r.Fence, r.Seq, r.Status, r.Code, r.Replayed, r.Accepted()})
		assert.False(t, r.At.Before(before), "arrival time %v", r.At)
	}
	assert.Equal(t, []seen{
		{orderapitest.KindPut, "SO1", "", "", 0, 0, http.StatusNoContent, "", false, true},
		{orderapitest.KindModify, "SO1", "e1", "w1", fence, 1, http.StatusOK, "", false, true},
		{orderapitest.KindModify, "SO1", "e1", "w1", fence, 1, http.StatusOK, "", true, true},
		{orderapitest.KindModify, "SO1", "e2", "w2", fence - 1, 2, http.StatusConflict, "stale_fence", false, false},
		{orderapitest.KindModify, "SO1", "e3", "", 0, 0, http.StatusBadRequest, "no_fence", false, false},
		{orderapitest.KindExchange, "SO1", "x1", "w2", fence + 1, 2, http.StatusOK, "", false, true},
	}, got)
	assert.JSONEq(t, modify, string(log.Records[1].Body))
	assert.JSONEq(t, exchange, string(log.Records[5].Body))
	assert.Equal(t, "a1", log.Records[1].Order.Address, "the order the write answered with")
	assert.Equal(t, "SO2", log.Records[5].Order.No, "an exchange answers with the replacement")
}

// TestLogIsTheOrderOfAcceptance: writes sent at once are applied one at a
// time, and logged in the order the store applied them: the versions
// they answered with go up by one along the log, and the last one logged
// is what the order shows.
func TestLogIsTheOrderOfAcceptance(t *testing.T) {
	t.Parallel()
	oracle := newOracle(t)
	h := orderapitest.NewHandler(oracle)
	require.Equal(t, http.StatusNoContent, serve(t, h, http.MethodPut, "/orders/SO1", nil, `{"items":[{"sku":"A","qty":1}]}`).Code)
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := strconv.Itoa(i)
			rec := serve(t, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e"+id, fence, "w", 0), `{"remark":"`+id+`"}`)
			assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		})
	}
	wg.Wait()
	log := h.Log().Records[1:]
	require.Len(t, log, n)
	for i, r := range log {
		assert.Equal(t, int64(i+2), r.Order.Version, "record %d (%s)", i, r.EventID)
	}
	var last struct{ Remark string }
	require.NoError(t, json.Unmarshal(log[n-1].Body, &last))
	o, err := oracle.Get(t.Context(), "SO1")
	require.NoError(t, err)
	assert.Equal(t, last.Remark, o.Remark)
}

// blockingStore blocks each Modify until release is closed, after
// saying so on entered.
type blockingStore struct {
	*redisstore.Store
	entered chan struct{}
	release chan struct{}
}

func (s blockingStore) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Modify(ctx, eventID, orderNo, c)
}

// TestWriteWaitingForItsTurnEnds: a write waiting behind another one
// whose request ends is answered 500 and logged as refused, and it never
// reaches the store.
func TestWriteWaitingForItsTurnEnds(t *testing.T) {
	t.Parallel()
	oracle := newOracle(t)
	bs := blockingStore{Store: oracle, entered: make(chan struct{}, 2), release: make(chan struct{})}
	h := orderapitest.NewHandler(bs)
	require.Equal(t, http.StatusNoContent, serve(t, h, http.MethodPut, "/orders/SO1", nil, `{"items":[{"sku":"A","qty":1}]}`).Code)
	first := make(chan int, 1)
	go func() {
		first <- serve(t, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e1", fence, "w", 0), `{"remark":"1"}`).Code
	}()
	select {
	case <-bs.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never reached the store")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec := serveCtx(ctx, h, http.MethodPost, "/orders/SO1/modify", writeHeaders("e2", fence, "w", 0), `{"remark":"2"}`)
	assert.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	close(bs.release)
	select {
	case code := <-first:
		assert.Equal(t, http.StatusOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never ended")
	}
	assert.Empty(t, bs.entered, "the second write never reached the store")
	log := h.Log().Records
	require.Len(t, log, 3)
	assert.Equal(t, "e2", log[1].EventID)
	assert.Equal(t, "internal", log[1].Code)
	assert.False(t, log[1].Accepted())
	assert.True(t, log[2].Accepted())
}
