// Package redisstore is the order store on Redis: the embedded default
// backend of orderworker and the verification oracle that the other
// backends are tested against. It implements orders.Store, the write of
// every kind of tasks.Kinds (each declared once beside its write: see
// writeKind) and orders.Annotator (the notes of the operator actions); the
// model, the errors and the checks are package orders'.
//
// On the Redis that also holds the per-order lock (worker/keyorder), it can
// save a round trip per task: given the engine's commit hook with the write
// (orders.Write.Commit), it refuses a fence older than the lock's newest
// and releases the lock, and passes the order's turn on, in the script that
// commits a modify. That hook is the only tie between this store and the
// lock, and the [keyorder.Commit] interface names it.
package redisstore

import (
	"cmp"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/redis/go-redis/v9"
)

// The defaults of [Config].
const (
	// DefaultDedupeRetention is the default of Config.DedupeRetention.
	DefaultDedupeRetention = 7 * 24 * time.Hour
	// DefaultHistoryMax is the default of Config.HistoryMax.
	DefaultHistoryMax = 1000
	// DefaultNotesMax is the default of Config.NotesMax.
	DefaultNotesMax = 100
)

// Config tunes a [Store]. The zero value is ready to use.
type Config struct {
	// Prefix is put before every key the store makes, so that several
	// deployments or tests can share one Redis. It must not contain "{" or
	// "}", which would break the hash tags. Defaults to "ow:".
	Prefix string

	// ClaimTTL is how long an exchange reserves the replacement's order
	// number between checking that it is free and creating the order. The
	// claim is normally released within milliseconds; the TTL only matters
	// when a worker dies mid-exchange, and then bounds how long the number
	// stays reserved for that exchange's retries against other exchanges.
	// Defaults to 24 hours.
	ClaimTTL time.Duration

	// DedupeRetention is how long the store remembers an applied event, to
	// answer a repeat with its outcome instead of applying it again: a
	// record is kept at least this long, and at most twice as long (records
	// live in buckets of this width). At least one second. Defaults to 7
	// days, the producers' DedupeWindow.
	//
	// Past it, a repeat of an event with a position ([Write.Seq]) is still
	// never applied: the order keeps the newest position applied to it and
	// refuses any position not after it with orders.ErrPassed. Only a repeat
	// without a position (a task enqueued by hand, bypassing the producer)
	// is applied again.
	DedupeRetention time.Duration

	// HistoryMax is how many history entries an order keeps: each write
	// past it drops the oldest. Defaults to 1000.
	HistoryMax int

	// HistoryMaxAge, when not zero, also drops the entries older than this,
	// oldest first, two at most on each write to the order. Defaults to 0:
	// no age limit.
	HistoryMaxAge time.Duration

	// NotesMax is how many notes ([Store.Annotate]) an order keeps, apart
	// from its writes: each note past it drops the oldest note, never a
	// write, so that however many notes come, the history keeps every
	// write HistoryMax allows. Defaults to 100.
	NotesMax int
}

// Store is the [orders.Store] backed by Redis. It works on a single server and
// on Redis Cluster: every script touches the keys of one order only, which
// share a hash tag. It needs Redis 5 or newer (scripts read TIME before they
// write).
//
// Key layout, for order SO1 and the default prefix:
//
//	ow:order:{SO1}          hash: order_no, status, address, remark,
//	                        items (JSON), version, exchanged_to,
//	                        exchanged_from, updated_at (µs since the epoch)
//	                        and fence (the newest fence seen, decimal)
//	ow:order:{SO1}:history  list of history entries, oldest first, at most
//	                        HistoryMax (see encodeEntry for their form)
//	ow:order:{SO1}:notes    list of the order's notes (Annotate), oldest
//	                        first, at most NotesMax, in the entries' form;
//	                        a note's version is the order's when it was
//	                        written. The only key of an order that the
//	                        operators' Redis users may write (see
//	                        internal/acl): the hash and the history are
//	                        the workers'
//	ow:order:{SO1}:ev:<k>   hash: the events applied in bucket k of width
//	                        DedupeRetention (k = Unix ms / width): the first
//	                        8 bytes of SHA-1 of the event ID (raw) -> its
//	                        record ("<letter> <fp>", or for a write that
//	                        carries them, as an exchange's close,
//	                        "x <fp> <replacement> <fence>", where letter is
//	                        the write's (see writeKind) and fp the
//	                        request's fingerprint); it expires two widths
//	                        after the bucket began
//	ow:order:{SO1}:claim    string "FROM\nEVENT" with a TTL while an exchange
//	                        of order FROM by EVENT is creating SO1
//
// Memory is bounded: an order keeps at most HistoryMax entries and
// NotesMax notes, and an
// event's record lasts between one and two DedupeRetention. A
// [Store.Put] keeps the fence and the recorded events of the order it
// replaces.
//
// A Store is safe for concurrent use, by goroutines and by processes:
// each write is one atomic script. It does not own the client, and has no
// Close.
type Store struct {
	rdb       redis.UniversalClient
	prefix    string
	claimTTL  time.Duration
	retention time.Duration
	histMax   int
	histAge   time.Duration
	notesMax  int
	now       func() time.Time
}

var (
	_ orders.Store     = (*Store)(nil)
	_ orders.Annotator = (*Store)(nil)
)

// New returns a store that keeps orders in rdb. It returns an error
// when rdb is nil or cfg is invalid.
func New(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("redisstore: nil redis client")
	}
	s := &Store{
		rdb:       rdb,
		prefix:    cmp.Or(cfg.Prefix, orderkeys.DefaultPrefix),
		claimTTL:  cmp.Or(cfg.ClaimTTL, 24*time.Hour),
		retention: cmp.Or(cfg.DedupeRetention, DefaultDedupeRetention),
		histMax:   cmp.Or(cfg.HistoryMax, DefaultHistoryMax),
		histAge:   cfg.HistoryMaxAge,
		notesMax:  cmp.Or(cfg.NotesMax, DefaultNotesMax),
		now:       time.Now,
	}
	switch {
	case strings.ContainsAny(s.prefix, "{}"):
		return nil, fmt.Errorf("redisstore: prefix %q contains a brace", s.prefix)
	case s.claimTTL < time.Millisecond:
		return nil, fmt.Errorf("redisstore: claim TTL %v is below 1ms", s.claimTTL)
	case s.retention < time.Second:
		return nil, fmt.Errorf("redisstore: dedupe retention %v is below 1s", s.retention)
	case s.histMax < 1:
		return nil, fmt.Errorf("redisstore: history max %d is below 1", s.histMax)
	case s.histAge < 0:
		return nil, fmt.Errorf("redisstore: negative history max age %v", s.histAge)
	case s.notesMax < 1:
		return nil, fmt.Errorf("redisstore: notes max %d is below 1", s.notesMax)
	}
	return s, nil
}

// orderKey is the hash that holds order no.
func (s *Store) orderKey(no string) string { return s.prefix + "order:{" + no + "}" }

// historyKey is the list of order no's history entries.
func (s *Store) historyKey(no string) string { return s.orderKey(no) + ":history" }

// notesKey is the list of order no's notes.
func (s *Store) notesKey(no string) string { return s.orderKey(no) + ":notes" }

// claimKey reserves order number no for the exchange that will create it.
func (s *Store) claimKey(no string) string { return s.orderKey(no) + ":claim" }

