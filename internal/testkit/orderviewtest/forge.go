package orderviewtest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/requeue"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
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
	seq, err := requeue.Sequencer(intake, prefix, keyorder.SeqConfig{})
	require.NoError(t, err)
	key := seq.SeqKey(no)
	require.NoError(t, intake.Set(context.Background(), key, "x", 0).Err(), "the intake's user may write a sequence")
	return key
}
