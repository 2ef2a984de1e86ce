package keyorder

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A key's sequence can be paused: its positions are still handed out
// (changes are still accepted), but the holder of the head does not take
// its turn; it parks ([TurnError].Paused) until [Sequencer.Resume] calls it
// back: an operator's hold of a key.
//
// The pause is the field h of the sequence's hash, read by the acquire
// script in the HMGET that reads the position anyway: it costs the workers
// no command. It is the truth. Beside it, a sorted set of the paused keys
// (PausedKey, scored by the pause's time) lets a reader list them without
// scanning; on a Cluster that set is in another slot than the sequences,
// so it is written by a command of its own after the pause's script, and
// is best effort: a failure between the two leaves it behind (Pause and
// Resume then return an error matching [ErrPauseIndex]), and a reader of
// the set checks each key's sequence ([Status].Paused).

// ErrPaused is returned by [Sequencer.Pause] for a sequence paused already;
// its message says since when, by whom and why.
var ErrPaused = errors.New("keyorder: sequence is paused already")

// ErrNotPaused is returned by [Sequencer.Resume] for a sequence that is not
// paused.
var ErrNotPaused = errors.New("keyorder: sequence is not paused")

// ErrPauseIndex is matched by the error Pause and Resume return when the
// pause itself was set or ended but the index of paused keys (PausedKey)
// could not be updated: the pause holds, and the index is stale for that
// key until the next pause or resume of it.
var ErrPauseIndex = errors.New("keyorder: the index of paused keys was not updated")

// Pause is a paused sequence's pause: who paused it, why, and when (Redis
// clock).
//
// A halt is a pause too (see [FailureHalt]): By is "keyorder", Reason the
// last error of the head's task, and Halted the head's label.
type Pause struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	// Halted is, for a halt, the label of the head position whose task
	// failed past its budget; "" for an operator's hold.
	Halted string `json:"halted,omitempty"`
}

// pausedError is a [Sequencer.Pause] of a sequence already paused. It
// matches [ErrPaused].
type pausedError struct {
	Key   string
	Pause Pause
}

func (e *pausedError) Error() string {
	return fmt.Sprintf("keyorder: %s is on hold already, since %s by %s: %s", e.Key, e.Pause.At.Format(time.RFC3339), e.Pause.By, e.Pause.Reason)
}

// Is reports whether target is ErrPaused.
func (e *pausedError) Is(target error) bool { return target == ErrPaused }

// parsePause reads the field h: {"by", "reason", "at" (ms, decimal)}.
func parsePause(h string) (Pause, error) {
	var raw struct{ By, Reason, At, Halted string }
	if err := json.Unmarshal([]byte(h), &raw); err != nil {
		return Pause{}, fmt.Errorf("sequence: bad pause %q: %w", h, err)
	}
	ms, err := strconv.ParseInt(raw.At, 10, 64)
	if err != nil {
		return Pause{}, fmt.Errorf("sequence: bad pause time %q", raw.At)
	}
	return Pause{By: raw.By, Reason: raw.Reason, At: time.UnixMilli(ms).UTC(), Halted: raw.Halted}, nil
}

// halt halts key at its head pos, reserved under label, for why (see
// haltScript), and lists it in the index of paused keys (best effort, as
// for Pause). It reports whether it halted the key: false when pos is
// not the head any more, or the key is paused already. It returns Redis
// errors, wrapped.
func (q *Sequencer) halt(ctx context.Context, key string, pos int64, label, why string) (bool, error) {
	n, err := haltScript.Run(ctx, q.rdb, []string{q.SeqKey(key)}, pos, label, clip(why)).Int()
	if err != nil {
		return false, fmt.Errorf("halt %s: %w", key, err)
	}
	if n == 1 {
		_ = q.indexHalt(ctx, key) // best effort: the sequence is the truth
	}
	return n == 1, nil
}

// indexHalt lists a halted key in the index of paused keys, unless it is
// listed already; a failure is returned, wrapped, and leaves the key found
// by the blocked read only through the tasks parked behind its head.
func (q *Sequencer) indexHalt(ctx context.Context, key string) error {
	err := q.rdb.ZAddNX(ctx, q.PausedKey(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: key}).Err()
	if err != nil {
		return fmt.Errorf("halt %s: %w: %w", key, ErrPauseIndex, err)
	}
	return nil
}

// PausedKey returns the Redis key of the index of paused keys: a sorted set
// of key names, scored by the pause's time in ms. It has no hash tag: it
// is one key for all.
func (q *Sequencer) PausedKey() string { return q.prefix + "held" }

