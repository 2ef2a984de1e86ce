package token

import "github.com/redis/go-redis/v9"

// Key and channel layout, for a Config.Key of K (see its default):
//
//	K            string: the access token, with a TTL of expires_in − Skew
//	K:lock       string: the refresh lock, holding a random owner ID, with a
//	             TTL of LockTTL (FailureBackoff after a failed fetch)
//	K:refreshed  pub/sub channel: a notice (the new token's fingerprint,
//	             never the token) published when a token is stored
//
// K carries a hash tag, so the token and lock keys share one Cluster slot and
// every script below touches one slot only.

// lockKey and channelName derive the lock key and the notice channel from
// the token key.
func lockKey(key string) string     { return key + ":lock" }
func channelName(key string) string { return key + ":refreshed" }

// readScript reads the token and its remaining lifetime in one round trip.
//
// KEYS[1] token
//
// Returns {token, PTTL in ms}, or nil when there is no token. A token without
// a TTL (not written by this package) counts as missing, so that a refresh
// replaces it with one that expires.
var readScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return false end
return {v, ttl}
`)

// acquireScript re-checks the token and, when it still needs replacing,
// takes the refresh lock, in one step.
//
// A lock that no refresh can have set is stale, and taken over: one that
// never expires, one of another type than a string, or one whose
// remaining lease is longer than the longest a Cache sets (ARGV[5], the
// larger of LockTTL and FailureBackoff). So a lock set by hand (or by a
// Redis user that should not have been able to) with a lease of a day
// holds the refreshes up for one fallback interval, not a day. A replica
// configured with a shorter lease than another's may take over the
// other's lock: that costs one more fetch, never a wrong token.
//
// KEYS[1] token, KEYS[2] lock
// ARGV[1] owner ID, ARGV[2] lock TTL in ms, ARGV[3] the token the caller
// wants replaced ("" when it saw none), ARGV[4] RefreshBefore in ms,
// ARGV[5] the longest lease a refresh sets, in ms
//
// Returns {1, token, PTTL in ms} when the token needs no refresh (it differs
// from ARGV[3], or has more than ARGV[4] left); {2} when the caller now holds
// the lock and must refresh; {3, lock PTTL in ms} when another owner holds
// the lock; {4, the stale lock's PTTL in ms (-1: none)} when the caller took
// over a stale lock and must refresh.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 and (v ~= ARGV[3] or ttl > tonumber(ARGV[4])) then
    return {1, v, ttl}
  end
end
local t = redis.call('TYPE', KEYS[2])['ok']
if t == 'none' then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {2}
end
local lttl = redis.call('PTTL', KEYS[2])
if t ~= 'string' or lttl < 0 or lttl > tonumber(ARGV[5]) then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {4, lttl}
end
return {3, lttl}
`)

// storeScript stores a new token, releases the caller's lock (if it still
// holds it) and publishes a notice.
//
// When the caller's lease ran out during the fetch and another replica holds
// the lock now, the new token is still stored if Redis has no token or only
// a due one: a good token now beats waiting for the other fetch, which may
// be as slow. Only when a token that is not due is stored does the caller
// leave it alone.
//
// KEYS[1] token, KEYS[2] lock
// ARGV[1] owner ID, ARGV[2] token, ARGV[3] TTL in ms, ARGV[4] notice
// channel, ARGV[5] notice, ARGV[6] RefreshBefore in ms
//
// Returns 1 when stored, 0 when left alone (nothing is written then).
var storeScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[6]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if holder then redis.call('DEL', KEYS[2]) end
-- A refused notice (a Redis user without the channel in its ACL) must not
-- fail the store that happened: waiters then find the token by polling.
redis.pcall('PUBLISH', ARGV[4], ARGV[5])
return 1
`)

// releaseScript gives the refresh lock back if the caller still owns it:
// it deletes it, or, after a failed fetch, keeps it for a short backoff so
// that no replica asks the upstream again before then.
//
// KEYS[1] lock
// ARGV[1] owner ID, ARGV[2] backoff in ms (0 deletes the lock)
//
// Returns 1 when the lock was the caller's, 0 otherwise (nothing changes).
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
`)

// invalidateScript deletes the token only if it is the given one, so that a
// late 401 for an old token never deletes its replacement.
//
// KEYS[1] token
// ARGV[1] the token that failed
//
// Returns 1 when deleted, 0 when the key held another token or none.
var invalidateScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
