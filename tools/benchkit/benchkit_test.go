package benchkit

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=128,usec_per_call=128.00,rejected_calls=0,failed_calls=0\r\n"
	got := ParseCommandStats(info)
	require.Equal(t, map[string]CmdStat{"evalsha": {12, 340}, "config|resetstat": {1, 128}}, got)
	d := Delta(map[string]CmdStat{"evalsha": {2, 40}}, got)
	require.Equal(t, map[string]CmdStat{"evalsha": {10, 300}, "config|resetstat": {1, 128}}, d)
	require.Equal(t, int64(11), Sum(d))
	require.Equal(t, []string{"evalsha"}, Top(d, 1, func(s CmdStat) int64 { return s.Calls }))
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name string
		q    float64
		want time.Duration
	}{
		{"min", 0, 1},
		{"p50", 0.5, 5},
		{"p99", 0.99, 10},
		{"max", 1, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Quantile(ds, tt.q))
		})
	}
	require.Zero(t, Quantile(nil, 0.5))
}

func TestWindow(t *testing.T) {
	t0 := time.Unix(0, 0)
	samples := []Progress{{t0, 0}, {t0.Add(time.Second), 10}, {t0.Add(2 * time.Second), 50}, {t0.Add(3 * time.Second), 90}, {t0.Add(4 * time.Second), 100}}
	require.InDelta(t, 40.0, Window(samples, 100, 0.1, 0.9), 1e-9)
	require.Zero(t, Window(samples[:1], 100, 0.1, 0.9))
}

// entry builds a history entry at ms offsets from a fixed time.
func entry(ev, typ string, fence, version int64, startMs, endMs int) orders.Entry {
	t0 := time.Unix(1_700_000_000, 0)
	return orders.Entry{EventID: ev, Type: typ, Fence: fence, Version: version, Worker: "w" + strconv.FormatInt(fence, 10),
		StartedAt: t0.Add(time.Duration(startMs) * time.Millisecond), EndedAt: t0.Add(time.Duration(endMs) * time.Millisecond)}
}

func TestAnalyzeClean(t *testing.T) {
	a := Analyze(map[string][]orders.Entry{
		"SO1": {
			entry("", orders.TypePut, 0, 1, 0, 0),
			entry("e1", orders.TypeModify, 10, 2, 1, 5),
			entry("e2", orders.TypeModify, 20, 3, 7, 9),
			entry("x1", orders.TypeExchange, 30, 4, 9, 12),
		},
		// The replacement: its first entry is under SO1's lock, and a modify
		// of SO2 may have taken SO2's lock (a smaller fence) before SO2
		// existed; that is no overlap.
		"SO2": {
			entry("x1", orders.TypeCreated, 30, 1, 9, 13),
			entry("e3", orders.TypeModify, 25, 2, 8, 20),
		},
	})
	require.Empty(t, a.Violations)
	require.Equal(t, []time.Duration{0, 2 * time.Millisecond}, a.Handoffs)
	require.Equal(t, 2, a.Orders)
	require.Equal(t, 6, a.Entries)
	require.Equal(t, map[string]int{orders.TypeExchange: 1, orders.TypeCreated: 1}, a.Applied["x1"])
}

func TestAnalyzeViolations(t *testing.T) {
	sameFence := entry("e3", orders.TypeModify, 20, 4, 9, 10) // same fence, another writer; version skips 3
	sameFence.Worker = "another"
	a := Analyze(map[string][]orders.Entry{
		"SO1": {
			entry("e1", orders.TypeModify, 10, 1, 0, 5),
			entry("e2", orders.TypeModify, 20, 2, 4, 8), // starts before e1 ended
			sameFence,
			entry("x1", orders.TypeExchange, 30, 5, 11, 12),
		},
		"SO2": {entry("x1", orders.TypeCreated, 31, 1, 11, 13)}, // not the exchange's fence
	})
	require.Equal(t, 1, a.Count("overlap"))
	require.Equal(t, 1, a.Count("fence"))
	require.Equal(t, 2, a.Count("version")) // e3 and x1 sit one version off
	require.Equal(t, 1, a.Count("created"))
}

// The changes one worker drains in one hold share its fence: an equal fence
// is no violation for the same writer, and is one for another writer.
func TestAnalyzeOneHoldSharesItsFence(t *testing.T) {
	hold := []orders.Entry{
		entry("e1", orders.TypeModify, 10, 1, 0, 5),
		entry("e2", orders.TypeModify, 10, 2, 6, 8),
		entry("e3", orders.TypeModify, 10, 3, 9, 10),
	}
	require.Empty(t, Analyze(map[string][]orders.Entry{"SO1": hold}).Violations)
	hold[2].Worker = "someone else"
	a := Analyze(map[string][]orders.Entry{"SO1": hold})
	require.Equal(t, 1, a.Count("fence"))
}

