package orderviewtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// Later accepts, for each order of nos, a modify (event ID no+"-later")
// that asynq keeps in its scheduled set for an hour: with a BLOCKED_AFTER
// shorter than the test, each order is blocked, as scheduled. The test
// must delete the asynq queues it leaves.
func Later(t testing.TB, db *redistest.DB, nos ...string) {
	t.Helper()
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	defer p.Close()
	for _, no := range nos {
		_, err := p.EnqueueModify(context.Background(), no, tasks.Changes{Remark: new("ring twice")},
			producer.WithEventID(no+"-later"), producer.WithProcessIn(time.Hour))
		require.NoError(t, err)
	}
}

// WrongTypeSeq overwrites order no's sequence (KEY_PREFIX db.Prefix) with
// a string, as the Redis user of `producer acl intake` may: every read of
// the sequence then meets WRONGTYPE. It returns the key.
func WrongTypeSeq(t testing.TB, db *redistest.DB, no string) string {
	t.Helper()
	rules, err := acl.Rules(acl.Intake, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	seq, err := lock.NewSequencer(db.Client, lock.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	key := seq.SeqKey(no)
	intake := db.AsUser(t, rules...)
	require.NoError(t, intake.Client.Set(context.Background(), key, "x", 0).Err(), "the intake's user may write a sequence")
	return key
}
