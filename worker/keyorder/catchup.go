package keyorder

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The store that outlives a failover is the authority on what was applied.
//
// A Redis failover can lose the writes that had not reached the replica it
// promotes: the newest positions a key's sequence handed out, and the
// newest fence. The new master then hands them out again. A store that
// lives on another system (an order API behind HTTP) kept what it applied
// with them, so it refuses a fresh holder's fence as stale and a fresh
// position as passed, although both are new: the changes would be archived
// as rejected, or wait until the new master's clock passed the old fences.
//
// So a store that refuses a write tells what it has seen ([StoreAhead]),
// and the holder moves the key above it (lease.CatchUp) and writes
// again, in the same hold: its fence above the store's newest, and its
// key's positions, by an offset kept in the sequence, above the store's
// newest applied position. A store on the lock's own Redis fails over
// together with the sequence and never runs ahead of it.

// maxAhead is how far ahead of Redis's clock a store's newest fence may
// be for lease.CatchUp to take it: a day, in microseconds (fences are
// Redis TIME in microseconds, see lease.Fence). A promoted replica's
// clock is behind its old master's by its skew; a fence further ahead is
// no fence this engine handed out, and is not followed.
const maxAhead = int64(24 * 3600 * 1_000_000)

// maxOffset bounds the offset of a key's positions (see lease.Seq): an
// offset above it would take positions past what Lua's doubles hold
// exactly.
const maxOffset = int64(1) << 50

// StoreAhead is the error a store returns, wrapped with its refusal (a
// stale fence, a position already passed), to say what it has seen for
// the key that the lease's Redis may have lost in a failover: Fence, its
// newest fence, when it refused the write's fence as stale; Pos, the
// newest position applied, when it refused the write's position as
// passed. Zero means not known. A [Runner] (and lease.CatchUp's other
// callers) moves the key above it and runs the task again in the same
// hold.
type StoreAhead struct {
	Fence int64
	Pos   int64
}

func (e *StoreAhead) Error() string {
	switch {
	case e.Fence > 0 && e.Pos > 0:
		return fmt.Sprintf("keyorder: the store has seen fence %d and position %d", e.Fence, e.Pos)
	case e.Pos > 0:
		return fmt.Sprintf("keyorder: the store has applied position %d", e.Pos)
	}
	return fmt.Sprintf("keyorder: the store has seen fence %d", e.Fence)
}

// WithAhead returns err, with the same text, carrying a: [AheadOf] finds
// a in it, and errors.Is and errors.As match err's chain as before. It
// returns err when a holds nothing (both zero).
func WithAhead(err error, a StoreAhead) error {
	if err == nil || (a.Fence <= 0 && a.Pos <= 0) {
		return err
	}
	return &aheadError{err: err, ahead: &a}
}

type aheadError struct {
	err   error
	ahead *StoreAhead
}

func (e *aheadError) Error() string   { return e.err.Error() }
func (e *aheadError) Unwrap() []error { return []error{e.err, e.ahead} }

// AheadOf returns the [*StoreAhead] in err's chain, or nil.
func AheadOf(err error) *StoreAhead {
	var a *StoreAhead
	if errors.As(err, &a) && (a.Fence > 0 || a.Pos > 0) {
		return a
	}
	return nil
}

