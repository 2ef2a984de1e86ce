package keyorder

import "github.com/redis/go-redis/v9"

// The lock of a key is a hash at lockKey with the fields
//
//	owner  the holder's unique token (a UUID)
//	meta   the holder's description, e.g. "order:exchange 9f1c…"
//	fence  the fencing token handed to the holder
//	w      present once a waiter has found the lock held
//
// and the newest fencing token handed out for the key is a string at
// fenceKey, kept for lockConfig.FenceRetention after the last acquire.
//
// The key's sequence (see [Sequencer]) is a hash at seqKey with the fields
//
//	n        the last position handed out
//	d        the cursor: every position up to d is finished
//	p:<pos>  a position after d: "<taken at, ms> <label>" while it waits for
//	         its holder, "v <reason>" once voided, "f <outcome>" once
//	         finished ahead of its turn
//	r:<pos>  the time (ms) the head position's holder will run again after
//	         a failure, so that the positions behind it need not wait
//	w:<pos>  a waiter for pos waits in place: notify it when pos is next
//	k:<pos>  the holder of pos is parked: hand its label back when pos is
//	         next, so that the caller brings it back
//	ref:<x>  the position reserved under reference x (Reserve's ref)
//	rp:<pos> "<earlier pos> <x>": pos took ref:<x> from an earlier position
//	         that still waited (a repeated reservation under one
//	         reference, such as a refused repeat of an exchange); a void of
//	         pos gives ref:<x> back to it, and a finish of pos (the work
//	         found pos by x before the repeat voided it) voids it. Deleted when pos is settled ahead of
//	         its turn (a position under a reference always is), else with
//	         the sequence.
//	h        the key is paused (an operator's hold, see [Sequencer.Pause],
//	         or a halt, see [FailureHalt]): {"by", "reason", "at"} as
//	         JSON, with "halted" (the head's label) for a halt; the head's holder parks
//	         instead of taking its turn, and the sequence does not expire
//	         (it is persisted) while the field is there
//	log      the latest positions settled without a turn, and the outcomes
//	         noted by holders after theirs, as JSON (seq_log)
//	o        the offset of the positions given to the key's store, once
//	         a store showed it had applied positions that a failover lost
//	         (see lease.CatchUp and lease.Seq); absent for 0
//
// All three keys share the hash tag {key}, so every script touches one
// Cluster slot. Positions start at Redis TIME in microseconds (see
// reserveScript): about 1.8e15, exact in Lua's doubles (below 2^53) but
// longer than Lua's default number format (%.14g) prints exactly, so the
// scripts format every position with num().

// numLua defines num, which formats a position exactly, and seq_count,
// which keeps the index of backlogs (see [Sequencer.Backlog]).
const numLua = `
local function num(x) return string.format('%.0f', x) end

-- seq_count records in the index of backlogs how many positions of
-- sequence s wait behind its head, given n, its last position handed out,
-- and d, its cursor (nil when s has none): ix, a sorted set, scores s by
-- n - d - 1 and leaves it out at 0; sum, a counter, is the sum of ix's
-- scores, kept in the same step. An ix that is nil, '' or s itself means
-- the key space keeps no index (a Cluster, whose scripts touch one slot).
-- It costs one call when the count did not change, three when it did.
-- Its calls are pcalls whose errors are ignored: a producer's Redis user
-- may write the index (of the wrong type, say), and a count must never
-- fail the write it follows.
local function seq_count(ix, sum, s, n, d)
  if not ix or ix == '' or ix == s then return end
  local b = 0
  if n and d and n - d > 1 then b = n - d - 1 end
  local old = redis.pcall('ZSCORE', ix, s)
  if type(old) == 'table' then return end -- an error reply
  old = tonumber(old) or 0
  if b == old then return end
  if b > 0 then redis.pcall('ZADD', ix, b, s) else redis.pcall('ZREM', ix, s) end
  redis.pcall('INCRBY', sum, b - old)
end
`

