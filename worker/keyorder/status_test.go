package keyorder_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

func newSequencer(tb testing.TB, rdb redis.UniversalClient, db *redistest.DB, cfg keyorder.SeqConfig) *keyorder.Sequencer {
	tb.Helper()
	return space(tb, rdb, db.Prefix, cfg)
}

// space returns the Sequencer of the tests' key space under prefix (a
// test database's prefix): prefix+"lock:", cfg's other settings.
func space(tb testing.TB, rdb redis.UniversalClient, prefix string, cfg keyorder.SeqConfig) *keyorder.Sequencer {
	tb.Helper()
	cfg.Prefix = prefix + "lock:"
	return seqOn(tb, rdb, cfg)
}

// seqOn returns the Sequencer of cfg on rdb.
func seqOn(tb testing.TB, rdb redis.UniversalClient, cfg keyorder.SeqConfig) *keyorder.Sequencer {
	tb.Helper()
	q, err := keyorder.NewSequencer(rdb, cfg)
	require.NoError(tb, err)
	return q
}

// backlog reserves n positions of key's sequence in pipelines, as a busy
// order's producer would, and returns the first.
func backlog(tb testing.TB, q *keyorder.Sequencer, rdb redis.UniversalClient, key string, n int) int64 {
	tb.Helper()
	ctx := context.Background()
	require.NoError(tb, q.LoadScripts(ctx))
	var first int64
	for start := 0; start < n; start += 500 {
		pipe := rdb.Pipeline()
		var cmds []*keyorder.ReserveCmd
		for i := start; i < min(start+500, n); i++ {
			c, err := q.ReserveIn(ctx, pipe, key, "m ev-"+strconv.Itoa(i), "")
			require.NoError(tb, err)
			cmds = append(cmds, c)
		}
		_, err := pipe.Exec(ctx)
		require.NoError(tb, err)
		for i, c := range cmds {
			pos, err := c.Pos()
			require.NoError(tb, err)
			if start == 0 && i == 0 {
				first = pos
			}
		}
	}
	return first
}

// cmdHook records the name of every command a client sends, a pipeline's
// one by one.
type cmdHook struct {
	mu    sync.Mutex
	names []string
}

func (h *cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			h.names = append(h.names, c.Name())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *cmdHook) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.names
	h.names = nil
	return n
}

// A forged sequence of 20,000,000 waiting positions is read in one page:
// Status returns at once with the count and at most a page of positions.
func TestStatusOfAForgedBacklogIsOnePage(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	q := newSequencer(t, db.Client, db, keyorder.SeqConfig{})
	sk := q.SeqKey("SO50")
	fields := []any{"n", "20000000", "d", "0"}
	for pos := 1; pos <= 30; pos++ {
		fields = append(fields, "p:"+strconv.Itoa(pos), "1700000000000 m ev-"+strconv.Itoa(pos))
	}
	require.NoError(t, db.Client.HSet(t.Context(), sk, fields...).Err())

	ctx := t.Context()
	st, err := q.Status(ctx, "SO50")
	require.NoError(t, err)
	require.True(t, st.Exists)
	require.Equal(t, int64(20000000), st.Waiting)
	require.Equal(t, int64(20000000), st.Last)
	require.Zero(t, st.Done)
	require.Len(t, st.Pending, keyorder.DefaultStatusPage)
	for i, p := range st.Pending {
		require.Equal(t, int64(i+1), p.Pos)
		require.Equal(t, "m ev-"+strconv.Itoa(i+1), p.Label)
	}
	require.Equal(t, time.Duration(-1), st.TTL, "the forged hash has no expiry")

	// Nothing recorded behind the count: the count, no positions.
	require.NoError(t, db.Client.HSet(t.Context(), q.SeqKey("SO51"), "n", "20000000", "d", "0").Err())
	st, err = q.Status(ctx, "SO51")
	require.NoError(t, err)
	require.Equal(t, int64(20000000), st.Waiting)
	require.Empty(t, st.Pending)
}

// Status of a forged sequence of 20,000,000 waiting positions does a
// page's work: counted in the commands Redis runs (the script's own calls
// included), not timed, so that a loaded machine cannot fail it.
func TestStatusOfAForgedBacklogRunsAFewCommands(t *testing.T) {
	t.Parallel()
	p := redistest.Dedicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	q, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{})
	require.NoError(t, err)
	fields := []any{"n", "20000000", "d", "0"}
	for pos := 1; pos <= 30; pos++ {
		fields = append(fields, "p:"+strconv.Itoa(pos), "1700000000000 m ev-"+strconv.Itoa(pos))
	}
	require.NoError(t, rdb.HSet(t.Context(), q.SeqKey("SO50"), fields...).Err())

	var st keyorder.Status
	calls := redistest.CallsDuring(t, rdb, func() {
		st, err = q.Status(t.Context(), "SO50")
	})
	require.NoError(t, err)
	require.Len(t, st.Pending, keyorder.DefaultStatusPage)
	scripts := calls["evalsha_ro"] + calls["eval_ro"]
	require.LessOrEqual(t, scripts, int64(2), "one script (sent whole after NOSCRIPT): %v", calls)
	delete(calls, "evalsha_ro")
	delete(calls, "eval_ro")
	require.LessOrEqual(t, calls.Total(), int64(3), "the script's three calls, not one per position: %v", calls)
}