func TestForEach(t *testing.T) {
	var n atomic.Int64
	require.NoError(t, ForEach(t.Context(), 100, 4, func(context.Context, int) error { n.Add(1); return nil }))
	require.Equal(t, int64(100), n.Load())

	boom := errors.New("boom")
	err := ForEach(t.Context(), 100, 4, func(_ context.Context, i int) error {
		if i == 3 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
}

func TestWaiterHandoffs(t *testing.T) {
	hist := map[string][]orders.Entry{"SO1": {
		entry("", orders.TypePut, 0, 1, 0, 0),
		entry("e1", orders.TypeModify, 10, 2, 0, 10),
		entry("e2", orders.TypeModify, 20, 3, 12, 20), // waited 5 ms: since 7, before e1 ended: a hand-off of 2 ms
		entry("e3", orders.TypeModify, 30, 4, 25, 30), // waited 1 ms: since 24, after e2 ended: a newcomer
		entry("e4", orders.TypeModify, 40, 5, 29, 35), // overlaps e3
	}}
	waited := map[string]time.Duration{"e2": 5 * time.Millisecond, "e3": time.Millisecond, "e4": 10 * time.Millisecond}
	got := WaiterHandoffs(hist, func(e orders.Entry) (time.Duration, bool) { d, ok := waited[e.EventID]; return d, ok })
	require.Equal(t, []time.Duration{2 * time.Millisecond}, got)
}

func TestInversions(t *testing.T) {
	withSeq := func(e orders.Entry, seq int64) orders.Entry { e.Seq = seq; return e }
	hist := map[string][]orders.Entry{
		"SO1": {
			entry("", orders.TypePut, 0, 1, 0, 0),
			withSeq(entry("e1", orders.TypeModify, 10, 2, 0, 1), 101),
			withSeq(entry("e3", orders.TypeModify, 20, 3, 2, 3), 103),
			entry("h1", orders.TypeModify, 30, 4, 4, 5), // no position: left out
			withSeq(entry("e2", orders.TypeModify, 40, 5, 6, 7), 102),
			withSeq(entry("e4", orders.TypeModify, 50, 6, 8, 9), 104),
		},
		"SO2": {withSeq(entry("e5", orders.TypeModify, 10, 1, 0, 1), 7)},
	}
	pairs, inv := Inversions(hist, BySeq)
	require.Equal(t, 3, pairs)
	require.Len(t, inv, 1)
	require.Equal(t, "order", inv[0].Kind)
	require.Contains(t, inv[0].Detail, "event e2 (place 102")
}

func TestKeyShapeAndCallName(t *testing.T) {
	tests := []struct {
		name, key, want string
	}{
		{"task hash", "asynq:{order_modify}:t:ev-1", "asynq:{}:t:*"},
		{"queue list", "asynq:{order_modify}:pending", "asynq:{}:pending"},
		{"lock", "ow:lock:{SO1}", "ow:lock:{}"},
		{"sequence", "ow:lock:{SO1}:seq", "ow:lock:{}:seq"},
		{"no tag", "asynq:queues", "asynq:queues"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, KeyShape(tt.key))
		})
	}
	cmd := redis.NewCmd(t.Context(), "evalsha", "abc", 3, "ow:lock:{SO1}", "ow:lock:{SO1}:fence", "ow:lock:{SO1}:seq", "owner")
	require.Equal(t, "evalsha ow:lock:{} ow:lock:{}:fence", CallName(cmd))
	require.Equal(t, "get", CallName(redis.NewStringCmd(t.Context(), "GET", "k")))
}

func TestCountHookLeavesOutHandshakes(t *testing.T) {
	h := NewCountHook()
	noop := func(context.Context, redis.Cmder) error { return nil }
	noopPipe := func(context.Context, []redis.Cmder) error { return nil }
	ctx := t.Context()
	require.NoError(t, h.ProcessHook(noop)(ctx, redis.NewCmd(ctx, "hello", 3)))
	require.NoError(t, h.ProcessPipelineHook(noopPipe)(ctx, []redis.Cmder{redis.NewCmd(ctx, "select", 1), redis.NewCmd(ctx, "client", "setinfo", "lib-name", "x")}))
	require.NoError(t, h.ProcessHook(noop)(ctx, redis.NewCmd(ctx, "get", "k")))
	require.NoError(t, h.ProcessPipelineHook(noopPipe)(ctx, []redis.Cmder{redis.NewCmd(ctx, "select", 1), redis.NewCmd(ctx, "get", "k")}))
	require.Equal(t, int64(2), h.RoundTrips())
	require.Equal(t, map[string]int64{"handshake": 2, "get": 1, "pipeline": 1}, h.ByName())
}