// commonLua holds the helpers every script of this package shares.
const commonLua = numLua + `

local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- seq_advance moves the cursor of sequence s past pos when pos is the next
-- position, and then past every voided or finished position after it, and
-- counts what waits behind the new head in the index ix and sum
-- (seq_count). It returns the position that is next after the move, or nil
-- when pos was not next (finished already, or not yet its turn).
local function seq_advance(s, pos, ix, sum)
  local nd = redis.call('HMGET', s, 'd', 'n')
  local d = tonumber(nd[1])
  if not d or pos ~= d + 1 then return nil end
  local p = num(pos)
  redis.call('HDEL', s, 'p:' .. p, 'r:' .. p, 'w:' .. p, 'k:' .. p)
  d = pos
  while true do
    local nx = num(d + 1)
    local rec = redis.call('HGET', s, 'p:' .. nx)
    if not rec then break end
    local k = string.sub(rec, 1, 2)
    if k ~= 'v ' and k ~= 'f ' then break end
    redis.call('HDEL', s, 'p:' .. nx, 'r:' .. nx, 'w:' .. nx, 'k:' .. nx)
    d = d + 1
  end
  redis.call('HSET', s, 'd', num(d))
  seq_count(ix, sum, s, tonumber(nd[2]), d)
  return d + 1
end

-- seq_log records that position pos, reserved under label, was settled
-- without its turn (kind "void", "skip" or "finish"), or that its holder
-- noted an outcome after its turn (kind "note"), and why, in the capped log
-- of sequence s.
local function seq_log(s, pos, kind, label, why)
  local log = {}
  local old = redis.call('HGET', s, 'log')
  if old then log = cjson.decode(old) end
  table.insert(log, {pos = num(pos), at = num(nowms()), kind = kind, label = label, why = why})
  while #log > 20 do table.remove(log, 1) end
  redis.call('HSET', s, 'log', cjson.encode(log))
end

-- IN_PLACE is how many positions after the next one wait in place (marked
-- w:, woken by a notice) while the next one runs: the holders of positions
-- further back are parked (k:) by acquireScript and brought back by notify
-- once they come within reach. None does: a holder that is not next parks
-- at once, spending no worker slot, and the holder before it hands it the
-- turn (the drain of a hold, or a call back). The in-place machinery stays
-- for a waiter marked before this rule (w:), which notify still serves.
local IN_PLACE = 0

-- add_label adds to wake, a list of labels separated by newlines, the
-- label of the pending position record rec ("<taken at> <label>"), and
-- returns it; a record that is missing or settled adds nothing.
local function add_label(wake, rec)
  local sp = rec and string.find(rec, ' ', 1, true)
  if not sp or not string.find(string.sub(rec, 1, 1), '%d') then return wake end
  if wake ~= '' then wake = wake .. '\n' end
  return wake .. string.sub(rec, sp + 1)
end

-- notify publishes "lk next" (or "lk" when next is nil) on channel when a
-- waiter can use it: lockWaited says a waiter marked the lock, and a waiter
-- for position next marks w:next in s. A refused PUBLISH (a Redis user
-- without the channel in its ACL) is ignored: a notice only saves a waiter
-- its polling delay, and must never fail the write it follows. When the
-- holder of position next, or of one of the IN_PLACE after it, is parked
-- (k:), it returns their labels, separated by a newline, for the caller to
-- bring them back (those after next come back to wait in place); ''
-- otherwise.
local function notify(channel, lk, s, next, lockWaited)
  local send, wake = lockWaited, ''
  if s and next then
    local at, fields = {}, {'w:' .. num(next)}
    for i = 0, IN_PLACE do
      at[i + 1] = num(next + i)
      fields[i + 2] = 'k:' .. at[i + 1]
    end
    local m = redis.call('HMGET', s, unpack(fields))
    local any = false
    for i = 1, #fields do any = any or m[i] end
    if any then
      redis.call('HDEL', s, unpack(fields))
      if m[1] then send = true end
      for i = 1, #at do
        if m[i + 1] then wake = add_label(wake, redis.call('HGET', s, 'p:' .. at[i])) end
      end
    end
  end
  if send then
    local msg = lk
    if next then msg = lk .. ' ' .. num(next) end
    redis.pcall('PUBLISH', channel, msg)
  end
  return wake
end
`