// catchUpScript moves a key above what its store has seen.
//
// KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] (optional) sequence
// ARGV[1] owner token, ARGV[2] the store's newest fence ("0" for none),
// ARGV[3] fence retention in ms, ARGV[4] maxAhead in µs; with KEYS[3]:
// ARGV[5] the lease's position, ARGV[6] the store's newest applied position
// ("0" for none), ARGV[7] maxOffset
//
// The fence counter is raised to the store's fence whoever holds the lock:
// a higher counter only makes later fences higher. When the caller still
// holds the lock and its fence is not above the store's, its fence becomes
// max(counter + 1, store's + 1, TIME in µs), in the lock and the counter.
// When the caller holds the lock in its position's turn (the position is
// the sequence's next) and the position plus the sequence's offset (field
// o) is not above the store's newest, the offset becomes what puts it just
// above.
//
// Returns {held, fence, offset}: held is 1 when the caller holds the lock,
// fence its fence then ("0" when not held), offset the sequence's offset
// ("0" for none); or {-1, why} when the store's values are out of bounds.
var catchUpScript = redis.NewScript(numLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local sf = tonumber(ARGV[2])
if sf > now + tonumber(ARGV[4]) then
  return {-1, 'fence ' .. ARGV[2] .. ' is further ahead of this Redis clock than any fence it hands out'}
end
local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if sf > prev then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  prev = sf
end
local lock = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if lock[1] ~= ARGV[1] then return {0, '0', '0'} end
local fence = tonumber(lock[2])
if sf > 0 and fence <= sf then
  fence = math.max(prev + 1, sf + 1, now)
  redis.call('HSET', KEYS[1], 'fence', num(fence))
  redis.call('SET', KEYS[2], num(fence), 'PX', ARGV[3])
end
local o = 0
if KEYS[3] then
  local st = redis.call('HMGET', KEYS[3], 'd', 'o')
  local d = tonumber(st[1])
  o = tonumber(st[2]) or 0
  local pos, sp = tonumber(ARGV[5]), tonumber(ARGV[6])
  if d and pos == d + 1 and sp > 0 and pos + o <= sp then
    if sp - pos + 1 > tonumber(ARGV[7]) then
      return {-1, 'position ' .. ARGV[6] .. ' is too far after ' .. ARGV[5]}
    end
    o = sp - pos + 1
    redis.call('HSET', KEYS[3], 'o', num(o))
  end
end
return {1, num(fence), num(o)}
`)

// CatchUp moves the lease's key above what its store has seen (see
// [StoreAhead]), so that the write the store refused can be sent again at
// once: it raises the key's fence counter to a.Fence, and, while the lease
// holds the lock, gives it a fence above a.Fence; in the lease's turn
// (ModeTurn) it raises the offset of the key's positions so that
// lease.Seq is above a.Pos. It reports whether the lease's write can go
// again: its fence or its position moved. It costs one round trip.
//
// It refuses (with an error) a fence more than maxAhead ahead of Redis's
// clock, and a position more than 2^50 after the lease's: no failover
// makes those, only a store that answers wrongly.
func (s *lease) CatchUp(ctx context.Context, a StoreAhead) (moved bool, err error) {
	if a.Fence < 0 || a.Pos < 0 {
		return false, fmt.Errorf("keyorder: catch %s up: negative %+v", s.key, a)
	}
	keys := []string{s.l.lockKey(s.key), s.l.fenceKey(s.key)}
	args := []any{s.owner, a.Fence, s.l.cfg.FenceRetention.Milliseconds(), maxAhead}
	turn := s.Turn()
	if s.mode == ModeTurn && turn.Pos > 0 {
		keys = append(keys, s.l.seq.SeqKey(s.key))
		args = append(args, turn.Pos, a.Pos, maxOffset)
	}
	res, err := catchUpScript.Run(ctx, s.l.rdb, keys, args...).Slice()
	if err != nil {
		return false, fmt.Errorf("keyorder: catch %s up: %w", s.key, err)
	}
	code, _ := res[0].(int64)
	switch {
	case code == -1 && len(res) == 2:
		why, _ := res[1].(string)
		return false, fmt.Errorf("keyorder: catch %s up: the store's %s", s.key, why)
	case code == 0:
		return false, nil
	case code != 1 || len(res) != 3:
		return false, fmt.Errorf("keyorder: catch %s up: unexpected reply %v", s.key, res)
	}
	fence, err := parseFence(res[1])
	if err != nil {
		return false, fmt.Errorf("keyorder: catch %s up: %w", s.key, err)
	}
	fs, _ := res[2].(string)
	offset, err := strconv.ParseInt(fs, 10, 64)
	if err != nil || offset < 0 {
		return false, fmt.Errorf("keyorder: catch %s up: bad offset %q", s.key, fs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	moved = fence != s.fence.Load() || offset != s.offset
	s.fence.Store(fence)
	s.offset = offset
	return moved, nil
}

// maxCatchUps bounds how often one write is caught up with its store and
// sent again (lease.WriteCaughtUp): once for the position and once for
// the fence is all a failover needs.
const maxCatchUps = 2

// WriteCaughtUp runs write, the lease's write to its store, and when the
// store refuses it with what it has seen that the key's Redis lost in a
// failover ([StoreAhead]), moves the key above it (lease.CatchUp) and
// runs write again at once, at most twice more: write reads the lease's
// lease.Fence and lease.Seq each time. A catch-up that fails is passed
// to onError (nil: ignored) and ends the loop. It returns write's last
// error. The [Runner] writes this way; a program that wraps its handlers
// itself calls it around its store write.
func (s *lease) WriteCaughtUp(ctx context.Context, write func() error, onError func(a StoreAhead, err error)) error {
	write = s.confirmed(ctx, write)
	err := write()
	for range maxCatchUps {
		a := AheadOf(err)
		if a == nil || ctx.Err() != nil {
			break
		}
		moved, cerr := s.CatchUp(ctx, *a)
		if cerr != nil && onError != nil {
			onError(*a, cerr)
		}
		if !moved {
			break
		}
		err = write()
	}
	return err
}

// Seq returns the position to give the store with the lease's write: the
// lease's position plus its key's offset, which is 0 until a store showed
// that it had applied positions that the key's Redis lost in a failover
// (lease.CatchUp). It grows only, so the positions a store records stay
// in the order the key's tasks were enqueued. It is 0 for a lease without
// a position.
func (s *lease) Seq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.turn.Pos == 0 {
		return 0
	}
	return s.turn.Pos + s.offset
}

// confirmed returns write run only once the replicas confirmed the
// lease's key (lease.replicated): write itself when
// lockConfig.WaitReplicas is 0.
func (s *lease) confirmed(ctx context.Context, write func() error) func() error {
	if s.l.cfg.WaitReplicas == 0 {
		return write
	}
	return func() error {
		if err := s.replicated(ctx); err != nil {
			return err
		}
		return write()
	}
}
