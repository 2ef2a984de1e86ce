package acl_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/orders"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

const password = "acl-test-secret-0123"

// setUser makes name a user with password and rules on the server of admin.
func setUser(t *testing.T, admin *redis.Client, name string, rules []string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password}
	for _, r := range rules {
		args = append(args, r)
	}
	require.NoError(t, admin.Do(t.Context(), args...).Err(), "ACL SETUSER %s %s", name, strings.Join(rules, " "))
}

// denied reports whether err is Redis refusing a command, or a command run
// by a script, for want of permission.
func denied(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOPERM") ||
		strings.Contains(err.Error(), "can't access") || strings.Contains(err.Error(), "no permissions"))
}

func TestRulesRefuseBadInput(t *testing.T) {
	_, err := acl.Rules("scheduler", acl.Options{})
	require.ErrorIs(t, err, acl.ErrUnknownProcess)
	require.ErrorContains(t, err, "worker, intake, intake-admin, dashboard, dashboard-write")
	for _, p := range []string{"ow :", "ow(:", "ow):", `ow":`, "ow{:", "ow:\n", "ö:"} {
		_, err := acl.Rules(acl.Worker, acl.Options{KeyPrefix: p})
		require.ErrorIs(t, err, acl.ErrBadPrefix, "%q", p)
	}
}

func TestRulesOfTheDefaultDeployment(t *testing.T) {
	for _, p := range acl.Processes() {
		def, err := acl.Rules(p, acl.Options{})
		require.NoError(t, err)
		same, err := acl.Rules(p, acl.Options{KeyPrefix: "ow:"})
		require.NoError(t, err)
		require.Equal(t, def, same, "the default prefix is ow:")
		require.Equal(t, []string{"resetkeys", "resetchannels", "clearselectors"}, def[:3], "%s: the rules set the rights, whatever the user had", p)
		line := strings.Join(def, " ")
		for _, never := range []string{"allkeys", "allchannels", "~*", "&*", "+@dangerous", "nocommands"} {
			assert.NotContains(t, strings.Fields(line), never, p)
		}
		assert.NotContains(t, line, "token", "%s: no process reads the token without the order API", p)
		api, err := acl.Rules(p, acl.Options{OrderAPI: true})
		require.NoError(t, err)
		if p == acl.Worker {
			assert.Contains(t, strings.Join(api, " "), "~ow:token:{upstream}*", "%s: with the order API, the workers share the token", p)
		} else {
			assert.NotContains(t, strings.Join(api, " "), "token", "%s: with the order API, only the workers may touch the token", p)
		}
		assert.NotContains(t, strings.Join(api, " "), "ow:order:", "%s: with the order API, no order lives in Redis", p)
	}
}