// eventKeys returns the keys of the event buckets that may hold a record of
// order no now: the current bucket, the one before it and the one after it
// (a writer whose clock runs ahead), the current one first, and the bucket's
// expiry (Unix ms) for a record written now.
func (s *Store) eventKeys(no string) ([3]string, int64) {
	w := s.retention.Milliseconds()
	k := s.now().UnixMilli() / w
	base := s.orderKey(no) + ":ev:"
	return [3]string{base + strconv.FormatInt(k, 10), base + strconv.FormatInt(k-1, 10), base + strconv.FormatInt(k+1, 10)},
		(k + 2) * w
}

// luaLib holds the helpers the write scripts share. Values they store are
// strings, so Lua never has to format a large number as a float.
const luaLib = `
-- now returns Redis TIME in microseconds since the epoch, as decimal.
local function now()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- older reports whether fence a is less than fence b. Both are decimal
-- positive int64s without leading zeros; they are compared exactly, in
-- pieces small enough for Lua's doubles.
local function older(a, b)
  if #a ~= #b then return #a < #b end
  if #a <= 15 then return tonumber(a) < tonumber(b) end
  local ha, hb = tonumber(string.sub(a, 1, 9)), tonumber(string.sub(b, 1, 9))
  if ha ~= hb then return ha < hb end
  return tonumber(string.sub(a, 10)) < tonumber(string.sub(b, 10))
end

-- fields splits a history entry at its separators (byte 31).
local function fields(s)
  local f, i = {}, 1
  while true do
    local j = string.find(s, '\31', i, true)
    if not j then
      f[#f + 1] = string.sub(s, i)
      return f
    end
    f[#f + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end

-- entry_at returns what field n of a history entry holds (7 the end, 8 the
-- version), for entries of every form (see decodeEntry).
local function entry_at(e, n)
  local c = string.sub(e, 1, 1)
  if c == '{' then
    local j = cjson.decode(e)
    if n == 7 then return tonumber(j.ended_at) end
    return tonumber(j.version)
  end
  local v = fields(e)[n]
  if c == '3' then return tonumber(v, 36) end
  return tonumber(v)
end

-- b36 writes a non-negative integer below 2^53 in base 36.
local b36digits = '0123456789abcdefghijklmnopqrstuvwxyz'
local function b36(n)
  if n == 0 then return '0' end
  local s = ''
  while n > 0 do
    local d = n % 36
    s = string.sub(b36digits, d + 1, d + 1) .. s
    n = (n - d) / 36
  end
  return s
end

-- sb36 writes an integer (below 2^53 in size) in base 36, with a '-' when
-- negative.
local function sb36(n)
  if n < 0 then return '-' .. b36(-n) end
  return b36(n)
end

-- append adds a history entry to list key (see decodeEntry), and drops the
-- oldest entries past max (the count) and, when maxAge (µs) is not 0, up
-- to two older than that.
local function append(key, typ, event, fence, worker, started, ended, version, seq, detail, max, maxAge)
  if started == '' then started = ended end
  local e = tonumber(ended)
  local sq = ''
  if seq ~= '' then sq = b36(tonumber(seq)) end
  local n = redis.call('RPUSH', key, table.concat({'3', typ, event, sb36(e - tonumber(fence)), worker,
    sb36(e - tonumber(started)), b36(e), b36(tonumber(version)), sq, detail}, '\31'))
  if n > tonumber(max) then redis.call('LTRIM', key, -tonumber(max), -1) end
  if maxAge ~= '0' then
    local cutoff = e - tonumber(maxAge)
    for _ = 1, 2 do
      local first = redis.call('LINDEX', key, 0)
      if not first then break end
      local at = entry_at(first, 7)
      if not at or at >= cutoff or redis.call('LLEN', key) <= 1 then break end
      redis.call('LPOP', key)
    end
  end
end

-- ev_get returns the record of event hash h in the event buckets b1..b3,
-- or nil.
local function ev_get(b1, b2, b3, h)
  return redis.call('HGET', b1, h) or redis.call('HGET', b2, h) or redis.call('HGET', b3, h)
end

-- ev_put records event hash h in bucket b, which expires at Unix ms exp.
local function ev_put(b, h, rec, exp)
  redis.call('HSET', b, h, rec)
  redis.call('PEXPIREAT', b, exp)
end

-- wrong_type returns an error reply when key exists and is not of type
-- typ, else nil. A script checks, before its first write, each key it
-- writes that it has not read yet: Redis does not roll a script back, so a
-- command that fails on a wrongly typed key after a write would leave the
-- write half done.
local function wrong_type(key, typ)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' or t == typ then return nil end
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. t .. ', not a ' .. typ .. '; nothing was written')
end

-- order_fields returns the order hash at key, as a flat list.
local function order_fields(key)
  return redis.call('HGETALL', key)
end
`