// CommitLua defines the Lua function
//
//	lock_commit(lk, owner, channel, s, pos, advance, held, keep, ix, sum)
//
// that releases the lock hash lk if owner holds it and, when s is given and
// advance is true, moves the sequence s past position pos (whoever holds the
// lock: the work of pos is done). It notifies the waiters that can proceed
// and returns two values: 1 when it released the lock, 0 when the lock was
// not owner's (nothing of the lock is touched then), 2 when it kept it (see
// keep); and the label of the next position when its holder is parked
// (empty otherwise), which the caller must bring back (see lease.Wake),
// or, when it kept the lock, "<next position> <label>": the position the
// caller is to run itself. keep (a boolean) asks to keep the
// lock instead of releasing it when it passed the turn on to a parked
// holder and the key is not paused: the holder drains the key (see
// lease.Drain); otherwise it releases as without keep. held, when not nil, is what
// lock_held(lk) returned earlier in the same script, so that the lock is
// read once. A store's script on the same Redis includes it to release a
// lease and finish its turn in the round trip that commits the work (see
// lease.Handoff); lk and s must then be among that script's KEYS. ix and
// sum are the key space's index of backlogs ([Handoff].Backlog and
// BacklogSum, among the KEYS too when not ""), which a move of the cursor
// keeps counting; nil or "" when the key space keeps none (a Cluster). It
// needs the helpers of commonLua, which it includes.
//
// lock_held(lk) returns the lock's owner token and its waiter mark, as one
// HMGET: {owner or false, w or false}.
//
// Every redis.call in a script costs about as much as a small command
// (measured by a store's benchmark of its commit script), so the
// usual path (the next position is waiting for its holder or not taken
// yet) reads the sequence once, writes it twice and the lock once.
const CommitLua = commonLua + `
local function lock_held(lk)
  return redis.call('HMGET', lk, 'owner', 'w')
end

-- seq_finish moves the cursor of s past pos, its holder's own turn, and
-- tells the next position's waiter, like seq_advance then notify, in three
-- calls when the next position is pending or not taken. It returns false
-- when pos is not next (nothing is done), or next and wake.
local function seq_finish(s, pos, channel, lk, waited, ix, sum)
  local p, n1 = num(pos), num(pos + 1)
  local fields = {'d', 'p:' .. n1, 'w:' .. n1}
  for i = 1, IN_PLACE + 1 do fields[#fields + 1] = 'k:' .. num(pos + i) end
  local nf = #fields
  fields[nf + 1] = 'n' -- read with the rest, for seq_count
  local m = redis.call('HMGET', s, unpack(fields))
  local d = tonumber(m[1])
  if not d or pos ~= d + 1 then return false end
  local rec = m[2]
  if rec then
    local k = string.sub(rec, 1, 2)
    if k == 'v ' or k == 'f ' then
      -- positions settled ahead follow: the general path
      local next = seq_advance(s, pos, ix, sum)
      return next, notify(channel, lk, s, next, waited)
    end
  end
  local send, wake = waited, ''
  local any = false
  for i = 3, nf do any = any or m[i] end
  if any then
    local del = {'p:' .. p, 'r:' .. p, 'w:' .. p, 'k:' .. p}
    for i = 3, nf do del[#del + 1] = fields[i] end
    redis.call('HDEL', s, unpack(del))
    if m[3] then send = true end
    for i = 4, nf do
      if m[i] then
        local r = rec
        if i > 4 then r = redis.call('HGET', s, 'p:' .. num(pos + i - 3)) end
        wake = add_label(wake, r)
      end
    end
  else
    redis.call('HDEL', s, 'p:' .. p, 'r:' .. p, 'w:' .. p, 'k:' .. p)
  end
  redis.call('HSET', s, 'd', p)
  seq_count(ix, sum, s, tonumber(m[nf + 1]), pos)
  if send then redis.pcall('PUBLISH', channel, lk .. ' ' .. n1) end
  return pos + 1, wake
end

local function lock_commit(lk, owner, channel, s, pos, advance, held, keep, ix, sum)
  local h = held or lock_held(lk)
  local mine = h[1] == owner
  local waited = mine and h[2] ~= false
  if s and s ~= '' and advance then
    local next, wake = seq_finish(s, pos, channel, lk, waited, ix, sum)
    if next then
      -- keep: the holder drains the key: it goes on with the next position
      -- itself when that position's holder is parked (wake names it alone,
      -- IN_PLACE being 0) and the key is not paused.
      if keep and mine and wake ~= '' and not string.find(wake, '\n', 1, true)
          and redis.call('HEXISTS', s, 'h') == 0 then
        return 2, num(next) .. ' ' .. wake
      end
      if mine then redis.call('DEL', lk) return 1, wake end
      return 0, wake
    end
  end
  local released = 0
  if mine then
    redis.call('DEL', lk)
    released = 1
  end
  local next = nil
  if s and s ~= '' and released == 1 then
    local d = redis.call('HGET', s, 'd')
    if d then next = tonumber(d) + 1 end
  end
  local wake = ''
  if released == 1 or next then wake = notify(channel, lk, s, next, waited) end
  return released, wake
end
`