// seed writes one key of every kind the processes use, under prefix, and
// returns their names.
func seed(t *testing.T, admin *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := t.Context()
	k := map[string]string{
		"order":   prefix + "order:{SO1}",
		"history": prefix + "order:{SO1}:history",
		"notes":   prefix + "order:{SO1}:notes",
		"evbkt":   prefix + "order:{SO1}:ev:1",
		"claim":   prefix + "order:{SO1}:claim",
		"lock":    prefix + "lock:{SO1}",
		"fence":   prefix + "lock:{SO1}:fence",
		"seq":     prefix + "lock:{SO1}:seq",
		"held":    prefix + "lock:held",
		"backlog": prefix + "lock:backlog",
		"bsum":    prefix + "lock:backlog:sum",
		"event":   prefix + "event:{e1}",
		"wait":    prefix + "wait:{SO1}",
		"token":   prefix + "token:{upstream}",
		"tlock":   prefix + "token:{upstream}:lock",
		"other":   "other:app:key",
		"queues":  "asynq:queues",
		"task":    "asynq:{q}:t:e1",
		"pending": "asynq:{q}:pending",
		"sched":   "asynq:{q}:scheduled",
		"retry":   "asynq:{q}:retry",
		"lease":   "asynq:{q}:lease",
		"active":  "asynq:{q}:active",
		"paused":  "asynq:{q}:paused",
		"servers": "asynq:servers",
		"workers": "asynq:workers",
		"sched-s": "asynq:schedulers",
		"server":  "asynq:servers:{host:1:abc}",
	}
	require.NoError(t, admin.FlushAll(ctx).Err())
	_, err := admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k["order"], "order_no", "SO1", "status", "active")
		p.RPush(ctx, k["history"], "h1")
		p.RPush(ctx, k["notes"], "n1")
		p.HSet(ctx, k["lock"], "owner", "o", "meta", "order:modify e0", "fence", "7")
		p.Set(ctx, k["fence"], "7", 0)
		p.HSet(ctx, k["seq"], "n", "2", "d", "1", "p:2", "1 order:modify e1")
		p.Set(ctx, k["event"], "order:modify SO1 ab", 0)
		p.Set(ctx, k["token"], "secret-upstream-token", 0)
		p.Set(ctx, k["other"], "v", 0)
		p.SAdd(ctx, k["queues"], "q")
		p.HSet(ctx, k["task"], "msg", "m", "state", "pending")
		p.LPush(ctx, k["pending"], "e1")
		p.ZAdd(ctx, k["sched"], redis.Z{Score: 1, Member: "e0"})
		p.ZAdd(ctx, k["retry"], redis.Z{Score: 1, Member: "e1"})
		p.ZAdd(ctx, k["lease"], redis.Z{Score: 1, Member: "e1"})
		p.ZAdd(ctx, k["held"], redis.Z{Score: 1, Member: "SO1"})
		p.ZAdd(ctx, k["servers"], redis.Z{Score: 1, Member: k["server"]})
		p.Set(ctx, k["server"], "info", 0)
		return nil
	})
	require.NoError(t, err)
	return k
}

type check struct {
	cmd     []any
	allowed bool
}

func allow(cmd ...any) check { return check{cmd, true} }
func deny(cmd ...any) check  { return check{cmd, false} }

// Lua bodies run with EVAL: what a script may do is what its user may.
const (
	luaRead  = "return redis.call('TYPE', KEYS[1])['ok']"
	luaDel   = "return redis.call('DEL', KEYS[1])"
	luaPause = "return redis.call('SET', KEYS[1], '1')"
	// luaNote writes as redisstore's annotate script does: it reads the
	// order's version and appends to its notes.
	luaNote = "local v = redis.call('HGET', KEYS[1], 'version'); redis.call('EXISTS', KEYS[1]);" +
		" redis.call('RPUSH', KEYS[2], 'n'); redis.call('LTRIM', KEYS[2], -100, -1); return v"
	// luaRewrite is a script that changes an order's field.
	luaRewrite = "return redis.call('HSET', KEYS[1], 'seq', '9007199254740991')"
)

