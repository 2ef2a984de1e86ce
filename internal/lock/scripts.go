package lock

import "github.com/redis/go-redis/v9"

// The lock of a key is a hash at lockKey with the fields
//
//	owner  the holder's unique token (a UUID)
//	meta   the holder's description, e.g. "order:exchange 9f1c…"
//	fence  the fencing token handed to the holder
//	w      present once a waiter has found the lock held
//
// and the newest fencing token handed out for the key is a string at
// fenceKey, kept for Config.FenceRetention after the last acquire. Both keys
// share the hash tag {key}, so every script touches one Cluster slot.

// acquireScript takes the lock if it is free.
//
// KEYS[1] lock hash, KEYS[2] fence counter
// ARGV[1] owner token, ARGV[2] lease TTL in ms, ARGV[3] meta,
// ARGV[4] fence retention in ms
//
// Returns {1, fence} when the lock was taken, where fence is
// max(previous fence + 1, Redis TIME in µs); or {0, holder's PTTL in ms,
// holder's meta} when it is held, after marking that someone waits.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'w', '1')
  return {0, redis.call('PTTL', KEYS[1]), redis.call('HGET', KEYS[1], 'meta') or ''}
end
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
if prev and prev >= fence then fence = prev + 1 end
local s = string.format('%.0f', fence)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'meta', ARGV[3], 'fence', s)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
return {1, s}
`)

// ReleaseLua defines the Lua function release_lock(key, owner, channel):
// it deletes the lock hash at key if its owner is owner, publishes key on
// channel when a waiter marked the lock, and returns 1; otherwise it returns
// 0 and deletes nothing. A store's script on the same Redis includes it to
// release a lease in the round trip that commits the work (see
// [Lease.Handoff]); key must then be one of that script's KEYS.
const ReleaseLua = `
local function release_lock(key, owner, channel)
  if redis.call('HGET', key, 'owner') ~= owner then return 0 end
  local waited = redis.call('HEXISTS', key, 'w')
  redis.call('DEL', key)
  if waited == 1 then redis.call('PUBLISH', channel, key) end
  return 1
end
`

// releaseScript deletes the lock if the caller still owns it, and publishes
// a release notice when a waiter has marked the lock.
//
// KEYS[1] lock hash
// ARGV[1] owner token, ARGV[2] notice channel
//
// Returns 1 when released, 0 when the caller no longer held the lock (it
// expired, or someone else holds it now); nothing is deleted then.
var releaseScript = redis.NewScript(ReleaseLua + `return release_lock(KEYS[1], ARGV[1], ARGV[2])`)

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
