package redisstore

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/orders/storetest"
)

// forged are what the security review of 2026-12-07 (N4) pushed into an
// order's notes list as the intake-admin user: an applied modify under a
// worker's ID, a note by another principal and a modify in the older JSON
// form, all at version 2; and "{", as the dashboard-write user.
func forged() []string {
	b36 := func(n int64) string { return strconv.FormatInt(n, 36) }
	now := time.Now().UnixMicro()
	return []string{
		strings.Join([]string{"3", "m", "crm-refund-7731", b36(1), "vm-3156-b449e766", b36(5), b36(now), "2", b36(9), "a"}, "\x1f"),
		strings.Join([]string{"3", "n", "", "0", "admin#2", "", b36(now), "2", "", "hold by admin#2: customer asked to reroute"}, "\x1f"),
		`{"type":"order:modify","event_id":"crm-refund-7732","worker":"vm-3156-b449e766","detail":"changed address to 1 Attacker Rd",` +
			`"fence":"1","version":"2","started_at":"` + strconv.FormatInt(now, 10) + `","ended_at":"` + strconv.FormatInt(now, 10) + `"}`,
	}
}

// TestForgedNotesAreNotes pushes the review's forged entries as the users
// that may write the notes, and reads the history as each of them: the
// forged writes are notes by the principal they carry, and "{" is an
// unreadable note that fails no read.
func TestForgedNotesAreNotes(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	s, err := New(db.Client, Config{Prefix: db.Prefix})
	require.NoError(t, err)
	ctx := t.Context()
	storetest.Seed(t, s, "SO20")
	_, err = s.Modify(storetest.At(t, baseFence, 1), "legit-20", "SO20", orders.Changes{Remark: new("x")})
	require.NoError(t, err)

	as := func(p acl.Process) *Store {
		rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
		require.NoError(t, err)
		u, err := New(db.AsUser(t, rules...).Client, Config{Prefix: db.Prefix})
		require.NoError(t, err)
		return u
	}
	admin, dash := as(acl.IntakeAdmin), as(acl.DashboardWrite)
	for _, e := range forged() {
		require.NoError(t, admin.rdb.RPush(ctx, s.notesKey("SO20"), e).Err())
	}
	require.NoError(t, dash.rdb.RPush(ctx, s.notesKey("SO20"), "{").Err())

	want := []string{
		"order:put 1  put: active",
		"order:modify 2 storetest changed remark",
		`order:note 2 vm-3156-b449e766 not written as a note (kind 'm'): a`,
		"order:note 2 admin#2 hold by admin#2: customer asked to reroute",
		"order:note 2 vm-3156-b449e766 not written as a note (order:modify): changed address to 1 Attacker Rd",
		`order:note 0  unreadable note (1 byte): "{"`,
	}
	for _, r := range []*Store{admin, dash} {
		h, err := orders.AllHistory(ctx, r, "SO20")
		require.NoError(t, err)
		var got []string
		for _, e := range h {
			if e.Type == orders.TypeNote {
				assert.Equal(t, []any{"", int64(0), int64(0)}, []any{e.EventID, e.Fence, e.Seq}, "a note has no event, fence or position")
			}
			got = append(got, strings.Join([]string{e.Type, strconv.FormatInt(e.Version, 10), e.Worker, e.Detail}, " "))
		}
		assert.Equal(t, want, got)

		// Page by page, the unreadable note comes once, on the last page.
		p, err := r.History(ctx, "SO20", orders.HistoryQuery{Limit: 1})
		require.NoError(t, err)
		assert.Len(t, p.Entries, 1)
		p, err = r.History(ctx, "SO20", orders.HistoryQuery{After: p.Next, Limit: 1})
		require.NoError(t, err)
		assert.Len(t, p.Entries, 5)
	}
}

// TestUnreadableNotes lists every element of the notes list that is no
// readable note as an unreadable one, escaped and cut, after the others.
func TestUnreadableNotes(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := t.Context()
	storetest.Seed(t, s, "SO1")
	require.NoError(t, s.Annotate(ctx, "SO1", orders.Note{By: "alice", Action: "hold", Reason: "ok"}))
	for _, e := range []string{
		"", "x", "{", `{"version":1}`, "3\x1fq", strings.Repeat("\x1f", 9),
		strings.Join([]string{"3", "n", "", "0", "mallory", "", "1", "1", "", "hold by mallory: \u202eevil"}, "\x1f"),
		strings.Join([]string{"3", "n", "", "0", "mal\nlory", "", "1", "1", "", "hold"}, "\x1f"),
		strings.Repeat("y", 5000),
	} {
		require.NoError(t, s.rdb.RPush(ctx, s.notesKey("SO1"), e).Err())
	}
	h, err := orders.AllHistory(ctx, s, "SO1")
	require.NoError(t, err)
	require.Len(t, h, 11)
	assert.Equal(t, "hold by alice: ok", h[1].Detail)
	var got []string
	for _, e := range h[2:] {
		assert.Equal(t, orders.TypeNote, e.Type)
		assert.Empty(t, e.Worker)
		got = append(got, e.Detail)
	}
	assert.Equal(t, []string{
		`unreadable note (0 bytes): ""`,
		`unreadable note (1 byte): "x"`,
		`unreadable note (1 byte): "{"`,
		`unreadable note (13 bytes): "{\"version\":1}"`,
		`unreadable note (3 bytes): "3\x1fq"`,
		`unreadable note (9 bytes): "\x1f\x1f\x1f\x1f\x1f\x1f\x1f\x1f\x1f"`,
		`unreadable note (45 bytes): "3\x1fn\x1f\x1f0\x1fmallory\x1f\x1f1\x1f1\x1f\x1fhold by mallory: \u202eevil"`,
		`unreadable note (26 bytes): "3\x1fn\x1f\x1f0\x1fmal\nlory\x1f\x1f1\x1f1\x1f\x1fhold"`,
		`unreadable note (5000 bytes): "` + strings.Repeat("y", maxUnreadableShown) + `"`,
	}, got)
}