// acquireScript takes the lock if it is free and, with a position, if it is
// that position's turn.
//
// KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] (optional) sequence
// ARGV[1] owner token, ARGV[2] lease TTL in ms, ARGV[3] meta,
// ARGV[4] fence retention in ms; with KEYS[3]: ARGV[5] position (decimal,
// exactly as the sequence writes it), ARGV[6] the position's label, ARGV[7]
// sequence retention in ms (unused: reservations and advances keep the
// sequence alive), ARGV[8] "1" when the caller parks if it is not its turn
//
// Returns one of
//
//	{1, fence, mode, offset}
//	                   taken; fence is max(previous fence + 1, Redis TIME in
//	                   µs); mode is "turn" (it is the position's turn),
//	                   "passed" (the position is finished), "gone" (the
//	                   sequence does not exist) or "free" (no position
//	                   given); offset is the sequence's field o ("0"
//	                   without one: see lease.Seq)
//	{0, pttl, holder}  held by someone else (a waiter mark is set)
//	{2, head, record, retry at, now, parked}
//	                   not the position's turn yet: head is the next
//	                   position, record its p: field ("" when missing),
//	                   retry at its r: field (""), now Redis TIME in ms;
//	                   parked is 1 when the caller is marked parked (it is
//	                   more than IN_PLACE behind the next position, or
//	                   ARGV[8] is "1"), 0 when it is marked waiting in place
//	{3, reason}        the position is not this caller's: never handed
//	                   out, or reserved under another label
//	{4, pause, record} it is the position's turn, but the sequence is
//	                   paused (field h, its JSON): the caller is marked
//	                   parked (k:), so that Resume hands its label back;
//	                   record is the position's p: field
//
// The pause is read by the HMGET that reads the position anyway: it costs
// no call on the hot path. A position already passed and a caller without
// a position are not paused (they are not ordered).
var acquireScript = redis.NewScript(commonLua + `
local mode = 'free'
local offset = '0'
if KEYS[3] then
  local pos = tonumber(ARGV[5])
  local st = redis.call('HMGET', KEYS[3], 'n', 'd', 'p:' .. ARGV[5], 'h', 'o')
  local n, d, rec = tonumber(st[1]), tonumber(st[2]), st[3]
  if d and st[5] then offset = st[5] end
  if not d then
    mode = 'gone'
  elseif pos <= d then
    mode = 'passed'
  elseif pos > n then
    return {3, 'position ' .. num(pos) .. ' was never handed out (the last is ' .. num(n) .. ')'}
  else
    local sp = rec and string.find(rec, ' ', 1, true)
    if not sp or string.sub(rec, sp + 1) ~= ARGV[6] then
      return {3, 'position ' .. num(pos) .. ' is reserved as ' .. (rec or 'nothing')}
    end
    if pos > d + 1 then
      local parked = 0
      if ARGV[8] == '1' or pos > d + 1 + IN_PLACE then parked = 1 end
      if parked == 1 then
        redis.call('HSET', KEYS[3], 'k:' .. num(pos), '1')
        redis.call('HDEL', KEYS[3], 'w:' .. num(pos))
      else
        redis.call('HSET', KEYS[3], 'w:' .. num(pos), '1')
      end
      local h = num(d + 1)
      local head = redis.call('HMGET', KEYS[3], 'p:' .. h, 'r:' .. h)
      return {2, h, head[1] or '', head[2] or '', num(nowms()), parked}
    end
    if st[4] then
      redis.call('HSET', KEYS[3], 'k:' .. num(pos), '1')
      redis.call('HDEL', KEYS[3], 'w:' .. num(pos))
      return {4, st[4], rec}
    end
    mode = 'turn'
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'w', '1')
  return {0, redis.call('PTTL', KEYS[1]), redis.call('HGET', KEYS[1], 'meta') or ''}
end
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
if prev and prev >= fence then fence = prev + 1 end
local s = num(fence)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'meta', ARGV[3], 'fence', s)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
return {1, s, mode, offset}
`)