// checks are the commands each process's user must be allowed or refused,
// on the keys of seed; api is ORDER_STORE=http.
func checks(p acl.Process, api bool, k map[string]string) []check {
	// Nobody: keyspace-wide commands, global state, other applications'
	// keys.
	cs := []check{
		deny("SCRIPT", "FLUSH"), deny("SCRIPT", "KILL"), deny("FUNCTION", "FLUSH"), deny("FUNCTION", "DELETE", "x"),
		deny("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() return 1 end)"), deny("FCALL", "f", "0"),
		deny("FLUSHALL"), deny("FLUSHDB"), deny("SWAPDB", "0", "1"), deny("SCAN", "0"), deny("KEYS", "*"),
		deny("RANDOMKEY"), deny("DBSIZE"), deny("CLUSTER", "GETKEYSINSLOT", "0", "10"), deny("CLUSTER", "COUNTKEYSINSLOT", "0"),
		deny("PUBSUB", "CHANNELS"), deny("CLIENT", "LIST"), deny("CLIENT", "KILL", "ID", "123456"), deny("CLIENT", "TRACKING", "on", "BCAST"),
		deny("CONFIG", "GET", "requirepass"), deny("CONFIG", "SET", "appendonly", "no"), deny("MEMORY", "STATS"),
		deny("ACL", "LIST"), deny("ACL", "SETUSER", "evil", "on", "nopass", "allkeys", "+@all"), deny("BGSAVE"), deny("SHUTDOWN", "NOSAVE"),
		deny("MIGRATE", "127.0.0.1", "1", k["order"], "0", "10"), deny("SORT", k["pending"]),
		deny("GET", k["other"]), deny("DEL", k["other"]), deny("PUBLISH", "other-channel", "x"),
		deny("EVAL", luaRead, "1", k["other"]),
		allow("PING"), allow("TIME"), allow("SCRIPT", "LOAD", "return 1"), allow("SCRIPT", "EXISTS", "abc"),
		allow("EVAL", "return 1", "0"), allow("CLUSTER", "KEYSLOT", "x"),
		allow("MEMORY", "USAGE", k["task"]), allow("ACL", "WHOAMI"),
	}
	// The token: the workers' with the order API, and no one else's: the
	// others may neither read it, delete it, nor hold its refresh lock.
	token := []check{deny("GET", k["token"]), deny("SET", k["token"], "forged"), deny("PUBLISH", k["token"]+":refreshed", "x"),
		deny("DEL", k["token"]), deny("SET", k["tlock"], "squatter", "NX", "PX", "86400000"), deny("EVAL", luaRead, "1", k["token"]),
		deny("EVAL_RO", luaRead, "1", k["token"]), deny("SUBSCRIBE", k["token"]+":refreshed")}
	if api && p == acl.Worker {
		token = []check{allow("GET", k["token"]), allow("SET", k["tlock"], "me", "NX", "PX", "1000"),
			allow("PUBLISH", k["token"]+":refreshed", "x"), allow("EVAL", luaRead, "1", k["token"])}
	}
	cs = append(cs, token...)
	// The Redis store's orders: written by the worker, read by the others;
	// with the order API, not in Redis at all.
	orders := func(write bool) []check {
		if api {
			return []check{deny("HGETALL", k["order"]), deny("HSET", k["order"], "status", "x")}
		}
		c := []check{allow("HGETALL", k["order"]), allow("LRANGE", k["history"], "0", "-1"), allow("EVAL_RO", luaRead, "1", k["order"]),
			allow("EVAL", luaRead, "1", k["order"])}
		if write {
			return append(c, allow("HSET", k["order"], "status", "x"), allow("DEL", k["history"]), allow("EVAL", luaDel, "1", k["history"]))
		}
		return append(c, deny("HSET", k["order"], "status", "x"), deny("DEL", k["order"]), deny("RPUSH", k["history"], "forged"),
			deny("EVAL", luaDel, "1", k["order"]), deny("EVAL", luaNote, "2", k["order"], k["notes"]), deny("RPUSH", k["notes"], "forged"))
	}
	// The operator actions' notes in an order's history (orderops,
	// redisstore's Annotate): RPUSH and LTRIM of the order's notes list,
	// nothing else of the order's keys: not a field of its hash (its
	// address, its seq), not its history of writes.
	notes := func() []check {
		if api {
			return orders(false)
		}
		return []check{
			allow("HGETALL", k["order"]), allow("LRANGE", k["history"], "0", "-1"), allow("EVAL_RO", luaRead, "1", k["order"]),
			allow("RPUSH", k["notes"], "n"), allow("LTRIM", k["notes"], "-100", "-1"), allow("LRANGE", k["notes"], "0", "-1"),
			allow("EVAL", luaNote, "2", k["order"], k["notes"]),
			deny("HSET", k["order"], "address", "forged"), deny("HSET", k["order"], "seq", "9007199254740991"),
			deny("HINCRBY", k["order"], "version", "1"), deny("HSETNX", k["order"], "x", "1"), deny("HDEL", k["order"], "fence"),
			deny("EVAL", luaRewrite, "1", k["order"]), deny("DEL", k["order"]), deny("DEL", k["history"]), deny("DEL", k["notes"]),
			deny("RPUSH", k["history"], "forged"), deny("LTRIM", k["history"], "1", "0"), deny("LPOP", k["history"]),
			deny("RENAME", k["history"], k["order"]), deny("RENAME", k["notes"], k["history"]),
			deny("EVAL", luaDel, "1", k["order"]), deny("HSET", k["evbkt"], "h", "m fp"), deny("SET", k["claim"], "x"),
			deny("HINCRBY", k["evbkt"], "h", "1"), deny("RPUSH", k["claim"], "x"),
		}
	}
	// The blocked-orders list (orderview.Reader.Blocked): pages of the
	// retry and scheduled sets and the expired leases with their tasks'
	// messages, the index of held orders and a hold's record; read only.
	blocked := []check{
		allow("ZRANGE", k["retry"], "0", "10", "WITHSCORES"), allow("ZRANGE", k["sched"], "0", "10", "WITHSCORES"),
		allow("ZRANGEBYSCORE", k["lease"], "-inf", "(5", "WITHSCORES", "LIMIT", "0", "10"), allow("ZSCORE", k["lease"], "e1"),
		allow("HGET", k["task"], "msg"), allow("ZRANGE", k["held"], "0", "10", "WITHSCORES"), allow("HGET", k["seq"], "h"),
		deny("ZADD", k["held"], "1", "SO2"), deny("ZREM", k["held"], "SO1"),
		deny("ZREM", k["retry"], "e1"),
	}
	switch p {
	case acl.Worker:
		cs = append(cs, orders(true)...)
		cs = append(cs,
			allow("HSET", k["lock"], "owner", "me"), allow("SET", k["fence"], "8"), allow("HSET", k["seq"], "d", "2"),
			allow("PUBLISH", k["lock"][:len(k["lock"])-len("{SO1}")]+"released", "x"), allow("PUBLISH", "asynq:cancel", "x"),
			allow("LMOVE", k["pending"], k["active"], "RIGHT", "LEFT"), allow("HSET", k["task"], "state", "active"), allow("DEL", k["task"]),
			allow("ZADD", k["servers"], "1", "x"), allow("SET", k["server"], "x"), allow("ZADD", k["workers"], "1", "x"),
			allow("SADD", k["queues"], "q2"), allow("SMEMBERS", k["queues"]), allow("EVAL", luaPause, "1", k["paused"]),
			deny("DEL", k["queues"]), deny("SREM", k["queues"], "q"), deny("EVAL", luaDel, "1", k["queues"]),
			deny("GET", k["event"]), deny("SET", k["event"], "x"), deny("SET", k["wait"], "1"),
			deny("ZADD", k["sched-s"], "1", "x"),
			allow("ZADD", k["backlog"], "1", k["seq"]), allow("INCRBY", k["bsum"], "1"), allow("ZREM", k["backlog"], k["seq"]),
		)
	case acl.Intake:
		cs = append(cs, orders(false)...)
		cs = append(cs, blocked...)
		cs = append(cs,
			// acceptance
			allow("SET", "ow:event:{e2}", "order:modify SO1 cd", "NX", "GET", "PX", "1000"), allow("HINCRBY", k["seq"], "n", "1"),
			allow("PEXPIRE", k["seq"], "100000"), allow("SET", k["wait"], "1", "PX", "60000"),
			allow("EXISTS", k["task"]), allow("HSET", "asynq:{q}:t:e2", "msg", "m", "state", "pending"), allow("LPUSH", k["pending"], "e2"),
			allow("ZADD", k["sched"], "5", "e3"), allow("ZADD", k["retry"], "5", "e5"), allow("SADD", k["queues"], "q"),
			allow("EVAL", "redis.call('HSET', KEYS[1], 'state', 'pending'); redis.call('LPUSH', KEYS[2], 'e4'); return redis.call('SADD', KEYS[3], 'q')",
				"3", "asynq:{q}:t:e4", k["pending"], k["queues"]),
			// reads: tasks, the lock and the sequence
			allow("HGETALL", k["task"]), allow("LRANGE", k["pending"], "0", "-1"), allow("SMEMBERS", k["queues"]),
			allow("HMGET", k["lock"], "owner", "meta", "fence"), allow("HGETALL", k["seq"]), allow("GET", k["fence"]),
			allow("EVAL", luaRead, "2", k["task"], k["lock"]),
			// the index of backlogs, which a reservation counts in
			allow("ZADD", k["backlog"], "1", k["seq"]), allow("INCRBY", k["bsum"], "1"), allow("ZREM", k["backlog"], k["seq"]),
			// but nothing else
			deny("HSET", k["lock"], "owner", "me"), deny("DEL", k["lock"]), deny("SET", k["fence"], "1"),
			deny("DEL", k["queues"]), deny("SREM", k["queues"], "q"), deny("EVAL", luaDel, "1", k["queues"]),
			deny("DEL", k["pending"]), deny("LREM", k["pending"], "0", "e1"), deny("RPOP", k["pending"]), deny("ZADD", k["pending"], "1", "x"),
			deny("DEL", k["task"]), deny("HDEL", k["task"], "msg"), deny("LPUSH", k["sched"], "x"), deny("ZREM", k["sched"], "e0"),
			deny("ZREM", k["retry"], "e1"), deny("LPUSH", k["active"], "x"), deny("SET", k["paused"], "1"), deny("EVAL", luaPause, "1", k["paused"]),
			deny("ZADD", k["servers"], "1", "x"), deny("PUBLISH", "asynq:cancel", "e1"), deny("PUBLISH", "ow:lock:released", "x"),
		)
	case acl.Dashboard:
		cs = append(cs, orders(false)...)
		cs = append(cs, blocked...)
		cs = append(cs,
			allow("INFO"), allow("SMEMBERS", k["queues"]), allow("HGETALL", k["task"]), allow("LRANGE", k["pending"], "0", "-1"),
			allow("HGETALL", k["seq"]), allow("HMGET", k["lock"], "owner"), allow("EVAL", luaRead, "2", k["pending"], k["sched"]),
			// asynq's Inspector prunes the expired servers as it lists them.
			allow("EVAL", "redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf'); return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', 0)", "1", k["servers"]),
			allow("ZREMRANGEBYSCORE", k["workers"], "-inf", "0"), allow("ZREMRANGEBYSCORE", k["sched-s"], "-inf", "0"),
			deny("DEL", k["queues"]), deny("SADD", k["queues"], "x"), deny("SREM", k["queues"], "q"), deny("EVAL", luaDel, "1", k["queues"]),
			deny("SET", k["paused"], "1"), deny("EVAL", luaPause, "1", k["paused"]), deny("DEL", k["task"]), deny("LPUSH", k["pending"], "x"),
			deny("ZREMRANGEBYSCORE", k["sched"], "-inf", "+inf"), deny("ZADD", k["servers"], "1", "x"), deny("DEL", k["server"]),
			deny("PUBLISH", "asynq:cancel", "e1"), deny("HSET", k["seq"], "d", "2"), deny("HSET", k["lock"], "owner", "me"),
			deny("GET", k["event"]),
			// the gauges read the index of backlogs, and write nothing
			allow("ZCARD", k["backlog"]), allow("ZRANGE", k["backlog"], "0", "0", "REV", "WITHSCORES"), allow("GET", k["bsum"]),
			deny("ZADD", k["backlog"], "1", k["seq"]), deny("INCRBY", k["bsum"], "1"),
		)
	case acl.DashboardWrite:
		cs = append(cs, notes()...)
		cs = append(cs, blocked[:7]...) // its writes of asynq's sets are asynqmon's
		cs = append(cs,
			allow("INFO"), allow("SET", k["paused"], "1"), allow("EVAL", luaPause, "1", k["paused"]), allow("PUBLISH", "asynq:cancel", "e1"),
			allow("DEL", k["task"]), allow("SREM", k["queues"], "q"), // asynqmon's Delete and queue removal
			// the operator actions
			allow("HSET", k["seq"], "h", "{}"), allow("ZADD", k["held"], "1", "SO1"), allow("PUBLISH", "ow:lock:released", "x"),
			allow("ZREM", k["backlog"], k["seq"]), allow("INCRBY", k["bsum"], "-1"),
			deny("HSET", k["lock"], "owner", "me"), deny("SET", k["fence"], "1"), deny("SET", k["event"], "x"),
		)
	case acl.IntakeAdmin:
		cs = append(cs, notes()...)
		cs = append(cs,
			// the intake's
			allow("HINCRBY", k["seq"], "n", "1"), allow("SET", k["wait"], "1", "PX", "60000"), allow("LPUSH", k["pending"], "e2"),
			// the operator actions: RunTask, ArchiveTask, Front; the sequence, the index, the notice
			allow("ZREM", k["sched"], "e0"), allow("LREM", k["pending"], "0", "e1"), allow("ZADD", "asynq:{q}:archived", "1", "e1"),
			allow("RPUSH", k["pending"], "e1"), allow("HSET", k["task"], "state", "archived"),
			allow("HSET", k["seq"], "h", "{}"), allow("PERSIST", k["seq"]), allow("ZADD", k["held"], "1", "SO1"), allow("ZREM", k["held"], "SO1"),
			allow("ZREM", k["backlog"], k["seq"]), allow("INCRBY", k["bsum"], "-1"),
			allow("PUBLISH", "ow:lock:released", "x"),
			// but not the locks, the orders' data, asynq's servers or the queue list
			deny("HSET", k["lock"], "owner", "me"), deny("DEL", k["lock"]), deny("SET", k["fence"], "1"),
			deny("DEL", k["queues"]), deny("SREM", k["queues"], "q"), deny("ZADD", k["servers"], "1", "x"),
			deny("PUBLISH", "asynq:cancel", "e1"),
		)
	}
	return cs
}

