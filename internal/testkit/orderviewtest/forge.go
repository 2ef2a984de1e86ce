package orderviewtest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// Later accepts, for each order of nos, a modify (event ID no+"-later")
// under prefix (KEY_PREFIX) that asynq keeps in its scheduled set for an
// hour: with a BLOCKED_AFTER of at most 1 ms, each order is blocked, as
// scheduled, once Later returns. The test must delete the asynq queues it
// leaves.
func Later(t testing.TB, rdb redis.UniversalClient, prefix string, nos ...string) {
	t.Helper()
	p, err := producer.New(rdb, producer.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	defer p.Close()
	for _, no := range nos {
		_, err := p.EnqueueModify(context.Background(), no, tasks.Changes{Remark: new("ring twice")},
			producer.WithEventID(no+"-later"), producer.WithProcessIn(time.Hour))
		require.NoError(t, err)
	}
	// A head is blocked once it has waited longer than BLOCKED_AFTER, by
	// the reader's clock against its reservation's (Redis TIME, in whole
	// ms). A listing right after Later can come within that millisecond
	// (it did, 5 times in 150 runs on a loaded machine): let 2 ms pass,
	// a condition on the clock itself, not a wait for another goroutine.
	time.Sleep(2 * time.Millisecond)
}

// WrongTypeSeq overwrites order no's sequence (under prefix, KEY_PREFIX)
// with a string through intake, a client logged in as the Redis user of
// `producer acl intake` (acl.Rules(acl.Intake, ...)), as that user may:
// every read of the sequence then meets WRONGTYPE. It returns the key.
func WrongTypeSeq(t testing.TB, intake redis.UniversalClient, prefix, no string) string {
	t.Helper()
	seq, err := orderkeys.Sequencer(intake, prefix, orderkeys.Use{})
	require.NoError(t, err)
	key := seq.SeqKey(no)
	require.NoError(t, intake.Set(context.Background(), key, "x", 0).Err(), "the intake's user may write a sequence")
	return key
}

// ForgedWorker is the worker ID that [ForgeNotes] puts on its forged
// writes.
const ForgedWorker = "vm-3156-b449e766"

// ForgeNotes pushes into order no's notes list (under prefix, KEY_PREFIX),
// through notes, a client logged in as a Redis user that may write the
// notes (acl.IntakeAdmin or acl.DashboardWrite), what the security review
// of 2026-12-07 (N4) pushed: an applied modify under ForgedWorker, a note
// by another principal (admin#2), a modify in the older JSON form, and
// "{". The first three must read as notes, the last as unreadable. at is
// the forged entries' version.
func ForgeNotes(t testing.TB, notes redis.UniversalClient, prefix, no string, at int64) {
	t.Helper()
	b36 := func(n int64) string { return strconv.FormatInt(n, 36) }
	now := time.Now().UnixMicro()
	key := prefix + "order:{" + no + "}:notes" // redisstore's key layout
	for _, e := range []string{
		strings.Join([]string{"3", "m", "crm-refund-7731", b36(1), ForgedWorker, b36(5), b36(now), b36(at), b36(9), "a"}, "\x1f"),
		strings.Join([]string{"3", "n", "", "0", "admin#2", "", b36(now), b36(at), "", "hold by admin#2: customer asked to reroute"}, "\x1f"),
		`{"type":"order:modify","event_id":"crm-refund-7732","worker":"` + ForgedWorker + `","detail":"changed address to 1 Attacker Rd","fence":"1","version":"` +
			strconv.FormatInt(at, 10) + `","started_at":"` + strconv.FormatInt(now, 10) + `","ended_at":"` + strconv.FormatInt(now, 10) + `"}`,
		"{",
	} {
		require.NoError(t, notes.RPush(context.Background(), key, e).Err(), "the user may push a note")
	}
}
