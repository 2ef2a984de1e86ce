// Package redisstore is the order store on Redis: the embedded default
// backend of orderworker and the verification oracle that the other
// backends are tested against. It implements orders.Store; the model, the
// errors and the checks are package orders'.
//
// On the Redis that also holds the per-order lock (internal/lock), it can
// save a round trip per task: given the writer's lock hold ([WithLock]), it
// refuses a fence older than the lock's newest and releases the lock, and
// passes the order's turn on, in the script that commits a modify. That is
// the only tie between this store and the lock, and the [LockHold]
// interface names it.
package redisstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/v9"
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
//	ow:order:{SO1}:history  list of JSON history entries, oldest first
//	ow:order:{SO1}:events   hash: event ID -> JSON of the recorded outcome
//	ow:order:{SO1}:claim    string "FROM\nEVENT" with a TTL while an exchange
//	                        of order FROM by EVENT is creating SO1
//
// The history and the events hash grow by one entry per applied write and
// are kept as long as the order. A [Store.Put] keeps the fence and the
// recorded events of the order it replaces.
//
// A Store is safe for concurrent use, by goroutines and by processes:
// each write is one atomic script. It does not own the client, and has no
// Close.
type Store struct {
	rdb      redis.UniversalClient
	prefix   string
	claimTTL time.Duration
}

var _ orders.Store = (*Store)(nil)

// New returns a store that keeps orders in rdb. It returns an error
// when rdb is nil or cfg is invalid.
func New(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("redisstore: nil redis client")
	}
	s := &Store{
		rdb:      rdb,
		prefix:   cmp.Or(cfg.Prefix, "ow:"),
		claimTTL: cmp.Or(cfg.ClaimTTL, 24*time.Hour),
	}
	if strings.ContainsAny(s.prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains a brace", s.prefix)
	}
	if s.claimTTL < time.Millisecond {
		return nil, fmt.Errorf("redisstore: claim TTL %v is below 1ms", s.claimTTL)
	}
	return s, nil
}

// LockHold is the writer's hold of the order's lock (internal/lock), as the
// store uses it when the lock lives on the same Redis: it is the store's
// only tie to the lock. Given one (see [WithLock]), every write also refuses
// a fence older than the newest the lock has handed out (FenceKey), so a
// holder whose lease has passed to someone else cannot write even before
// the new holder's first write; and the script that commits a modify also
// releases the lock and passes the order's turn on (Handoff, with
// lock.CommitLua's lock_commit), which saves the release's round trip per
// task. An exchange, which writes again after closing the order, leaves the
// release to the caller. *lock.Lease implements it.
type LockHold interface {
	// FenceKey returns the key of the lock's newest handed-out fence. It
	// must carry the order's hash tag ("{<order_no>}"), so that one script
	// touches one Cluster slot; "" means none.
	FenceKey() string
	// Handoff returns what the commit script needs to release the lock
	// and pass its turn on, or nil to leave the release to the caller. The
	// store calls its Committing before the script and its Released when
	// the script released the lock.
	Handoff() *lock.Handoff
}

var _ LockHold = (*lock.Lease)(nil)

type lockKey struct{}

// WithLock returns a copy of ctx that offers the writer's lock hold to the
// store (see [LockHold]). Other stores ignore it, so a caller may offer it
// whatever the store. The write's fence still comes from the
// [orders.Write] in ctx.
func WithLock(ctx context.Context, hold LockHold) context.Context {
	return context.WithValue(ctx, lockKey{}, hold)
}

// orderKey is the hash that holds order no.
func (s *Store) orderKey(no string) string { return s.prefix + "order:{" + no + "}" }

// historyKey is the list of order no's history entries.
func (s *Store) historyKey(no string) string { return s.orderKey(no) + ":history" }

// eventsKey is the hash of order no's recorded outcomes by event ID.
func (s *Store) eventsKey(no string) string { return s.orderKey(no) + ":events" }

// claimKey reserves order number no for the exchange that will create it.
func (s *Store) claimKey(no string) string { return s.orderKey(no) + ":claim" }