// TestEachProcessGetsWhatItNeedsAndNothingElse runs, as a user with each
// process's rules, the commands it needs and those it must not have, on a
// server of its own (a rule that let FLUSHALL through must not wipe the
// other tests' data).
func TestEachProcessGetsWhatItNeedsAndNothingElse(t *testing.T) {
	srv := redistest.Dedicated(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	ctx := t.Context()
	for _, api := range []bool{false, true} {
		for _, p := range acl.Processes() {
			t.Run(fmt.Sprintf("%s/api=%v", p, api), func(t *testing.T) {
				rules, err := acl.Rules(p, acl.Options{OrderAPI: api})
				require.NoError(t, err)
				user := "ow-" + string(p)
				setUser(t, admin, user, rules)
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: password, MaxRetries: -1})
				defer rdb.Close()
				for _, c := range checks(p, api, seed(t, admin, "ow:")) {
					err := rdb.Do(ctx, c.cmd...).Err()
					if errors.Is(err, redis.Nil) {
						err = nil
					}
					if c.allowed {
						assert.False(t, denied(err), "%v must be allowed: %v", c.cmd, err)
					} else {
						assert.True(t, denied(err), "%v must be refused, got %v", c.cmd, err)
					}
				}
				require.NoError(t, admin.Ping(ctx).Err(), "the server is still up")
			})
		}
	}
}