// A malformed sequence is an error, and a missing one is no sequence.
func TestStatusOfMalformedAndMissingSequences(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	q := newSequencer(t, db.Client, db, keyorder.SeqConfig{})
	tests := []struct {
		name   string
		fields []any
		err    string
	}{
		{"no n", []any{"d", "5"}, "bad n"},
		{"n not a number", []any{"n", "inf", "d", "0"}, "bad n"},
		{"d not a number", []any{"n", "5", "d", "nan"}, "bad d"},
		{"bad log", []any{"n", "5", "d", "5", "log", "{"}, "bad log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "SO-bad-" + strings.ReplaceAll(tt.name, " ", "-")
			require.NoError(t, db.Client.HSet(t.Context(), q.SeqKey(key), tt.fields...).Err())
			_, err := q.Status(t.Context(), key)
			require.ErrorContains(t, err, tt.err)
		})
	}
	st, err := q.Status(t.Context(), "SO-never")
	require.NoError(t, err)
	require.Equal(t, keyorder.Status{}, st)
}

func TestStatusHonoursContext(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	q := newSequencer(t, db.Client, db, keyorder.SeqConfig{})
	backlog(t, q, db.Client, "SO-ctx", 3)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := q.Status(ctx, "SO-ctx")
	require.ErrorIs(t, err, context.Canceled)
}

// StatusPage sets the page, within 1 to MaxStatusPage.
func TestStatusPage(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	for _, page := range []int{-1, keyorder.MaxStatusPage + 1} {
		_, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{StatusPage: page})
		require.ErrorContains(t, err, "StatusPage", "page %d", page)
	}
	q := newSequencer(t, db.Client, db, keyorder.SeqConfig{StatusPage: 5})
	first := backlog(t, q, db.Client, "SO-page", 12)
	_, err := q.Void(t.Context(), "SO-page", first+1, "m ev-1", "refused")
	require.NoError(t, err)
	st, err := q.Status(t.Context(), "SO-page")
	require.NoError(t, err)
	require.Equal(t, int64(12), st.Waiting)
	require.Len(t, st.Pending, 5)
	require.Equal(t, first, st.Pending[0].Pos)
	require.Equal(t, "m ev-0", st.Pending[0].Label)
	require.Equal(t, "v refused", st.Pending[1].Record, "a voided position keeps its place until the cursor passes it")
	require.Empty(t, st.Pending[1].Label)
	require.Equal(t, first+4, st.Pending[4].Pos)
	require.Len(t, st.Log, 1)
	require.Positive(t, st.TTL)
}

// A view of a sequence with 3,000 waiting positions costs what one of 10
// does: one command from the client (the read-only script), three inside
// it (PTTL and two HMGETs), never HGETALL, and a reply of one page.
func TestStatusCostsTheSameWhateverTheBacklog(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	db.RequireProcess(t, "INFO commandstats")
	srv := redistest.Dedicated(t)
	admin := redisClient(t, srv.URL())
	rdb := redisClient(t, srv.URL())
	hook := &cmdHook{}
	rdb.AddHook(hook)
	q := newSequencer(t, rdb, db, keyorder.SeqConfig{})
	for _, n := range []int{10, 3000} {
		key := "SO-cost-" + strconv.Itoa(n)
		backlog(t, q, rdb, key, n)
		_, err := q.Status(t.Context(), key) // loads the script
		require.NoError(t, err)
		hook.take()
		require.NoError(t, admin.ConfigResetStat(t.Context()).Err())

		st, err := q.Status(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, []string{"evalsha_ro"}, hook.take(), "%d waiting: one round trip, one command", n)
		require.Equal(t, int64(n), st.Waiting)
		require.Len(t, st.Pending, min(n, keyorder.DefaultStatusPage))
		stats := commandStats(t, admin)
		delete(stats, "config|resetstat")
		require.Equal(t, map[string]int{"evalsha_ro": 1, "pttl": 1, "hmget": 2}, stats, "%d waiting", n)
	}
}

// commandStats returns the calls of each command since the last CONFIG
// RESETSTAT, from INFO commandstats.
func commandStats(t *testing.T, rdb *redis.Client) map[string]int {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
	stats := map[string]int{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.Atoi(calls)
		require.NoError(t, err, line)
		stats[name] = n
	}
	return stats
}

// A user that may only read the sequences reads their status.
func TestStatusAsAReadOnlyUser(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	q := newSequencer(t, db.Client, db, keyorder.SeqConfig{})
	first := backlog(t, q, db.Client, "SO-ro", 3)
	ro := db.AsUser(t, "resetkeys", "+@all", "%R~"+db.Prefix+"*")
	require.Error(t, ro.Client.HSet(t.Context(), q.SeqKey("SO-ro"), "d", "0").Err(), "the user may not write")
	qro := newSequencer(t, ro.Client, db, keyorder.SeqConfig{})
	for range 2 { // loads the script with EVAL_RO, then runs it by its SHA
		st, err := qro.Status(t.Context(), "SO-ro")
		require.NoError(t, err)
		require.Equal(t, int64(3), st.Waiting)
		require.Len(t, st.Pending, 3)
		require.Equal(t, first, st.Pending[0].Pos)
	}
}