// applyScript applies one fenced event to an existing, active order: the
// write of a kind (a modify, the first half of an exchange: closing the
// order), as its declaration (writeKind) says. When it is
// given the order lock's hash, it also releases the lock (owner-checked,
// with keyorder.CommitLua) before it returns, whatever the outcome: the
// caller's work ends with this write. Given the order's sequence too, it
// passes the caller's turn on unless the write was refused as stale (a
// missing order, a closed one, a replay and an applied change all end the
// turn's work).
//
// KEYS[1] order hash, KEYS[2] history list, KEYS[3..5] event buckets (the
// current one first), KEYS[6] (optional) the order lock's newest handed-out
// fence, KEYS[7] (optional, with KEYS[6]) the order lock's hash, KEYS[8]
// (optional, with KEYS[7]) the order's sequence, KEYS[9] and KEYS[10]
// (optional, with KEYS[8]) the engine's index of backlogs and its sum
// (keyorder.Handoff.Backlog, BacklogSum)
// ARGV[1] event hash, ARGV[2] fence (decimal), ARGV[3] worker,
// ARGV[4] started_at (µs, or "" for now), ARGV[5] the event's record,
// ARGV[6] history detail, ARGV[7] entry type (the write's letter, see
// writeKind), ARGV[8] the change's position, or "", ARGV[9] lock owner,
// ARGV[10] lock notice channel, ARGV[11] the turn's position, ARGV[12] "1" to return the order's
// fields, ARGV[13] the current bucket's expiry (Unix ms), ARGV[14] history
// max, ARGV[15] history max age (µs, "0" for none), ARGV[16] the event ID,
// ARGV[17] "1" to record the position (ARGV[8]) as the order's newest and
// in the history, "0" to only check it (a change run out of its turn:
// orders.Write.SeqOutOfTurn), ARGV[18] "1" to keep the lock for a parked
// next holder when the change is applied (keyorder.Handoff.Keep, lock_commit's
// keep), ARGV[19...] field, value pairs to set on the order.
//
// Before its first write it checks the type of every key it writes, so
// that a wrongly typed key fails the script with nothing written (a WRONGTYPE
// error reply): Redis does not roll a script back.
//
// The lock's newest fence (KEYS[6]) is read only when the caller no longer
// holds the lock: a holder's fence is the newest. (The event's record is
// looked up even for a change at a new position: the producer enqueues the
// same change again, at a new position, once asynq has forgotten its task.)
//
// Returns one of the following, followed with KEYS[7] by "1" when it
// released the lock and "0" when the lock was not the caller's, and with
// KEYS[8] by "1" when it passed the turn on and "0" when not, and by the
// labels of the parked holders it called, joined by newlines ("" for none)
//
//	{"notfound"}
//	{"replay", record, fields...}   the event was applied before; no write;
//	                                fields are the order's now (when asked)
//	{"closed", status, exchanged_to}
//	{"passed", newest position}      the position is not after the newest
//	                                applied to the order
//	{"stale", newest fence}          older than the order's or the lock's newest
//	{"ok", record, fields...}       applied: fence stored, version bumped,
//	                                history appended, the record kept
var applyScript = redis.NewScript(luaLib + keyorder.CommitLua + `
local function apply(held)
  local st = redis.call('HMGET', KEYS[1], 'status', 'exchanged_to', 'fence', 'seq', 'version')
  if not st[1] then return {'notfound'} end
  local rec = ev_get(KEYS[3], KEYS[4], KEYS[5], ARGV[1])
  if rec then
    local r = {'replay', rec}
    if ARGV[12] == '1' then for _, v in ipairs(order_fields(KEYS[1])) do r[#r + 1] = v end end
    return r
  end
  local pos, last = tonumber(ARGV[8]), tonumber(st[4])
  if st[1] ~= 'active' then return {'closed', st[1], st[2] or ''} end
  if pos and last and pos <= last then return {'passed', st[4]} end
  if st[3] and older(ARGV[2], st[3]) then return {'stale', st[3]} end
  if KEYS[6] and not (held and held[1] == ARGV[9]) then
    local lf = redis.call('GET', KEYS[6])
    if lf and older(ARGV[2], lf) then return {'stale', lf} end
  end
  local v = num((tonumber(st[5]) or 0) + 1)
  local t = now()
  local hseq = ''
  if pos and ARGV[17] == '1' then
    hseq = ARGV[8]
    redis.call('HSET', KEYS[1], 'version', v, 'fence', ARGV[2], 'updated_at', t, 'seq', ARGV[8], unpack(ARGV, 19))
  else
    redis.call('HSET', KEYS[1], 'version', v, 'fence', ARGV[2], 'updated_at', t, unpack(ARGV, 19))
  end
  append(KEYS[2], ARGV[7], ARGV[16], ARGV[2], ARGV[3], ARGV[4], t, v, hseq, ARGV[6], ARGV[14], ARGV[15])
  ev_put(KEYS[3], ARGV[1], ARGV[5], ARGV[13])
  local r = {'ok', ARGV[5]}
  if ARGV[12] == '1' then for _, v in ipairs(order_fields(KEYS[1])) do r[#r + 1] = v end end
  return r
end
-- The keys the script writes without reading them first: the history
-- (append), the lock's newest fence (read only when the lock is not the
-- caller's) and the sequence (lock_commit). The order and the event
-- buckets are read before any write, and so is the lock (lock_held).
local bad = wrong_type(KEYS[2], 'list')
if not bad and KEYS[6] then bad = wrong_type(KEYS[6], 'string') end
if not bad and KEYS[8] then bad = wrong_type(KEYS[8], 'hash') end
if bad then return bad end
local held = nil
if KEYS[7] then held = lock_held(KEYS[7]) end
local r = apply(held)
if KEYS[7] then
  local finish = KEYS[8] ~= nil and r[1] ~= 'stale'
  local keep = ARGV[18] == '1' and (r[1] == 'ok' or r[1] == 'replay')
  local released, wake = lock_commit(KEYS[7], ARGV[9], ARGV[10], KEYS[8], tonumber(ARGV[11]), finish, held, keep, KEYS[9], KEYS[10])
  r[#r + 1] = tostring(released)
  if KEYS[8] then
    if finish then r[#r + 1] = '1' else r[#r + 1] = '0' end
    r[#r + 1] = wake
  end
end
return r
`)

// claimScript reserves a replacement's order number for one exchange before
// the exchanged order is closed, so that an exchange whose replacement
// number is taken fails before it changes anything.
//
// KEYS[1] replacement's order hash, KEYS[2..4] its event buckets, KEYS[5]
// its claim key
// ARGV[1] exchanged order's number, ARGV[2] event ID, ARGV[3] claim TTL
// (ms), ARGV[4] the event's hash
//
// Returns {"done"} when the event already created the replacement, {"ok"}
// when the claim is held (new or renewed), {"exists"} when the number is
// taken by another order, {"claimed", "FROM\nEVENT"} when another exchange
// holds the claim.
var claimScript = redis.NewScript(luaLib + `
if ev_get(KEYS[2], KEYS[3], KEYS[4], ARGV[4]) then return {'done'} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local v = ARGV[1] .. '\n' .. ARGV[2]
local c = redis.call('GET', KEYS[5])
if c and c ~= v then return {'claimed', c} end
redis.call('SET', KEYS[5], v, 'PX', ARGV[3])
return {'ok'}
`)

// unclaimScript drops a claim if it is still the caller's.
//
// KEYS[1] claim key
// ARGV[1] "FROM\nEVENT"
//
// Returns 1 when it deleted the claim, 0 otherwise.
var unclaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// createScript is the second half of an exchange: it creates the
// replacement order, once per event.
//
// KEYS[1] replacement's order hash, KEYS[2] its history list, KEYS[3..5]
// its event buckets (the current one first), KEYS[6] its claim key
// ARGV[1] event ID, ARGV[2] fence (that the exchanged order was closed
// under), ARGV[3] worker, ARGV[4] started_at (µs or ""), ARGV[5] the
// event's record, ARGV[6] exchanged order's number, ARGV[7] replacement's
// number, ARGV[8] address, ARGV[9] remark, ARGV[10] items (JSON), ARGV[11]
// the event's hash, ARGV[12] the current bucket's expiry (Unix ms),
// ARGV[13] history max, ARGV[14] history max age (µs, "0" for none)
//
// Returns {"replay", record, fields...} when the event already created it
// (fields: the replacement now), {"exists"} when the number is taken by
// another order, {"claimed", "FROM\nEVENT"} when another exchange holds the
// claim, or {"ok", record, fields...} after creating the order (version 1,
// no fence yet), its first history entry and the record, and dropping the
// claim.
var createScript = redis.NewScript(luaLib + `
local rec = ev_get(KEYS[3], KEYS[4], KEYS[5], ARGV[11])
if rec then
  local r = {'replay', rec}
  for _, v in ipairs(order_fields(KEYS[1])) do r[#r + 1] = v end
  return r
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local c = redis.call('GET', KEYS[6])
if c and c ~= ARGV[6] .. '\n' .. ARGV[1] then return {'claimed', c} end
local bad = wrong_type(KEYS[2], 'list')
if bad then return bad end
local t = now()
redis.call('HSET', KEYS[1], 'order_no', ARGV[7], 'status', 'active',
  'address', ARGV[8], 'remark', ARGV[9], 'items', ARGV[10], 'version', '1',
  'exchanged_to', '', 'exchanged_from', ARGV[6], 'updated_at', t)
append(KEYS[2], 'c', ARGV[1], ARGV[2], ARGV[3], ARGV[4], t, 1, '', ARGV[6], ARGV[13], ARGV[14])
ev_put(KEYS[3], ARGV[11], ARGV[5], ARGV[12])
redis.call('DEL', KEYS[6])
local r = {'ok', ARGV[5]}
for _, v in ipairs(order_fields(KEYS[1])) do r[#r + 1] = v end
return r
`)

// putScript creates or replaces an order, keeping its fence and events.
//
// KEYS[1] order hash, KEYS[2] history list
// ARGV[1] worker, ARGV[2] started_at (µs or ""), ARGV[3] the order's
// status (the entry's detail), ARGV[4] history max, ARGV[5] history max age
// (µs, "0" for none), ARGV[6...] field, value pairs (every field but
// version, updated_at and fence)
//
// Returns the new version.
var putScript = redis.NewScript(luaLib + `
local bad = wrong_type(KEYS[1], 'hash') or wrong_type(KEYS[2], 'list')
if bad then return bad end
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
local t = now()
redis.call('HSET', KEYS[1], 'updated_at', t, unpack(ARGV, 6))
append(KEYS[2], 'p', '', '0', ARGV[1], ARGV[2], t, v, '', ARGV[3], ARGV[4], ARGV[5])
return v
`)