// luaLib holds the helpers the write scripts share. Every value they store
// or encode is a string, so cjson never has to format a number (it would
// print large ones as floats) or encode an empty table (it would print {}
// for an empty list).
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

-- append adds a history entry to list key. seq is the change's position in
-- its order's sequence, or '' for none.
local function append(key, event, typ, fence, worker, started, ended, version, detail, seq)
  if started == '' then started = ended end
  local e = {
    event_id = event, type = typ, fence = fence, worker = worker,
    started_at = started, ended_at = ended, version = tostring(version),
    detail = detail}
  if seq ~= '' then e.seq = seq end
  redis.call('RPUSH', key, cjson.encode(e))
end

-- record encodes the outcome of an event: its type, the fingerprint of the
-- request, the replacement's number (exchanges), the fence it was written
-- under and the order hash at key without its fence.
local function record(key, typ, fp, newno, fence)
  local flat = redis.call('HGETALL', key)
  local o = {}
  for i = 1, #flat, 2 do o[flat[i]] = flat[i + 1] end
  o.fence = nil
  return cjson.encode({type = typ, fp = fp, new_order_no = newno, fence = fence, order = o})
end
`

// applyScript applies one fenced event to an existing, active order: a
// modify, or the first half of an exchange (closing the order). When it is
// given the order lock's hash, it also releases the lock (owner-checked,
// with lock.CommitLua) before it returns, whatever the outcome: the
// caller's work ends with this write. Given the order's sequence too, it
// passes the caller's turn on unless the write was refused as stale (a
// missing order, a closed one, a replay and an applied change all end the
// turn's work).
//
// KEYS[1] order hash, KEYS[2] history list, KEYS[3] events hash,
// KEYS[4] (optional) the order lock's newest handed-out fence,
// KEYS[5] (optional, with KEYS[4]) the order lock's hash,
// KEYS[6] (optional, with KEYS[5]) the order's sequence
// ARGV[1] event ID, ARGV[2] fence (decimal), ARGV[3] worker,
// ARGV[4] started_at (µs, or "" for now), ARGV[5] request fingerprint,
// ARGV[6] history detail, ARGV[7] type, ARGV[8] replacement's number or "",
// ARGV[9] the change's position for the history, or "",
// ARGV[10] lock owner, ARGV[11] lock notice channel (with KEYS[5]),
// ARGV[12] the turn's position, ARGV[13] sequence retention in ms (with
// KEYS[6]), ARGV[14...] field, value pairs to set on the order.
//
// Returns one of the following, followed with KEYS[5] by "1" when it
// released the lock and "0" when the lock was not the caller's, and with
// KEYS[6] by "1" when it passed the turn on and "0" when not, and by the
// label of the next position when its holder is parked ("" otherwise)
//
//	{"notfound"}
//	{"replay", record}              the event was applied before; no write
//	{"closed", status, exchanged_to}
//	{"stale", newest fence}          older than the order's or the lock's newest
//	{"ok", record}                  applied: fence stored, version bumped,
//	                                history appended, outcome recorded
var applyScript = redis.NewScript(luaLib + lock.CommitLua + `
local function apply()
  if redis.call('EXISTS', KEYS[1]) == 0 then return {'notfound'} end
  local rec = redis.call('HGET', KEYS[3], ARGV[1])
  if rec then return {'replay', rec} end
  local st = redis.call('HMGET', KEYS[1], 'status', 'exchanged_to', 'fence')
  if st[1] ~= 'active' then return {'closed', st[1] or '', st[2] or ''} end
  if st[3] and older(ARGV[2], st[3]) then return {'stale', st[3]} end
  if KEYS[4] then
    local lf = redis.call('GET', KEYS[4])
    if lf and older(ARGV[2], lf) then return {'stale', lf} end
  end
  local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
  local t = now()
  redis.call('HSET', KEYS[1], 'fence', ARGV[2], 'updated_at', t, unpack(ARGV, 14))
  append(KEYS[2], ARGV[1], ARGV[7], ARGV[2], ARGV[3], ARGV[4], t, v, ARGV[6], ARGV[9])
  rec = record(KEYS[1], ARGV[7], ARGV[5], ARGV[8], ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[1], rec)
  return {'ok', rec}