// A prefix with glob characters is escaped: the rules match that prefix
// and no other.
func TestPrefixIsEscaped(t *testing.T) {
	db := redistest.New(t)
	db.RequireProcess(t, "ACL users")
	const prefix = `t*[x]?\:`
	rules, err := acl.Rules(acl.Worker, acl.Options{KeyPrefix: prefix})
	require.NoError(t, err)
	user := "ow-worker-" + strings.ReplaceAll(db.Prefix, ":", "-")
	setUser(t, db.Client, user, rules)
	t.Cleanup(func() { _ = db.Client.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	o := *db.Options
	o.Username, o.Password = user, password
	rdb := redis.NewClient(&o)
	defer rdb.Close()
	ctx := t.Context()
	require.NoError(t, rdb.Set(ctx, prefix+"lock:{SO1}", "x", 0).Err())
	for _, other := range []string{`tzzx]a\:lock:{SO1}`, `t[x]?\:lock:{SO1}`, `tAx?\:lock:{SO1}`, `t*[x]a\:lock:{SO1}`} {
		assert.True(t, denied(rdb.Set(ctx, other, "x", 0).Err()), "%s", other)
	}
	require.NoError(t, db.Client.Del(ctx, prefix+"lock:{SO1}").Err())
}

// TestOperatorsNoteButNeverRewriteAnOrder runs the Redis store's note and
// history read as the users of intake-admin and dashboard-write, exactly
// as `producer acl` prints their rules: the note is written and shows in
// the order's history, and no command or script of theirs changes a field
// of the order, its seq or version, or its history of writes.
func TestOperatorsNoteButNeverRewriteAnOrder(t *testing.T) {
	db := redistest.New(t)
	ctx := t.Context()
	admin, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	require.NoError(t, admin.Put(ctx, orders.Order{No: "SO1", Address: "1 Main St", Items: []orders.Item{{SKU: "A", Qty: 1}}}))
	order, history := db.Prefix+"order:{SO1}", db.Prefix+"order:{SO1}:history"
	for _, p := range []acl.Process{acl.IntakeAdmin, acl.DashboardWrite} {
		t.Run(string(p), func(t *testing.T) {
			rules, err := acl.Rules(p, acl.Options{KeyPrefix: db.Prefix})
			require.NoError(t, err)
			user := db.AsUser(t, rules...)
			before, err := db.Client.HGetAll(ctx, order).Result()
			require.NoError(t, err)
			hbefore, err := db.Client.LRange(ctx, history, 0, -1).Result()
			require.NoError(t, err)

			s, err := redisstore.New(user.Client, redisstore.Config{Prefix: db.Prefix})
			require.NoError(t, err)
			require.NoError(t, s.Annotate(ctx, "SO1", orders.Note{By: string(p), Action: "hold", Reason: "fraud check"}))
			h, err := orders.AllHistory(ctx, s, "SO1")
			require.NoError(t, err)
			last := h[len(h)-1]
			assert.Equal(t, orders.TypeNote, last.Type)
			assert.Equal(t, "hold by "+string(p)+": fraud check", last.Detail)

			rdb := user.Client
			for _, cmd := range [][]any{
				{"HSET", order, "address", "forged"}, {"HSET", order, "seq", "9007199254740991"},
				{"HINCRBY", order, "version", "1"}, {"HSETNX", order, "remark", "x"}, {"HDEL", order, "fence"},
				{"HINCRBYFLOAT", order, "seq", "1"}, {"DEL", order}, {"UNLINK", order}, {"EXPIRE", order, "1"},
				{"RENAME", order, db.Prefix + "order:{SO1}:x"}, {"COPY", db.Prefix + "order:{SO1}:notes", order, "REPLACE"},
				{"RPUSH", history, "forged"}, {"LTRIM", history, "1", "0"}, {"LPOP", history}, {"DEL", history},
				{"EVAL", luaRewrite, "1", order},
				{"EVAL", "redis.call('HINCRBY', KEYS[1], 'version', 1); return 1", "1", order},
			} {
				assert.True(t, denied(rdb.Do(ctx, cmd...).Err()), "%v must be refused", cmd)
			}
			after, err := db.Client.HGetAll(ctx, order).Result()
			require.NoError(t, err)
			assert.Equal(t, before, after, "the order is as it was")
			hafter, err := db.Client.LRange(ctx, history, 0, -1).Result()
			require.NoError(t, err)
			assert.Equal(t, hbefore, hafter, "and so is its history of writes")
		})
	}
}