// releaseScript releases the lock if the caller still owns it, and finishes
// or marks the caller's turn.
//
// KEYS[1] lock hash, KEYS[2] (optional) sequence, KEYS[3] and KEYS[4]
// (optional, with KEYS[2]) the index of backlogs and its sum
// ARGV[1] owner token, ARGV[2] notice channel; with KEYS[2]: ARGV[3]
// position, ARGV[4] "1" to move the sequence past it, ARGV[5] when the
// holder runs again, in ms since the epoch ("" for unknown), recorded for
// the waiters behind it when the turn stays, ARGV[6] "1" to keep the lock
// when the turn passes to a parked holder (lock_commit's keep), ARGV[7]
// (optional) when the turn stays: halt the key at the position for this
// reason (seq_halt, the label being ARGV[8])
//
// Returns {released, wake}: released is 1 when released, 0 when the caller
// no longer held the lock (it expired, or someone else holds it now):
// nothing of the lock is touched then, but the turn is still finished or
// marked, 2 when it kept the lock for the next position; wake holds the
// labels of the parked holders it called (see lock_commit), empty when
// none.
var releaseScript = redis.NewScript(CommitLua + haltLua + `
local s, pos = KEYS[2], tonumber(ARGV[3])
if s and ARGV[4] ~= '1' and ARGV[5] ~= '' then
  local d = tonumber(redis.call('HGET', s, 'd'))
  if d and pos == d + 1 then redis.call('HSET', s, 'r:' .. num(pos), ARGV[5]) end
end
if s and ARGV[4] ~= '1' and ARGV[7] and ARGV[7] ~= '' then seq_halt(s, pos, ARGV[8], ARGV[7]) end
local released, wake = lock_commit(KEYS[1], ARGV[1], ARGV[2], s, pos, ARGV[4] == '1', nil, ARGV[6] == '1', KEYS[3], KEYS[4])
return {released, wake}
`)

// refreshScript extends the lease if the caller still owns the lock.
//
// KEYS[1] lock hash
// ARGV[1] owner token, ARGV[2] lease TTL in ms
//
// Returns 1 when extended, 0 when the lock is gone or owned by someone else.
var refreshScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// reserveLua defines the Lua function
//
//	seq_reserve(s, label, ttl, ref, max, park, ix, sum)
//
// that hands out the next position of the sequence s under label, keeps s
// for ttl milliseconds, records the position under the reference ref
// ("" for none), counts it in the index of backlogs ix and sum (seq_count;
// s, "" or nil for none) and returns the position as decimal. With park true (and
// no ref), a position handed out behind earlier positions that are not
// finished is marked parked (k:), so that the position before it hands its
// holder the turn: the caller then parks the holder (the producer enqueues
// its task in asynq's retry set rather than the pending list), and the
// third value returned is true. When max (a number
// or a decimal string) is above 0 and s already has max positions waiting
// (handed out, not finished), it hands out nothing and returns nil and the
// message "FULL <waiting> <max>", for the script to return as an error
// reply (redis.error_reply), which reserveError reads. It also defines
//
//	seq_full(s, max)
//
// which returns that message when s is full, and nil otherwise, for a
// script that must check before its other writes, and
//
//	seq_splice(body, pos)
//
// which returns body, a JSON object trimmed of space and without a "seq"
// member, with "seq": pos appended as its last member (seqField: how a
// task carries its position). The Client's enqueueScript includes it to
// take a position in the round trip that enqueues its task (and a
// producer's claim and linked position: [Client.EnqueueAtOnce]); s must be
// among the script's KEYS, and Sequencer.reserveArgs gives it, ttl and
// max. It defines num too (see above), seq_full and seq_splice, and
// nothing else. [Sequencer.Reserve] runs it alone.
//
// A sequence that does not exist starts at Redis TIME in microseconds, so a
// sequence that expired and starts again hands out positions above every
// position of its earlier life (as long as that life handed out fewer
// positions than it lasted microseconds, which one script per position
// guarantees).
const reserveLua = numLua + `
local function seq_full(s, max)
  max = tonumber(max) or 0
  if max <= 0 then return nil end
  local nd = redis.call('HMGET', s, 'n', 'd')
  local n, d = tonumber(nd[1]), tonumber(nd[2])
  if n and d and n - d >= max then return 'FULL ' .. num(n - d) .. ' ' .. num(max) end
  return nil
end

local function seq_reserve(s, label, ttl, ref, max, park, ix, sum)
  local full = seq_full(s, max)
  if full then return nil, full end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local n = redis.call('HINCRBY', s, 'n', 1)
  local pos, rec = num(n), num(now) .. ' ' .. label
  local set = {'HSET', s}
  local parked = false
  local counted = ix and ix ~= '' and ix ~= s
  if n == 1 then
    -- a new sequence (no position is ever 1 in a live one): start at TIME
    pos = num(tonumber(t[1]) * 1000000 + tonumber(t[2]))
    set = {'HSET', s, 'n', pos, 'd', num(tonumber(pos) - 1)}
    if counted then seq_count(ix, sum, s, 1, 0) end -- nothing behind: clears a stale entry
  elseif (park and ref == '') or counted then
    local d = tonumber(redis.call('HGET', s, 'd'))
    if park and ref == '' and d and n > d + 1 then
      parked = true
      set[#set + 1] = 'k:' .. pos
      set[#set + 1] = '1'
    end
    seq_count(ix, sum, s, n, d)
  end
  set[#set + 1] = 'p:' .. pos
  set[#set + 1] = rec
  if ref ~= '' then
    -- An earlier position still waiting under ref gets it back if this
    -- one is voided (settleScript): a refused repeat must not take the
    -- reference from the reservation that stands.
    local old = redis.call('HGET', s, 'ref:' .. ref)
    if old then
      local orec = redis.call('HGET', s, 'p:' .. old)
      if orec and string.find(string.sub(orec, 1, 1), '%d') then
        set[#set + 1] = 'rp:' .. pos
        set[#set + 1] = old .. ' ' .. ref
      end
    end
    set[#set + 1] = 'ref:' .. ref
    set[#set + 1] = pos
  end
  redis.call(unpack(set))
  if n ~= 1 then
    -- XX: a paused sequence has no TTL, and keeps none (see pauseScript)
    redis.call('PEXPIRE', s, ttl, 'XX')
  elseif redis.call('HEXISTS', s, 'h') == 0 then
    redis.call('PEXPIRE', s, ttl)
  end
  return pos, nil, parked
end

local function seq_splice(body, pos)
  if body == '{}' then return '{"seq":' .. pos .. '}' end
  return string.sub(body, 1, -2) .. ',"seq":' .. pos .. '}'
end
`