end
local r = apply()
if KEYS[5] then
  local finish = KEYS[6] ~= nil and r[1] ~= 'stale'
  local released, wake = lock_commit(KEYS[5], ARGV[10], ARGV[11], KEYS[6], tonumber(ARGV[12]), finish, ARGV[13])
  r[#r + 1] = tostring(released)
  if KEYS[6] then
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
// KEYS[1] replacement's order hash, KEYS[2] its events hash, KEYS[3] its
// claim key
// ARGV[1] exchanged order's number, ARGV[2] event ID, ARGV[3] claim TTL (ms)
//
// Returns {"done"} when the event already created the replacement, {"ok"}
// when the claim is held (new or renewed), {"exists"} when the number is
// taken by another order, {"claimed", "FROM\nEVENT"} when another exchange
// holds the claim.
var claimScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return {'done'} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local v = ARGV[1] .. '\n' .. ARGV[2]
local c = redis.call('GET', KEYS[3])
if c and c ~= v then return {'claimed', c} end
redis.call('SET', KEYS[3], v, 'PX', ARGV[3])
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
// KEYS[1] replacement's order hash, KEYS[2] its history list, KEYS[3] its
// events hash, KEYS[4] its claim key
// ARGV[1] event ID, ARGV[2] fence (that the exchanged order was closed
// under), ARGV[3] worker, ARGV[4] started_at (µs or ""), ARGV[5] request
// fingerprint, ARGV[6] history detail, ARGV[7] exchanged order's number,
// ARGV[8] replacement's number, ARGV[9] address, ARGV[10] remark,
// ARGV[11] items (JSON)
//
// Returns {"replay", record} when the event already created it, {"exists"}
// when the number is taken by another order, {"claimed", "FROM\nEVENT"} when
// another exchange holds the claim, or {"ok", record} after creating the
// order (version 1, no fence yet), its first history entry and the recorded
// outcome, and dropping the claim.
var createScript = redis.NewScript(luaLib + `
local rec = redis.call('HGET', KEYS[3], ARGV[1])
if rec then return {'replay', rec} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local c = redis.call('GET', KEYS[4])
if c and c ~= ARGV[7] .. '\n' .. ARGV[1] then return {'claimed', c} end
local t = now()
redis.call('HSET', KEYS[1], 'order_no', ARGV[8], 'status', 'active',
  'address', ARGV[9], 'remark', ARGV[10], 'items', ARGV[11], 'version', '1',
  'exchanged_to', '', 'exchanged_from', ARGV[7], 'updated_at', t)
append(KEYS[2], ARGV[1], 'order:created', ARGV[2], ARGV[3], ARGV[4], t, 1, ARGV[6], '')
rec = record(KEYS[1], 'order:created', ARGV[5], '', ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], rec)
redis.call('DEL', KEYS[4])
return {'ok', rec}
`)

// putScript creates or replaces an order, keeping its fence and events.
//
// KEYS[1] order hash, KEYS[2] history list
// ARGV[1] worker, ARGV[2] started_at (µs or ""), ARGV[3] history detail,
// ARGV[4...] field, value pairs (every field but version, updated_at and
// fence)
//
// Returns the new version.
var putScript = redis.NewScript(luaLib + `
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
local t = now()
redis.call('HSET', KEYS[1], 'updated_at', t, unpack(ARGV, 4))
append(KEYS[2], '', 'order:put', '0', ARGV[1], ARGV[2], t, v, ARGV[3], '')
return v
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

// History returns the order's history, oldest first. It returns orders.ErrNotFound
// when there is no such order, and orders.ErrInvalid for a malformed order number.
func (s *Store) History(ctx context.Context, orderNo string) ([]orders.Entry, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	var exists *redis.IntCmd
	var lines *redis.StringSliceCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, s.orderKey(orderNo))
		lines = p.LRange(ctx, s.historyKey(orderNo), 0, -1)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", orderNo, err)
	}
	if exists.Val() == 0 {
		return nil, fmt.Errorf("history %s: %w", orderNo, orders.ErrNotFound)
	}
	entries := make([]orders.Entry, 0, len(lines.Val()))
	for i, line := range lines.Val() {
		e, err := decodeEntry(line)
		if err != nil {
			return nil, fmt.Errorf("history %s: entry %d: %w", orderNo, i, err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// Put creates or replaces order o.No with o's status (active when empty),
// address, remark, items, exchanged_to and exchanged_from. The version goes
// up by one (to 1 for a new order) and a history entry of type orders.TypePut is
// appended; o.Version and o.UpdatedAt are ignored. Put is not fenced and
// not idempotent, but it keeps the order's newest fence and recorded
// events, so a late lock holder still cannot write and a retried event is
// still a replay. A [orders.Write] in ctx, when present, names the worker in the
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
		w.Worker, micros(w.StartedAt), "put: " + string(o.Status),
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

// Modify applies c to the active order orderNo, once per eventID, under the
// fence of the [orders.Write] in ctx. On the first application it sets the changed
// fields, stores the fence as the order's newest, bumps the version, appends
// a history entry of type orders.TypeModify, and records the resulting order under
// eventID. A repeat of eventID returns that recorded order with Replayed set
// and writes nothing, whatever its fence and even if the order has since
// changed or closed.
//
// It returns orders.ErrNoFence without a fenced orders.Write; orders.ErrInvalid for an empty
// eventID, a malformed order number or bad items; orders.ErrNotFound; orders.ErrClosed
// (a *orders.ClosedError naming the replacement) for an exchanged or cancelled
// order; orders.ErrStaleFence when a newer fence has written to the order; and
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
	var fields []any
	var changed []string
	if c.Address != nil {
		fields = append(fields, "address", *c.Address)
		changed = append(changed, "address")
	}
	if c.Remark != nil {
		fields = append(fields, "remark", *c.Remark)
		changed = append(changed, "remark")
	}
	if c.Items != nil {
		items, err := encodeItems(c.Items)
		if err != nil {
			return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
		}
		fields = append(fields, "items", items)
		changed = append(changed, "items")
	}
	detail := "no changes"
	if len(changed) > 0 {
		detail = "changed " + strings.Join(changed, ", ")
	}
	fp := fingerprint(modifyRequest(c))
	rec, replayed, err := s.apply(ctx, w, eventID, orderNo, orders.TypeModify, fp, detail, "", fields)
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	o, err := decodeOrder(rec.Order)
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: event %s: %w", orderNo, eventID, err)
	}
	return orders.Result{Order: o, Replayed: replayed}, nil
}

// Exchange closes the active order orderNo as exchanged and creates its
// replacement, once per eventID, under the fence of the [orders.Write] in ctx.
// Result.Order is the replacement; read the exchanged order with Get.
//
// The replacement is numbered x.NewOrderNo, or [tasks.ReplacementOrderNo] of
// orderNo and eventID when that is empty. It is active, has x.Items, the
// exchanged order's address and remark, ExchangedFrom set to orderNo and
// version 1, and its history starts with an entry of type orders.TypeCreated. The
// exchanged order gets status exchanged, ExchangedTo, a bumped version and
// a history entry of type orders.TypeExchange whose detail carries x.Reason. The
// new order's fence state starts empty: its first fenced writer sets it.
//
// The two orders live in different Redis Cluster slots, so the exchange is
// three idempotent steps: reserve the replacement's number, close the
// order (recording the outcome with its address and remark under eventID),
// create the replacement from that record. A retry after a crash between
// them completes the exchange. Replayed is true only when an earlier call
// had already done every step, and Result.Order is then the replacement as
// it was created.
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
	fp := fingerprint(exchangeRequest(x))
	rec, replayed, err := s.closeOrder(ctx, w, eventID, orderNo, newNo, fp, x.Reason)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	b, bReplayed, err := s.createReplacement(ctx, w, eventID, rec, items, fp)
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	return orders.Result{Order: b, Replayed: replayed && bReplayed}, nil
}

// closeOrder is the first half of an exchange: it reserves newNo and closes
// orderNo as exchanged to it, or replays an earlier close by the same event.
// It returns the recorded outcome of the close. Tests call it alone to
// simulate a crash before the replacement is created.
func (s *Store) closeOrder(ctx context.Context, w orders.Write, eventID, orderNo, newNo, fp, reason string) (record, bool, error) {
	claim := orderNo + "\n" + eventID
	claimed, err := s.claim(ctx, eventID, orderNo, newNo)
	if err != nil {
		return record{}, false, err
	}
	detail := "exchanged to " + newNo
	if reason != "" {
		detail += ": " + reason
	}
	fields := []any{"status", string(orders.StatusExchanged), "exchanged_to", newNo}
	rec, replayed, err := s.apply(ctx, w, eventID, orderNo, orders.TypeExchange, fp, detail, newNo, fields)
	if claimed && (err != nil || rec.NewOrderNo != newNo) {
		// The claim is ours and no longer needed. A failure to drop it is
		// not the caller's problem: it expires after ClaimTTL.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = unclaimScript.Run(ctx, s.rdb, []string{s.claimKey(newNo)}, claim).Err()
		cancel()
	}
	if err != nil {
		return record{}, false, err
	}
	return rec, replayed, nil
}

// claim reserves newNo for the exchange of orderNo by eventID. It returns
// whether it holds a claim (false when the event already created newNo).
func (s *Store) claim(ctx context.Context, eventID, orderNo, newNo string) (bool, error) {
	keys := []string{s.orderKey(newNo), s.eventsKey(newNo), s.claimKey(newNo)}
	res, err := claimScript.Run(ctx, s.rdb, keys, orderNo, eventID, s.claimTTL.Milliseconds()).StringSlice()
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
// replacement named in rec, the recorded close of the exchanged order, or
// returns it as recorded when the event already created it.
func (s *Store) createReplacement(ctx context.Context, w orders.Write, eventID string, rec record, items, fp string) (orders.Order, bool, error) {
	a, err := decodeOrder(rec.Order)
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("event %s: %w", eventID, err)
	}
	newNo := rec.NewOrderNo
	keys := []string{s.orderKey(newNo), s.historyKey(newNo), s.eventsKey(newNo), s.claimKey(newNo)}
	detail := "created from " + a.No + " by event " + eventID
	// The replacement's first entry carries the fence the exchanged order
	// was closed under, also when a retry (under a newer fence) completes
	// an exchange that a crash cut short.
	fence := cmp.Or(rec.Fence, strconv.FormatInt(w.Fence, 10))
	res, err := createScript.Run(ctx, s.rdb, keys,
		eventID, fence, w.Worker, micros(w.StartedAt), fp, detail,
		a.No, newNo, a.Address, a.Remark, items).StringSlice()
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
	b, err := decodeRecord(res[1], orders.TypeCreated, fp, eventID)
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("create %s: %w", newNo, err)
	}
	o, err := decodeOrder(b.Order)
	if err != nil {
		return orders.Order{}, false, fmt.Errorf("create %s: %w", newNo, err)
	}
	if o.ExchangedFrom != a.No {
		return orders.Order{}, false, fmt.Errorf("new order %s was created by event %s from order %s: %w", newNo, eventID, o.ExchangedFrom, orders.ErrConflict)
	}
	return o, replayed, nil
}

// apply runs applyScript and maps its reply: the recorded outcome and
// whether it was a replay, or the package's error.
func (s *Store) apply(ctx context.Context, w orders.Write, eventID, orderNo, typ, fp, detail, newNo string, fields []any) (record, bool, error) {
	keys := []string{s.orderKey(orderNo), s.historyKey(orderNo), s.eventsKey(orderNo)}
	tag := "{" + orderNo + "}"
	var lockFenceKey string
	var h *lock.Handoff
	if hold, ok := ctx.Value(lockKey{}).(LockHold); ok {
		lockFenceKey = hold.FenceKey()
		// Only a modify ends its work with this write; an exchange still
		// creates the replacement after it.
		if typ == orders.TypeModify {
			h = hold.Handoff()
		}
	}
	if lockFenceKey != "" {
		if !strings.Contains(lockFenceKey, tag) {
			return record{}, false, fmt.Errorf("lock fence key %q lacks the hash tag %s: %w", lockFenceKey, tag, orders.ErrInvalid)
		}
		keys = append(keys, lockFenceKey)
	}
	owner, channel, turn := "", "", ""
	var seqTTL int64
	if h != nil {
		if lockFenceKey == "" || !strings.Contains(h.Key, tag) {
			return record{}, false, fmt.Errorf("lock handoff %q needs the lock fence key and the hash tag %s: %w", h.Key, tag, orders.ErrInvalid)
		}
		keys = append(keys, h.Key)
		owner, channel = h.Owner, h.Channel
		if h.SeqKey != "" {
			if !strings.Contains(h.SeqKey, tag) {
				return record{}, false, fmt.Errorf("lock handoff sequence %q lacks the hash tag %s: %w", h.SeqKey, tag, orders.ErrInvalid)
			}
			keys = append(keys, h.SeqKey)
			turn, seqTTL = strconv.FormatInt(h.Pos, 10), h.SeqTTL
		}
		h.Committing()
	}
	fence := strconv.FormatInt(w.Fence, 10)
	seq := ""
	if w.Seq > 0 {
		seq = strconv.FormatInt(w.Seq, 10)
	}
	args := append([]any{eventID, fence, w.Worker, micros(w.StartedAt), fp, detail, typ, newNo, seq, owner, channel, turn, seqTTL}, fields...)
	res, err := applyScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return record{}, false, err
	}
	if h != nil {
		finished, wake := false, ""
		if h.SeqKey != "" && len(res) > 3 {
			finished, wake = res[len(res)-2] == "1", res[len(res)-1]
			res = res[:len(res)-2]
		}
		if len(res) > 1 {
			if res[len(res)-1] == "1" {
				h.Released(finished, wake)
			}
			res = res[:len(res)-1]
		}
	}
	switch res[0] {
	case "notfound":
		return record{}, false, orders.ErrNotFound
	case "closed":
		return record{}, false, &orders.ClosedError{OrderNo: orderNo, Status: orders.Status(res[1]), ExchangedTo: res[2]}
	case "stale":
		return record{}, false, fmt.Errorf("fence %s is older than %s: %w", fence, res[1], orders.ErrStaleFence)
	case "ok", "replay":
		rec, err := decodeRecord(res[1], typ, fp, eventID)
		return rec, res[0] == "replay", err
	}
	return record{}, false, fmt.Errorf("unexpected reply %q", res)
}

// record is the outcome of an event as the scripts store it.
type record struct {
	Type       string            `json:"type"`
	FP         string            `json:"fp"`
	NewOrderNo string            `json:"new_order_no"`
	Fence      string            `json:"fence"` // the fence it was written under; "" in records older than this field
	Order      map[string]string `json:"order"`
}

// decodeRecord decodes a recorded outcome and checks that it is the outcome
// of the same request: same type and fingerprint.
func decodeRecord(s, typ, fp, eventID string) (record, error) {
	var rec record
	if err := json.Unmarshal([]byte(s), &rec); err != nil {
		return record{}, fmt.Errorf("event %s: decode outcome: %w", eventID, err)
	}
	if rec.Type != typ {
		return record{}, fmt.Errorf("event %s was already applied as %s: %w", eventID, rec.Type, orders.ErrConflict)
	}
	if rec.FP != fp {
		return record{}, fmt.Errorf("event %s was already applied with a different request: %w", eventID, orders.ErrConflict)
	}
	return rec, nil
}

// decodeOrder builds an order from the fields of its hash (or of a recorded
// outcome, which has the same fields).
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

// decodeEntry decodes a history entry as the scripts write it: a JSON object
// whose values are all strings.
func decodeEntry(s string) (orders.Entry, error) {
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
// recorded before, which would turn their retries into orders.ErrConflict: add
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
// different request is told apart from a retry.
func fingerprint(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// The request types are plain structs of strings and ints.
		panic(fmt.Sprintf("redisstore: fingerprint: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
