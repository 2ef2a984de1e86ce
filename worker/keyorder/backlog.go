package keyorder

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The index of backlogs: how many positions of each key wait behind its
// head, kept by the scripts that hand positions out and move a cursor, in
// the same step, so that it is exact and costs a reader the same whatever
// the number of keys. It is two keys outside every key's hash tag, so only
// a key space on one Redis (or a Sentinel's master) keeps it: on a Cluster
// a script touches one slot.
//
//	<prefix>backlog      a sorted set: each sequence's Redis key ([Sequencer.SeqKey])
//	                     scored by its positions waiting behind its head (n - d - 1),
//	                     without the sequences that have none
//	<prefix>backlog:sum  the sum of its scores

func (q *Sequencer) backlogKey() string    { return q.prefix + "backlog" }
func (q *Sequencer) backlogSumKey() string { return q.backlogKey() + ":sum" }

// backlogKeys returns the two keys of the index of backlogs to name among
// a script's KEYS beside the sequence seqKey: seqKey twice, which the
// scripts read as no index, when the key space keeps none.
func (q *Sequencer) backlogKeys(seqKey string) []string {
	if !q.counted {
		return []string{seqKey, seqKey}
	}
	return []string{q.backlogKey(), q.backlogSumKey()}
}

// withBacklog returns seqKey followed by [Sequencer.backlogKeys].
func (q *Sequencer) withBacklog(seqKey string) []string {
	return append([]string{seqKey}, q.backlogKeys(seqKey)...)
}

// ErrNoBacklog is returned by [Sequencer.Backlog] for a key space that
// keeps no index of backlogs: one on a Cluster.
var ErrNoBacklog = errors.New("keyorder: no index of backlogs on a Cluster")

// Backlog is what waits behind the keys' heads, as [Sequencer.Backlog]
// reads it.
type Backlog struct {
	// Keys is how many keys have positions waiting behind their head.
	Keys int64
	// Positions is how many positions wait behind the heads, all keys
	// together: for a [Client]'s tasks, the tasks parked until their turn
	// (and the rare positions voided or finished ahead, not yet passed).
	Positions int64
	// Deepest is the most positions waiting behind one key's head (0 when
	// none).
	Deepest int64
}

// Backlog reads what waits behind the keys' heads from the index that the
// scripts keep as they hand positions out and pass turns on: one round
// trip of one read-only script (EVALSHA_RO) of three commands, O(log n) in
// the keys with a backlog, whatever their number. The index counts what
// was handed out and passed through the engine's scripts: a sequence that
// vanished with positions waiting (it expired after its retention, or was
// deleted by hand) stays counted until its key's next reservation. A
// reader distrusts it as it distrusts every key the producers' Redis user
// may write: negative counts read as 0. It returns [ErrNoBacklog] on a
// Cluster, and Redis errors, wrapped. It is safe for concurrent use.
func (q *Sequencer) Backlog(ctx context.Context) (Backlog, error) {
	if !q.counted {
		return Backlog{}, ErrNoBacklog
	}
	res, err := backlogScript.RunRO(ctx, q.rdb, []string{q.backlogKey(), q.backlogSumKey()}).Slice()
	if err != nil {
		return Backlog{}, fmt.Errorf("backlog: %w", err)
	}
	if len(res) != 3 {
		return Backlog{}, fmt.Errorf("backlog: reply of %d values, want 3", len(res))
	}
	var b Backlog
	b.Keys, _ = res[0].(int64)
	if s, ok := res[1].(string); ok {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return Backlog{}, fmt.Errorf("backlog: deepest %q: %w", s, err)
		}
		b.Deepest = int64(f)
	}
	if s, ok := res[2].(string); ok {
		if b.Positions, err = strconv.ParseInt(s, 10, 64); err != nil {
			return Backlog{}, fmt.Errorf("backlog: sum %q: %w", s, err)
		}
	}
	b.Keys, b.Positions, b.Deepest = max(b.Keys, 0), max(b.Positions, 0), max(b.Deepest, 0)
	return b, nil
}

// backlogScript reads the index of backlogs.
//
// KEYS[1] the index, KEYS[2] its sum
//
// Returns {keys, deepest score or false, sum or false}.
var backlogScript = redis.NewScript(`
local top = redis.call('ZRANGE', KEYS[1], 0, 0, 'REV', 'WITHSCORES')
return {redis.call('ZCARD', KEYS[1]), top[2] or false, redis.call('GET', KEYS[2]) or false}
`)