// reserveScript hands out the next position of a sequence (seq_reserve).
//
// KEYS[1] sequence, KEYS[2] and KEYS[3] the index of backlogs and its sum
// (KEYS[1] both, for none)
// ARGV[1] label, ARGV[2] sequence retention in ms, ARGV[3] a reference to
// find the position by later ("" for none), ARGV[4] the cap of positions
// waiting (0 for none)
//
// Returns the position, as decimal, or the error reply "FULL <waiting>
// <max>".
var reserveScript = redis.NewScript(reserveLua + `
local pos, full = seq_reserve(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], false, KEYS[2], KEYS[3])
if not pos then return redis.error_reply(full) end
return pos
`)

// settleScript ends a position ahead of or at its turn without a lock hold:
// it voids it (its task will never exist), skips it (its task is gone), or
// finishes it (its task ended elsewhere).
//
// KEYS[1] sequence, KEYS[2] the key's lock hash (named in the notice),
// KEYS[3] and KEYS[4] the index of backlogs and its sum (KEYS[1] both, for
// none)
// ARGV[1] position, or "" to look it up by ARGV[2]; ARGV[2] reference ("" for
// none); ARGV[3] what the p: field must hold now: "=<record>" for exactly
// that record, "~<label>" for a pending record with that label, "" for any
// pending record; ARGV[4] "v", "s" or "f" (void, skip, finish); ARGV[5] the
// reason or outcome; ARGV[6] notice channel; ARGV[7] sequence retention in ms
//
// A skip applies only to the next position (the head). A void or finish
// of a later position marks it, and the cursor passes it when it gets
// there. Each is logged (seq_log). Returns {1, wake} when it settled the
// position, where wake is the label of the next position when its holder
// is parked (empty otherwise), and {0, ""} when the position was not in the
// expected state (settled already, reserved for someone else, or not the
// head for a skip).
var settleScript = redis.NewScript(commonLua + `
local s = KEYS[1]
local p = ARGV[1]
if ARGV[2] ~= '' then
  local byref = redis.call('HGET', s, 'ref:' .. ARGV[2])
  if p == '' then p = byref end
  if byref == p then redis.call('HDEL', s, 'ref:' .. ARGV[2]) end
end
if not p or p == '' then return {0, ''} end
local pos = tonumber(p)
p = num(pos)
local rec = redis.call('HGET', s, 'p:' .. p)
if not rec or not string.find(string.sub(rec, 1, 1), '%d') then return {0, ''} end
local want = ARGV[3]
if string.sub(want, 1, 1) == '=' and rec ~= string.sub(want, 2) then return {0, ''} end
if string.sub(want, 1, 1) == '~' then
  local sp = string.find(rec, ' ', 1, true)
  if string.sub(rec, sp + 1) ~= string.sub(want, 2) then return {0, ''} end
end
local d = tonumber(redis.call('HGET', s, 'd'))
local kind = ARGV[4]
if kind == 's' and pos ~= d + 1 then return {0, ''} end
local kinds = {v = 'void', s = 'skip', f = 'finish'}
local rp = redis.call('HGET', s, 'rp:' .. p)
local twin = nil
if rp then
  -- p took its reference from an earlier position still waiting (see
  -- seq_reserve): a void gives it back, if that one still waits.
  redis.call('HDEL', s, 'rp:' .. p)
  local sp = string.find(rp, ' ', 1, true)
  local old, ref = string.sub(rp, 1, sp - 1), string.sub(rp, sp + 1)
  local orec = redis.call('HGET', s, 'p:' .. old)
  if orec and string.find(string.sub(orec, 1, 1), '%d') then
    if kind == 'v' and redis.call('HGET', s, 'ref:' .. ref) == p then
      redis.call('HSET', s, 'ref:' .. ref, old)
    elseif kind == 'f' then
      -- The work of the reference ended at p (the repeat's reservation,
      -- found by the reference before the repeat voided it): the earlier
      -- reservation's will never end anywhere else, so it is void now.
      twin = tonumber(old)
      seq_log(s, twin, 'void', string.sub(orec, string.find(orec, ' ', 1, true) + 1), 'its reference ' .. ref .. ' was finished at ' .. p)
      redis.call('HSET', s, 'p:' .. old, 'v its reference was finished at ' .. p)
    end
  end
end
seq_log(s, pos, kinds[kind], string.sub(rec, string.find(rec, ' ', 1, true) + 1), ARGV[5])
if kind == 'f' then
  redis.call('HSET', s, 'p:' .. p, 'f ' .. ARGV[5])
else
  redis.call('HSET', s, 'p:' .. p, 'v ' .. ARGV[5])
end
local next = nil
if twin then next = seq_advance(s, twin, KEYS[3], KEYS[4]) end
next = seq_advance(s, pos, KEYS[3], KEYS[4]) or next
local wake = ''
if next then
  wake = notify(ARGV[6], KEYS[2], s, next, false)
end
redis.call('PEXPIRE', s, ARGV[7], 'XX') -- a paused sequence keeps no TTL
return {1, wake}
`)