// Pause pauses key's sequence on behalf of by (who, for people), for
// reason: the holder of the head parks instead of taking its turn, until
// Resume; positions are still handed out. The head's holder that runs
// already finishes its work. A sequence that does not exist is made paused;
// a paused sequence does not expire. It returns the pause, an error matching
// ErrPaused (which says the pause it has) when the sequence was paused already, an error matching
// ErrPauseIndex when only the index failed (see the type's comment), and
// Redis errors, wrapped. It refuses a by or a reason longer than
// maxReasonLen or with control or format characters. It costs two round
// trips.
func (q *Sequencer) Pause(ctx context.Context, key, by, reason string) (Pause, error) {
	if err := checkKey(key, ""); err != nil {
		return Pause{}, err
	}
	if err := cmp.Or(checkReason("who holds", by), checkReason("the reason", reason)); err != nil {
		return Pause{}, err
	}
	res, err := pauseScript.Run(ctx, q.rdb, []string{q.SeqKey(key)}, by, reason).Slice()
	if err != nil {
		return Pause{}, fmt.Errorf("pause %s: %w", key, err)
	}
	done, _ := res[0].(int64)
	h, _ := res[1].(string)
	p, err := parsePause(h)
	if err != nil {
		return Pause{}, err
	}
	if done != 1 {
		return Pause{}, &pausedError{Key: key, Pause: p}
	}
	if err := q.rdb.ZAdd(ctx, q.PausedKey(), redis.Z{Score: float64(p.At.UnixMilli()), Member: key}).Err(); err != nil {
		return p, fmt.Errorf("pause %s: %w: %w", key, ErrPauseIndex, err)
	}
	return p, nil
}

// Resume ends the pause of key's sequence: the sequence expires again
// after the retention, and the parked holder of the head is called back
// (Settlement.Wake, for the caller to bring it back, as after a release).
// It returns the pause it ended, [ErrNotPaused] when there was none, an
// error matching ErrPauseIndex when only the index failed, and Redis
// errors, wrapped. It costs two round trips.
func (q *Sequencer) Resume(ctx context.Context, key string) (Pause, settlement, error) {
	if err := checkKey(key, ""); err != nil {
		return Pause{}, settlement{}, err
	}
	res, err := resumeScript.Run(ctx, q.rdb, []string{q.SeqKey(key), q.lockKey(key)}, q.channel, q.retention.Milliseconds()).Slice()
	if err != nil {
		return Pause{}, settlement{}, fmt.Errorf("resume %s: %w", key, err)
	}
	done, _ := res[0].(int64)
	if done != 1 {
		// Not paused: the index may still list it (a failed index write).
		_ = q.rdb.ZRem(ctx, q.PausedKey(), key).Err()
		return Pause{}, settlement{}, fmt.Errorf("resume %s: %w", key, ErrNotPaused)
	}
	h, _ := res[1].(string)
	wake, _ := res[2].(string)
	p, err := parsePause(h)
	if err != nil {
		return Pause{}, settlement{}, err
	}
	st := settlement{Done: true, Wake: splitWake(wake)}
	if err := q.rdb.ZRem(ctx, q.PausedKey(), key).Err(); err != nil {
		return p, st, fmt.Errorf("resume %s: %w: %w", key, ErrPauseIndex, err)
	}
	return p, st, nil
}

// pausedSince is an entry of the index of paused keys.
type pausedSince struct {
	Key   string
	Since time.Time
}

// pausedKeys reads the index of paused keys, oldest pause first: at most
// limit entries from offset. The index is best effort (see [Pause]): read
// each key's [Status].Paused for the truth. It costs one round trip and
// returns Redis errors, wrapped.
func (q *Sequencer) pausedKeys(ctx context.Context, offset, limit int64) ([]pausedSince, error) {
	if offset < 0 || limit <= 0 {
		return nil, fmt.Errorf("keyorder: paused keys from %d, %d of them", offset, limit)
	}
	zs, err := q.rdb.ZRangeWithScores(ctx, q.PausedKey(), offset, offset+limit-1).Result()
	if err != nil {
		return nil, fmt.Errorf("paused keys: %w", err)
	}
	out := make([]pausedSince, 0, len(zs))
	for _, z := range zs {
		key, _ := z.Member.(string)
		out = append(out, pausedSince{Key: key, Since: time.UnixMilli(int64(z.Score)).UTC()})
	}
	return out, nil
}