// annotateScript appends a note to an existing order's notes, at the
// order's version: it writes the notes list and nothing else (no field of
// the order, no history entry, no fence, position or event), so that a Redis
// user that may write only the notes (internal/acl) can run it.
//
// KEYS[1] order hash (read), KEYS[2] notes list
// ARGV[1] the principal (the entry's worker), ARGV[2] the note's text (the
// entry's detail), ARGV[3] notes max
//
// Returns 1, or 0 when there is no such order.
var annotateScript = redis.NewScript(luaLib + `
local v = redis.call('HGET', KEYS[1], 'version')
if not v then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  v = '0'
end
append(KEYS[2], 'n', '', '0', ARGV[1], '', now(), tonumber(v) or 0, '', ARGV[2], ARGV[3], '0')
return 1
`)

// historyScript reads a page of an order's history: its writes, and the
// notes that follow them.
//
// KEYS[1] order hash, KEYS[2] history list, KEYS[3] notes list
// ARGV[1] the version after which the page starts (0: the oldest kept),
// ARGV[2] the page's size (in writes)
//
// Returns {} when there is no such order, else {more, count, entries...,
// notes...}: more is "1" when entries follow the page, count the number of
// entries, then the entries and the notes the page takes: those of a
// version after ARGV[1] and, when more is "1", not after the page's last
// entry's, and, on the last page, those whose version does not read. It only reads, and runs with EVALSHA_RO, so that a Redis user
// with read-only access to the keys (%R~) may run it.
var historyScript = redis.NewScript(luaLib + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local after = tonumber(ARGV[1])
local size = tonumber(ARGV[2])
local page = {}
local first = redis.call('LINDEX', KEYS[2], 0)
if first then
  local v0 = entry_at(first, 8)
  local start = 0
  if after >= v0 then start = after - v0 + 1 end
  if start < redis.call('LLEN', KEYS[2]) then page = redis.call('LRANGE', KEYS[2], start, start + size) end
end
local more, upto = '0', nil
if #page > size then
  more = '1'
  page[#page] = nil
  upto = entry_at(page[#page], 8)
end
local r = {more, #page}
for _, e in ipairs(page) do r[#r + 1] = e end
-- The notes list is written by less-trusted users too: a note whose
-- version does not read comes with the last page, and never fails the read.
for _, n in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local ok, v = pcall(entry_at, n, 8)
  if not ok or type(v) ~= 'number' then
    if more == '0' then r[#r + 1] = n end
  elseif v > after and (not upto or v <= upto) then
    r[#r + 1] = n
  end
end
return r
`)

// Get returns the order. It returns orders.ErrNotFound when there is none, and
// orders.ErrInvalid for a malformed order number.
func (s *Store) Get(ctx context.Context, orderNo string) (orders.Order, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.Order{}, fmt.Errorf("get: %w", err)
	}
	f, err := s.rdb.HGetAll(ctx, s.orderKey(orderNo)).Result()
	if err != nil {
		return orders.Order{}, fmt.Errorf("get %s: %w", orderNo, err)
	}
	if len(f) == 0 {
		return orders.Order{}, fmt.Errorf("get %s: %w", orderNo, orders.ErrNotFound)
	}
	o, err := decodeOrder(f)
	if err != nil {
		return orders.Order{}, fmt.Errorf("get %s: %w", orderNo, err)
	}
	return o, nil
}

// History returns a page of the order's history, oldest first: the writes
// after version q.After, at most q.Limit of them, each followed by the
// notes written at its version (a note's version is the order's when it
// was written), and the notes of a version after q.After but before the
// oldest write kept first. So a page holds up to q.Limit writes and
// NotesMax notes. The notes list is the one key of an order that the
// operators' Redis users may write by hand, so each of its elements reads
// as a note (orders.TypeNote, with the principal it carries, no event,
// fence or position), whatever kind or form it claims, and one that does
// not decode comes, on the last page, as a note without principal whose
// detail starts with [UnreadableNote]: it never fails the read. It returns
// orders.ErrNotFound when there is no such order, and orders.ErrInvalid for
// a malformed order number. The page is read in one round trip.
func (s *Store) History(ctx context.Context, orderNo string, q orders.HistoryQuery) (orders.HistoryPage, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.HistoryPage{}, fmt.Errorf("history: %w", err)
	}
	q = q.WithDefaults()
	keys := []string{s.orderKey(orderNo), s.historyKey(orderNo), s.notesKey(orderNo)}
	res, err := historyScript.RunRO(ctx, s.rdb, keys, q.After, q.Limit).Slice()
	if err != nil {
		return orders.HistoryPage{}, fmt.Errorf("history %s: %w", orderNo, err)
	}
	if len(res) == 0 {
		return orders.HistoryPage{}, fmt.Errorf("history %s: %w", orderNo, orders.ErrNotFound)
	}
	var more string
	var count int64
	ok := len(res) >= 2
	if ok {
		more, _ = res[0].(string)
		count, ok = res[1].(int64)
	}
	if !ok || count < 0 || int(count) > len(res)-2 {
		return orders.HistoryPage{}, fmt.Errorf("history %s: unexpected reply", orderNo)
	}
	writes := make([]orders.Entry, 0, count)
	for i, l := range res[2 : 2+count] {
		line, _ := l.(string)
		e, err := decodeEntry(line)
		if err != nil {
			return orders.HistoryPage{}, fmt.Errorf("history %s: entry %d: %w", orderNo, i, err)
		}
		writes = append(writes, e)
	}
	// The notes list is the one key of an order that the operators' Redis
	// users may write by hand: what it holds is input, not the store's own
	// record. Each element is a note, whatever it claims to be, and one that
	// is not a note's readable form is listed as unreadable, after the rest.
	var notes, unreadable []orders.Entry
	for _, l := range res[2+count:] {
		line, _ := l.(string)
		if n, ok := decodeNote(line); ok {
			notes = append(notes, n)
		} else {
			unreadable = append(unreadable, unreadableNote(line))
		}
	}
	page := orders.HistoryPage{Entries: append(merge(writes, notes), unreadable...)}
	if more == "1" && len(writes) > 0 {
		page.Next = writes[len(writes)-1].Version
	}
	return page, nil
}

// merge puts each note after the write of its version, and the notes of a
// version before the first write's first, keeping the order of each list.
func merge(writes, notes []orders.Entry) []orders.Entry {
	if len(notes) == 0 {
		return writes
	}
	out := make([]orders.Entry, 0, len(writes)+len(notes))
	n := 0
	for _, w := range writes {
		for n < len(notes) && notes[n].Version < w.Version {
			out = append(out, notes[n])
			n++
		}
		out = append(out, w)
	}
	return append(out, notes[n:]...)
}

// Put's declaration: its entries' letter and detail. A put records no
// event and runs no applyScript, and putScript writes its letter itself.
var _ = declare(writeKind{typ: orders.TypePut, letter: 'p',
	detail: func(_ orders.Entry, status string) string { return "put: " + status }})

// Put creates or replaces order o.No with o's status (active when empty),
// address, remark, items, exchanged_to and exchanged_from. The version goes
// up by one (to 1 for a new order) and a history entry of type orders.TypePut is
// appended; o.Version and o.UpdatedAt are ignored. Put is not fenced and
// not idempotent, but it keeps the order's newest fence and recorded
// events, so a late lock holder still cannot write and a retried event is
// still a replay. An [orders.Write] in ctx, when present, names the worker in the
// history. It returns orders.ErrInvalid for a malformed order.
func (s *Store) Put(ctx context.Context, o orders.Order) error {
	o.Status = cmp.Or(o.Status, orders.StatusActive)
	if err := orders.CheckPut(o); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	items, err := encodeItems(o.Items)
	if err != nil {
		return fmt.Errorf("put %s: %w", o.No, err)
	}
	w, _ := orders.WriteFrom(ctx)
	args := []any{
		w.Worker, micros(w.StartedAt), string(o.Status), s.histMax, s.histAge.Microseconds(),
		"order_no", o.No, "status", string(o.Status), "address", o.Address,
		"remark", o.Remark, "items", items,
		"exchanged_to", o.ExchangedTo, "exchanged_from", o.ExchangedFrom,
	}
	keys := []string{s.orderKey(o.No), s.historyKey(o.No)}
	if err := putScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("put %s: %w", o.No, err)
	}
	return nil
}

// noteKind is the declaration of Annotate: its entries' letter and
// detail (the note's text). A note records no event and runs no
// applyScript.
var noteKind = declare(writeKind{typ: orders.TypeNote, letter: 'n',
	detail: func(_ orders.Entry, text string) string { return text }})

// Annotate appends a note to order orderNo's history, in one round trip: an
// entry of type orders.TypeNote with n.By as its worker, n.Detail() as its
// detail and the order's version (see [orders.Annotator]). It writes only
// the order's notes list: no field of the order, not its version, fence,
// position or recorded events, and no entry of its writes' history, which a
// note never pushes out (the notes have their own cap, Config.NotesMax). It
// returns orders.ErrNotFound when there is no such order, and
// orders.ErrInvalid for a note that orders.CheckNote refuses.
func (s *Store) Annotate(ctx context.Context, orderNo string, n orders.Note) error {
	if err := orders.CheckNote(orderNo, n); err != nil {
		return fmt.Errorf("annotate: %w", err)
	}
	keys := []string{s.orderKey(orderNo), s.notesKey(orderNo)}
	ok, err := annotateScript.Run(ctx, s.rdb, keys, n.By, n.Detail(), s.notesMax).Int64()
	if err != nil {
		return fmt.Errorf("annotate %s: %w", orderNo, err)
	}
	if ok == 0 {
		return fmt.Errorf("annotate %s: %w", orderNo, orders.ErrNotFound)
	}
	return nil
}

// modifyKind is the declaration of Modify, the write of tasks.Modify: one
// applyScript, its last step. An entry's detail stores the changed
// fields' letters (a, r, i).
var modifyKind = declare(writeKind{typ: orders.TypeModify, letter: 'm', detail: modifyDetail,
	request: reflect.TypeFor[modifyRequest](), step: lastStep})

// modifyDetail reads the changed fields' letters of a modify's entry.
func modifyDetail(_ orders.Entry, stored string) string {
	var changed []string
	for _, c := range stored {
		switch c {
		case 'a':
			changed = append(changed, "address")
		case 'r':
			changed = append(changed, "remark")
		case 'i':
			changed = append(changed, "items")
		}
	}
	if len(changed) == 0 {
		return "no changes"
	}
	return "changed " + strings.Join(changed, ", ")
}

// Modify applies c to the active order orderNo, once per eventID, under the
// fence of the [orders.Write] in ctx. On the first application it sets the
// changed fields, stores the fence (and the write's position, when it has
// one) as the order's newest, bumps the version, appends a history entry of
// type orders.TypeModify, and records the event (see
// Config.DedupeRetention). A repeat of eventID writes nothing, whatever its
// fence and even if the order has since changed or closed, and returns the
// order as it is now with Replayed set. Result.Order is zero when the Write
// says NoResult.
//
// It returns orders.ErrNoFence without a fenced Write; orders.ErrInvalid
// for an empty eventID, a malformed order number or bad items;
// orders.ErrNotFound; orders.ErrClosed (a *orders.ClosedError naming the
// replacement) for an exchanged or cancelled order; orders.ErrPassed when
// the write's position is not after the newest applied to the order;
// orders.ErrStaleFence when a newer fence has written to the order; and
// orders.ErrConflict when eventID was applied as a different type or with
// different changes.
func (s *Store) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	if err := orders.CheckModify(eventID, orderNo, c); err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	fields := make([]any, 0, 6)
	detail := make([]byte, 0, 3)
	if c.Address != nil {
		fields = append(fields, "address", *c.Address)
		detail = append(detail, 'a')
	}
	if c.Remark != nil {
		fields = append(fields, "remark", *c.Remark)
		detail = append(detail, 'r')
	}
	if c.Items != nil {
		items, err := encodeItems(c.Items)
		if err != nil {
			return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
		}
		fields = append(fields, "items", items)
		detail = append(detail, 'i')
	}
	fp, err := modifyKind.fingerprint(modifyRequest(c))
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	res, err := s.apply(ctx, w, eventID, orderNo, modifyKind.record(fp, "", ""), string(detail), !w.NoResult, fields)
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	out := orders.Result{Replayed: res.replayed}
	if res.order != nil {
		if out.Order, err = decodeOrder(res.order); err != nil {
			return orders.Result{}, fmt.Errorf("modify %s: event %s: %w", orderNo, eventID, err)
		}
	}
	return out, nil
}

// exchangeKind is the declaration of Exchange, the write of
// tasks.Exchange: its applyScript closes the order and is not its last
// step (the replacement is created after it), and its record carries the
// replacement's number and the fence. An entry's detail stores the
// replacement's number and, after byte 30, the reason.
var exchangeKind = declare(writeKind{typ: orders.TypeExchange, letter: 'x',
	request: reflect.TypeFor[exchangeRequest](), step: moreSteps, carries: true,
	detail: func(_ orders.Entry, stored string) string {
		newNo, reason, ok := strings.Cut(stored, "\x1e")
		if ok && reason != "" {
			return "exchanged to " + newNo + ": " + reason
		}
		return "exchanged to " + newNo
	}})

// createKind is the declaration of the second half of Exchange, the
// creation of the replacement (createScript, no applyScript). An entry's
// detail stores the exchanged order's number.
var createKind = declare(writeKind{typ: orders.TypeCreated, letter: 'c',
	request: reflect.TypeFor[exchangeRequest](),
	detail:  func(e orders.Entry, from string) string { return "created from " + from + " by event " + e.EventID }})

// Exchange closes the active order orderNo as exchanged and creates its
// replacement, once per eventID, under the fence of the [orders.Write] in ctx.
// orders.Result.Order is the replacement; read the exchanged order with Get.
//
// The replacement is numbered x.NewOrderNo, or [tasks.ReplacementOrderNo] of
// orderNo and eventID when that is empty. It is active, has x.Items, the
// exchanged order's address and remark, ExchangedFrom set to orderNo and
// version 1, and its history starts with an entry of type orders.TypeCreated that
// carries the fence the order was closed under. The exchanged order gets
// status exchanged, ExchangedTo, a bumped version and a history entry of
// type orders.TypeExchange whose detail carries x.Reason. The new order's fence
// state starts empty: its first fenced writer sets it.
//
// The two orders live in different Redis Cluster slots, so the exchange is
// three idempotent steps: reserve the replacement's number, close the
// order (recording the replacement and the fence under eventID), create the
// replacement from the closed order, whose address and remark no longer
// change. A retry after a crash between them completes the exchange.
// Replayed is true only when an earlier call had already done every step,
// and orders.Result.Order is then the replacement as it is now.
//
// It returns the errors of Modify, and orders.ErrConflict, before changing
// anything, when the replacement's number is taken by another order or
// reserved by another exchange. Only if the reservation expired (see
// [Config.ClaimTTL]) or a Put took the number between closing the
// order and a retry does orders.ErrConflict come after the order was closed.
func (s *Store) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	newNo := cmp.Or(x.NewOrderNo, tasks.ReplacementOrderNo(orderNo, eventID))
	if err := orders.CheckExchange(eventID, orderNo, newNo, x); err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	items, err := encodeItems(x.Items)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	fp, err := exchangeKind.fingerprint(exchangeRequest(x))
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	closed, err := s.closeOrder(ctx, w, eventID, orderNo, newNo, fp, x.Reason)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	b, bReplayed, err := s.createReplacement(ctx, w, eventID, orderNo, closed, items, fp)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	return orders.Result{Order: b, Replayed: closed.replayed && bReplayed}, nil
}

// closeOrder is the first half of an exchange: it reserves newNo and closes
// orderNo as exchanged to it, or replays an earlier close by the same event.
// It returns what the close recorded and the closed order's fields. Tests
// call it alone to simulate a crash before the replacement is created.
func (s *Store) closeOrder(ctx context.Context, w orders.Write, eventID, orderNo, newNo, fp, reason string) (applied, error) {
	claim := orderNo + "\n" + eventID
	claimed, err := s.claim(ctx, eventID, orderNo, newNo)
	if err != nil {
		return applied{}, err
	}
	detail := newNo
	if reason != "" {
		detail += "\x1e" + reason
	}
	fields := []any{"status", string(orders.StatusExchanged), "exchanged_to", newNo}
	rec := exchangeKind.record(fp, newNo, strconv.FormatInt(w.Fence, 10))
	res, err := s.apply(ctx, w, eventID, orderNo, rec, detail, true, fields)
	if claimed && (err != nil || res.rec.newNo != newNo) {
		// The claim is ours and no longer needed. A failure to drop it is
		// not the caller's problem: it expires after ClaimTTL.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = unclaimScript.Run(ctx, s.rdb, []string{s.claimKey(newNo)}, claim).Err()
		cancel()
	}
	if err != nil {
		return applied{}, err
	}
	return res, nil
}

// claim reserves newNo for the exchange of orderNo by eventID. It returns
// whether it holds a claim (false when the event already created newNo).
func (s *Store) claim(ctx context.Context, eventID, orderNo, newNo string) (bool, error) {
	ev, _ := s.eventKeys(newNo)
	keys := []string{s.orderKey(newNo), ev[0], ev[1], ev[2], s.claimKey(newNo)}
	res, err := claimScript.Run(ctx, s.rdb, keys, orderNo, eventID, s.claimTTL.Milliseconds(), eventHash(eventID)).StringSlice()
	if err != nil {
		return false, fmt.Errorf("claim %s: %w", newNo, err)
	}
	switch res[0] {
	case "done":
		return false, nil
	case "ok":
		return true, nil
	case "exists":
		return false, fmt.Errorf("new order %s already exists: %w", newNo, orders.ErrConflict)
	case "claimed":
		return false, claimedError(newNo, res)
	}
	return false, fmt.Errorf("claim %s: unexpected reply %q", newNo, res)
}

func claimedError(newNo string, res []string) error {
	from, event, _ := strings.Cut(res[len(res)-1], "\n")
	return fmt.Errorf("new order %s is being created by the exchange of order %s by event %s: %w", newNo, from, event, orders.ErrConflict)
}

// createReplacement is the second half of an exchange: it creates the
// replacement that the close recorded, from the closed order orderNo, or
// returns it as it is when the event already created it.
func (s *Store) createReplacement(ctx context.Context, w orders.Write, eventID, orderNo string, closed applied, items, fp string) (orders.Order, bool, error) {
	a, err := decodeOrder(closed.order)
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("event %s: %w", eventID, err)
	}
	newNo := closed.rec.newNo
	ev, exp := s.eventKeys(newNo)
	keys := []string{s.orderKey(newNo), s.historyKey(newNo), ev[0], ev[1], ev[2], s.claimKey(newNo)}
	// The replacement's first entry carries the fence the exchanged order
	// was closed under, also when a retry (under a newer fence) completes
	// an exchange that a crash cut short.
	fence := cmp.Or(closed.rec.fence, strconv.FormatInt(w.Fence, 10))
	rec := createKind.record(fp, "", "")
	res, err := createScript.Run(ctx, s.rdb, keys,
		eventID, fence, w.Worker, micros(w.StartedAt), rec.String(),
		orderNo, newNo, a.Address, a.Remark, items, eventHash(eventID), exp,
		s.histMax, s.histAge.Microseconds()).StringSlice()
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("create %s: %w", newNo, err)
	}
	var replayed bool
	switch res[0] {
	case "ok":
	case "replay":
		replayed = true
	case "exists":
		return orders.Order{}, false, fmt.Errorf("new order %s already exists and was not created by event %s: %w", newNo, eventID, orders.ErrConflict)
	case "claimed":
		return orders.Order{}, false, claimedError(newNo, res)
	default:
		return orders.Order{}, false, fmt.Errorf("create %s: unexpected reply %q", newNo, res)
	}
	if _, err := parseRecord(res[1], createKind, fp, eventID); err != nil {
		return orders.Order{}, false, fmt.Errorf("create %s: %w", newNo, err)
	}
	o, err := decodeOrder(pairs(res[2:]))
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("create %s: %w", newNo, err)
	}
	if o.ExchangedFrom != orderNo {
		return orders.Order{}, false, fmt.Errorf("new order %s was created by event %s from order %s: %w", newNo, eventID, o.ExchangedFrom, orders.ErrConflict)
	}
	return o, replayed, nil
}

// applied is what applyScript did.
type applied struct {
	rec      record            // the event's record
	replayed bool              // the event had been applied before
	order    map[string]string // the order's fields after it, when asked for
}

// apply runs applyScript as the step its kind declares (see writeKind)
// and maps its reply, or the package's error. Its steps: the order's keys
// and the lock's part (lockPartOf), the script's arguments (applyArgs), the
// round trip (runApply), the lock's part of the reply (handedOff), and
// the outcome (appliedOf).
func (s *Store) apply(ctx context.Context, w orders.Write, eventID, orderNo string, rec record, detail string, withOrder bool, fields []any) (applied, error) {
	if rec.kind.step == noStep {
		return applied{}, fmt.Errorf("redisstore: %s declares no step of applyScript", rec.kind.typ)
	}
	ev, exp := s.eventKeys(orderNo)
	keys := make([]string, 0, 8)
	keys = append(keys, s.orderKey(orderNo), s.historyKey(orderNo), ev[0], ev[1], ev[2])
	c, err := lockPartOf(w.Commit, rec.kind.step, "{"+orderNo+"}")
	if err != nil {
		return applied{}, err
	}
	keys = append(keys, c.keys...)
	args := s.applyArgs(w, eventID, rec, detail, withOrder, c, exp, fields)
	if c.h != nil {
		c.h.Committing()
	}
	res, err := s.runApply(ctx, keys, args, c)
	if err != nil {
		return applied{}, err
	}
	return appliedOf(handedOff(c.h, res), w, eventID, orderNo, rec, withOrder)
}

// lockPart is the lock's part of an applyScript: the keys that follow the
// order's (the lock's newest fence, the lock and the sequence, as far as
// the hold offers them), the hand-off when the script commits it, and the
// arguments that go with it.
type lockPart struct {
	keys                       []string
	h                          *keyorder.Handoff
	owner, channel, turn, keep string
}

// lockPartOf returns the lock's part of the applyScript of a write in step
// under hold (nil for none): its fence key always, and, when the write's
// work ends with the script (lastStep), the hand-off; one with more steps
// after it (an exchange still creates the replacement) leaves the
// hand-off to the worker. Every key must carry the order's hash tag, or
// it returns an error matching orders.ErrInvalid.
func lockPartOf(hold keyorder.Commit, step step, tag string) (lockPart, error) {
	c := lockPart{keep: "0"}
	if hold == nil {
		return c, nil
	}
	lockFenceKey := hold.FenceKey()
	if step == lastStep {
		c.h = hold.Handoff()
	}
	if lockFenceKey != "" {
		if !strings.Contains(lockFenceKey, tag) {
			return lockPart{}, fmt.Errorf("lock fence key %q lacks the hash tag %s: %w", lockFenceKey, tag, orders.ErrInvalid)
		}
		c.keys = append(c.keys, lockFenceKey)
	}
	h := c.h
	if h == nil {
		return c, nil
	}
	if lockFenceKey == "" || !strings.Contains(h.Key, tag) {
		return lockPart{}, fmt.Errorf("lock handoff %q needs the lock fence key and the hash tag %s: %w", h.Key, tag, orders.ErrInvalid)
	}
	c.keys = append(c.keys, h.Key)
	c.owner, c.channel = h.Owner, h.Channel
	if h.SeqKey != "" {
		if !strings.Contains(h.SeqKey, tag) {
			return lockPart{}, fmt.Errorf("lock handoff sequence %q lacks the hash tag %s: %w", h.SeqKey, tag, orders.ErrInvalid)
		}
		c.keys = append(c.keys, h.SeqKey)
		if h.Backlog != "" {
			c.keys = append(c.keys, h.Backlog, h.BacklogSum)
		}
		c.turn = strconv.FormatInt(h.Pos, 10)
		if h.Keep {
			c.keep = "1"
		}
	}
	return c, nil
}

// applyArgs returns applyScript's ARGV for the write.
func (s *Store) applyArgs(w orders.Write, eventID string, rec record, detail string, withOrder bool, c lockPart, exp int64, fields []any) []any {
	want, record := "0", "1"
	if withOrder {
		want = "1"
	}
	if w.SeqOutOfTurn {
		record = "0"
	}
	args := make([]any, 0, 18+len(fields))
	args = append(args, eventHash(eventID), strconv.FormatInt(w.Fence, 10), w.Worker, micros(w.StartedAt), rec.String(), detail,
		string(rec.kind.letter), seqArg(w.Seq), c.owner, c.channel, c.turn, want, exp, s.histMax, s.histAge.Microseconds(),
		eventID, record, c.keep)
	return append(args, fields...)
}

// seqArg is a write's position as applyScript takes it: "" for none.
func seqArg(seq int64) string {
	if seq > 0 {
		return strconv.FormatInt(seq, 10)
	}
	return ""
}

// runApply runs applyScript in one round trip. The lock's step (the
// drain's next claim), when the commit may keep the lock, rides in the
// same round trip, right after it.
func (s *Store) runApply(ctx context.Context, keys []string, args []any, c lockPart) ([]string, error) {
	if c.h == nil || c.h.Step == nil || c.keep != "1" {
		return applyScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	}
	pipe := s.rdb.Pipeline()
	cmd := applyScript.EvalSha(ctx, pipe, keys, args...)
	c.h.Step(ctx, pipe, c.h)
	_, _ = pipe.Exec(ctx) // each command's error is read from it
	res, err := cmd.StringSlice()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		res, err = applyScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	}
	return res, err
}

// handedOff tells hand-off h (nil for none) what the script did with the
// lock, and returns the reply without the lock's part.
func handedOff(h *keyorder.Handoff, res []string) []string {
	if h == nil {
		return res
	}
	finished, wake := false, ""
	if h.SeqKey != "" && len(res) > 3 {
		finished, wake = res[len(res)-2] == "1", res[len(res)-1]
		res = res[:len(res)-2]
	}
	if len(res) > 1 {
		switch res[len(res)-1] {
		case "1":
			h.Released(finished, wake)
		case "2":
			h.Kept(wake)
		}
		res = res[:len(res)-1]
	}
	return res
}

// appliedOf maps applyScript's reply (without the lock's part) for write
// w to what it did, or the package's error.
func appliedOf(res []string, w orders.Write, eventID, orderNo string, rec record, withOrder bool) (applied, error) {
	switch res[0] {
	case "notfound":
		return applied{}, orders.ErrNotFound
	case "closed":
		return applied{}, &orders.ClosedError{OrderNo: orderNo, Status: orders.Status(res[1]), ExchangedTo: res[2]}
	case "stale":
		newest, _ := strconv.ParseInt(res[1], 10, 64)
		return applied{}, orders.WithNewest(fmt.Errorf("fence %d is older than %s: %w", w.Fence, res[1], orders.ErrStaleFence), newest, 0)
	case "passed":
		newest, _ := strconv.ParseInt(res[1], 10, 64)
		return applied{}, orders.WithNewest(fmt.Errorf("position %s is not after position %s, the newest applied: %w", seqArg(w.Seq), res[1], orders.ErrPassed), 0, newest)
	case "ok", "replay":
		got, err := parseRecord(res[1], rec.kind, rec.fp, eventID)
		if err != nil {
			return applied{}, err
		}
		a := applied{rec: got, replayed: res[0] == "replay"}
		if withOrder {
			a.order = pairs(res[2:])
		}
		return a, nil
	}
	return applied{}, fmt.Errorf("unexpected reply %q", res)
}

// pairs turns a flat field, value list into a map.
func pairs(flat []string) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m
}

// eventHash is the field of an event in the event buckets: the first 8
// bytes (64 bits, raw) of SHA-1 of its ID. A collision within one order's
// buckets would make a new event look like a repeat; at 64 bits it is
// vanishingly unlikely.
func eventHash(eventID string) string {
	sum := sha1.Sum([]byte(eventID))
	return string(sum[:8])
}

// decodeOrder builds an order from the fields of its hash.
func decodeOrder(f map[string]string) (orders.Order, error) {
	o := orders.Order{
		No:            f["order_no"],
		Status:        orders.Status(f["status"]),
		Address:       f["address"],
		Remark:        f["remark"],
		ExchangedTo:   f["exchanged_to"],
		ExchangedFrom: f["exchanged_from"],
	}
	var err error
	if o.Version, err = strconv.ParseInt(f["version"], 10, 64); err != nil {
		return orders.Order{}, fmt.Errorf("order %s: version: %w", o.No, err)
	}
	if o.UpdatedAt, err = parseMicros(f["updated_at"]); err != nil {
		return orders.Order{}, fmt.Errorf("order %s: updated_at: %w", o.No, err)
	}
	if err := json.Unmarshal([]byte(f["items"]), &o.Items); err != nil {
		return orders.Order{}, fmt.Errorf("order %s: items: %w", o.No, err)
	}
	return o, nil
}

// A history entry is stored in one of two forms. The current one is the
// fields, separated by byte 31 (the ASCII unit separator, which no field
// can contain), with the numbers in base 36 to keep it short:
//
//	3 kind event_id age worker took ended version seq detail
//
// kind is the letter of the write's declaration (see writeKind: m, x, c,
// p or n); ended is the store's clock
// when the write was applied, in µs; age is ended minus the fence and took
// ended minus the start, in µs (a '-' marks a negative one); seq is the
// change's position or empty; detail is the changed fields' letters (a, r,
// i) for a modify, the replacement's number and, after byte 30, the reason
// for an exchange, the order it was created from for a creation, the
// status for a put, and the note's text for a note (whose worker is its
// principal). The older form, a JSON object of strings with the
// orders.Entry's field names, is still read.
func decodeEntry(s string) (orders.Entry, error) {
	if strings.HasPrefix(s, "{") {
		return decodeJSONEntry(s)
	}
	f := strings.Split(s, "\x1f")
	if len(f) != 10 || f[0] != "3" || len(f[1]) != 1 {
		return orders.Entry{}, fmt.Errorf("bad entry %q", s)
	}
	e := orders.Entry{EventID: f[2], Worker: f[4]}
	var n [5]int64 // fence and start before the end, the end, the version, the position
	for i, j := range []int{3, 5, 6, 7, 8} {
		if f[j] == "" {
			continue
		}
		v, err := strconv.ParseInt(f[j], 36, 64)
		if err != nil {
			return orders.Entry{}, fmt.Errorf("bad entry %q: field %d: %w", s, j, err)
		}
		n[i] = v
	}
	ended := n[2]
	e.Fence = ended - n[0]
	e.EndedAt, e.StartedAt = time.UnixMicro(ended).UTC(), time.UnixMicro(ended-n[1]).UTC()
	e.Version, e.Seq = n[3], n[4]
	wk := kindOfLetter(f[1][0])
	if wk == nil {
		return orders.Entry{}, fmt.Errorf("bad entry kind %q", f[1])
	}
	e.Type, e.Detail = wk.typ, wk.detail(e, f[9])
	return e, nil
}

// UnreadableNote starts the detail of the entry that stands for an element
// of an order's notes list that is not a note in a readable form:
// "unreadable note (1 byte): \"{\"" (see [Store.History]).
const UnreadableNote = "unreadable note"

// maxNoteDetail is the longest detail of a note that Annotate writes:
// "<action> by <who>: <reason>".
const maxNoteDetail = orders.MaxNoteAction + len(" by ") + orders.MaxNoteBy + len(": ") + orders.MaxNoteReason

// maxUnreadableShown is how many bytes of an unreadable note its entry
// shows.
const maxUnreadableShown = 200

// decodeNote reads an element of an order's notes list as a note: an entry
// of type orders.TypeNote with the principal and the detail it carries,
// whatever its kind letter or form (the older JSON form included), and
// never its event ID, fence or position, which a note has none of. A
// detail of another kind than a note's is its raw field, marked "not
// written as a note". It reports false for an element that does not
// decode, or whose principal or detail is not text a note may hold
// (orders.CheckNote's, and no longer than Annotate writes).
func decodeNote(s string) (orders.Entry, bool) {
	e, err := decodeEntry(s)
	if err != nil {
		return orders.Entry{}, false
	}
	n := orders.Entry{Type: orders.TypeNote, Worker: e.Worker, Version: e.Version, StartedAt: e.StartedAt, EndedAt: e.EndedAt, Detail: e.Detail}
	switch {
	case strings.HasPrefix(s, "{"):
		n.Detail = fmt.Sprintf("not written as a note (%s): %s", clipText(e.Type, 64), e.Detail)
	case s[2] != noteKind.letter:
		// decodeEntry took the form: ten fields, "3" and a one-letter kind.
		n.Detail = fmt.Sprintf("not written as a note (kind %q): %s", s[2], strings.Split(s, "\x1f")[9])
	}
	if n.Version < 0 || !noteText(n.Worker, orders.MaxNoteBy) || !noteText(n.Detail, 2*maxNoteDetail) {
		return orders.Entry{}, false
	}
	return n, true
}

// noteText reports whether s is at most max bytes of UTF-8 without control
// or format characters (unicode.Cf: the bidirectional controls among
// them), as a note is written.
func noteText(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
	})
}

// clipText cuts s to at most n bytes.
func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// unreadableNote is the entry that stands for element s of the notes list
// that is no readable note: a note without principal or version whose
// detail is [UnreadableNote], s's length and its first bytes, quoted in
// ASCII (control, format and invalid bytes escaped).
func unreadableNote(s string) orders.Entry {
	unit := "bytes"
	if len(s) == 1 {
		unit = "byte"
	}
	return orders.Entry{Type: orders.TypeNote, Detail: fmt.Sprintf("%s (%d %s): %s", UnreadableNote, len(s), unit, strconv.QuoteToASCII(clipText(s, maxUnreadableShown)))}
}

// decodeJSONEntry decodes a history entry of the older form: a JSON object
// whose values are all strings.
func decodeJSONEntry(s string) (orders.Entry, error) {
	var f map[string]string
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		return orders.Entry{}, err
	}
	e := orders.Entry{EventID: f["event_id"], Type: f["type"], Worker: f["worker"], Detail: f["detail"]}
	var err error
	if e.Fence, err = strconv.ParseInt(f["fence"], 10, 64); err != nil {
		return orders.Entry{}, fmt.Errorf("fence: %w", err)
	}
	if seq, ok := f["seq"]; ok {
		if e.Seq, err = strconv.ParseInt(seq, 10, 64); err != nil {
			return orders.Entry{}, fmt.Errorf("seq: %w", err)
		}
	}
	if e.Version, err = strconv.ParseInt(f["version"], 10, 64); err != nil {
		return orders.Entry{}, fmt.Errorf("version: %w", err)
	}
	if e.StartedAt, err = parseMicros(f["started_at"]); err != nil {
		return orders.Entry{}, fmt.Errorf("started_at: %w", err)
	}
	if e.EndedAt, err = parseMicros(f["ended_at"]); err != nil {
		return orders.Entry{}, fmt.Errorf("ended_at: %w", err)
	}
	return e, nil
}

// micros formats t as decimal microseconds since the epoch, or "" for the
// zero time (the scripts then use Redis TIME).
func micros(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

func parseMicros(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(n).UTC(), nil
}

// encodeItems encodes items for the order hash; nil becomes [].
func encodeItems(items []orders.Item) (string, error) {
	if items == nil {
		items = []orders.Item{}
	}
	b, err := json.Marshal(items)
	if err != nil {
		return "", fmt.Errorf("encode items: %w", err)
	}
	return string(b), nil
}

// modifyRequest and exchangeRequest fix the encoding that fingerprint
// hashes, apart from the public types' (tagless) JSON. They are converted
// from orders.Changes and orders.Exchange, so adding a field there fails to compile until
// it is added here too. Changing them changes the fingerprints of requests
// recorded before, which would turn their retries into ErrConflict: add
// fields only with omitempty, and never rename a tag.
type modifyRequest struct {
	Address *string       `json:"address,omitempty"`
	Remark  *string       `json:"remark,omitempty"`
	Items   []orders.Item `json:"items,omitempty"`
}

type exchangeRequest struct {
	Items      []orders.Item `json:"items"`
	NewOrderNo string        `json:"new_order_no,omitempty"`
	Reason     string        `json:"reason,omitempty"`
}

// fingerprint identifies a request, so that a repeat of an event ID with a
// different request is told apart from a retry: the first 8 hex digits of
// SHA-256 of its JSON (within one event ID, a collision would only hide a
// conflict).
func fingerprint(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// The request types are plain structs of strings and ints.
		panic(fmt.Sprintf("redisstore: fingerprint: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:4])
}