// statusScript reads one page of a sequence, for [Sequencer.Status]: its
// counters, its log and the fields of the first positions after its
// cursor. It makes three calls whatever the backlog, and only reads, so it
// runs as EVALSHA_RO under a read-only user.
//
// KEYS[1] sequence
// ARGV[1] the most positions after the cursor to read (the page)
//
// Returns {-2} when the sequence does not exist, and otherwise
//
//	{pttl, n, d, log, h, p:<d+1>, r:<d+1>, w:<d+1>, p:<d+2>, …}
//
// with the p:, r: and w: fields of the first min(ARGV[1], n - d) positions
// after d, each false when missing (as are n, d, log and h, the pause). It reads no
// position when n or d is not a number.
var statusScript = redis.NewScript(numLua + `
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return {-2} end
local h = redis.call('HMGET', KEYS[1], 'n', 'd', 'log', 'h')
local out = {ttl, h[1], h[2], h[3], h[4]}
local n, d = tonumber(h[1]), tonumber(h[2])
local count = 0
if n and d and n > d then count = math.min(n - d, tonumber(ARGV[1])) end
if count < 1 then return out end
local fields = {}
for i = 1, count do
  local p = num(d + i)
  fields[#fields + 1] = 'p:' .. p
  fields[#fields + 1] = 'r:' .. p
  fields[#fields + 1] = 'w:' .. p
end
local m = redis.call('HMGET', KEYS[1], unpack(fields))
for i = 1, #m do out[#out + 1] = m[i] end
return out
`)

// noteScript records in a sequence's log an outcome that the holder of a
// position noted after its turn (see [Sequencer.Note]), or an operator's
// action (see [Sequencer.Record]). It moves nothing.
//
// KEYS[1] sequence
// ARGV[1] position (0 for none), ARGV[2] the position's label, ARGV[3] the
// outcome, ARGV[4] sequence retention in ms: the sequence lives at least
// that long after the note, ARGV[5] the log kind ("note" or "action")
//
// Returns 1 when it logged the note, 0 when the sequence does not exist
// (it expired): nothing is written then. A paused sequence (no TTL) keeps
// none.
var noteScript = redis.NewScript(commonLua + `
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return 0 end
seq_log(KEYS[1], tonumber(ARGV[1]), ARGV[5], ARGV[2], ARGV[3])
if ttl >= 0 and ttl < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
`)

// pauseScript pauses a sequence: it sets its field h, so that the holder of
// the head parks instead of taking its turn (see acquireScript), and
// persists it, so that it does not expire while paused. A sequence that
// does not exist is made, with the field alone: the changes accepted later
// find it paused.
//
// KEYS[1] sequence
// ARGV[1] who pauses it, ARGV[2] why (JSON strings are built here, with the
// Redis clock)
//
// Returns {1, pause} when it paused the sequence, {0, pause} when it was
// paused already (nothing is written), pause being the field h.
var pauseScript = redis.NewScript(commonLua + `
local old = redis.call('HGET', KEYS[1], 'h')
if old then return {0, old} end
local h = cjson.encode({by = ARGV[1], reason = ARGV[2], at = num(nowms())})
redis.call('HSET', KEYS[1], 'h', h)
redis.call('PERSIST', KEYS[1])
return {1, h}
`)

// haltLua defines the Lua function
//
//	seq_halt(s, pos, label, why)
//
// that halts the sequence s at its head pos, reserved under label, after
// the head's task failed past its budget under [FailureHalt]: it pauses s
// as pauseScript does, the field h recording by "keyorder", why (the
// task's last error) and halted (the label), and persists s. It writes
// nothing and returns 0 when pos is not the head, its record is not
// label's, or s is paused already (an operator's hold stays as it is: the
// archived head is halted by the gap check once it ends); 1 when it
// halted s. It needs the helpers of commonLua.
const haltLua = `
local function seq_halt(s, pos, label, why)
  local m = redis.call('HMGET', s, 'd', 'p:' .. num(pos), 'h')
  local d = tonumber(m[1])
  if not d or pos ~= d + 1 or m[3] then return 0 end
  local rec = m[2]
  local sp = rec and string.find(rec, ' ', 1, true)
  if not sp or not string.find(string.sub(rec, 1, 1), '%d') or string.sub(rec, sp + 1) ~= label then return 0 end
  redis.call('HSET', s, 'h', cjson.encode({by = 'keyorder', reason = why, at = num(nowms()), halted = label}))
  redis.call('PERSIST', s)
  return 1
end
`

// haltScript halts a sequence at its head (seq_halt), for the gap check
// that finds the head's task archived under [FailureHalt] without the
// halt its run would have written (see Runner.haltArchived).
//
// KEYS[1] sequence
// ARGV[1] the head's position, ARGV[2] its label, ARGV[3] why
//
// Returns 1 when it halted the sequence, 0 when it wrote nothing.
var haltScript = redis.NewScript(commonLua + haltLua + `
return seq_halt(KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3])
`)

// resumeScript ends a sequence's pause: it deletes the field h, lets the
// sequence expire again after the retention, and calls the holder of the
// head, parked while it was paused (and those of the IN_PLACE positions
// after it), as a release does (notify).
//
// KEYS[1] sequence, KEYS[2] the key's lock hash (named in the notice)
// ARGV[1] notice channel, ARGV[2] sequence retention in ms
//
// Returns {1, pause, wake} when it resumed the sequence, pause being the
// field h it deleted and wake the labels of the parked holders called
// (newline separated, "" when none); {0, "", ""} when it was not paused.
var resumeScript = redis.NewScript(commonLua + `
local old = redis.call('HGET', KEYS[1], 'h')
if not old then return {0, '', ''} end
redis.call('HDEL', KEYS[1], 'h')
if redis.call('EXISTS', KEYS[1]) == 0 then return {1, old, ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local d = tonumber(redis.call('HGET', KEYS[1], 'd'))
local wake = ''
if d then wake = notify(ARGV[1], KEYS[2], KEYS[1], d + 1, false) end
return {1, old, wake}
`)
