// Package acl gives the Redis ACL rules of each orderworker process: the
// narrowest rule under which the process does all its work, derived from
// the keys and channels the packages use. `producer acl <process>` prints
// them; the tests of each process run as a user with exactly these rules.
//
// The keys, for the default KEY_PREFIX of "ow:" (their owners in parentheses):
//
//	ow:order:{<no>}…          an order, its history, events and claims (redisstore)
//	ow:order:{<no>}:notes     its notes of the operator actions (redisstore's Annotate)
//	ow:lock:{<no>}            an order's lock (lock)
//	ow:lock:{<no>}:fence      its newest fencing token (lock)
//	ow:lock:{<no>}:seq        its sequence of positions (lock.Sequencer)
//	ow:lock:{<no>}:acts       the limit of its operator actions, kept across processes (orderops)
//	ow:lock:held              the index of the orders operators hold (lock.Sequencer.Pause, orderops; read by the blocked list)
//	ow:lock:backlog[:sum]     the index of backlogs: positions waiting behind each order's head, and their sum (keyorder's
//	                          scripts, in the step that hands a position out or passes a turn on; read by the dashboard's gauges)
//	ow:event:{<id>}           an event ID's claim (producer)
//	ow:wait:{<name>}          WAIT_REPLICAS markers (producer)
//	ow:token:{upstream}…      the workers' shared order API token and its refresh lock (token)
//	asynq:{<queue>}:…         a queue's tasks, lists and counters (asynq)
//	asynq:queues              asynq's set of queues
//	asynq:servers…, asynq:workers…
//	                          the asynq servers' heartbeats
//
// and the channels ow:lock:released (release notices, lock), ow:token:{upstream}:refreshed
// (token notices, token) and asynq:cancel (asynq's cancellations).
//
// Each rule starts from every command but the @dangerous ones and those
// that reach past the keys a user may touch or change global state: SCAN,
// RANDOMKEY, DBSIZE, CLUSTER GETKEYSINSLOT and COUNTKEYSINSLOT, PUBSUB,
// CLIENT TRACKING, MEMORY but MEMORY USAGE, SCRIPT but LOAD and EXISTS
// (no SCRIPT FLUSH or KILL), and FUNCTION and FCALL (no FUNCTION FLUSH).
// Keys are then granted read-write (~), read-only (%R~) or, through a
// selector, to a few write commands only (asynq:queues is only ever added
// to, so no process but the writing dashboard may DEL it).
//
// EVAL and EVALSHA declare every key they name as read and written, so a
// user that may only read a key cannot name it in a script. Each rule
// therefore has a selector that lets EVAL and EVALSHA name every key the
// process may touch; what the script then does is checked command by
// command against the rest of the rule, so a read-only key stays read-only
// inside a script too. The selectors need Redis 7.
package acl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/orderworker/orderworker/internal/orderkeys"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// Process names an orderworker process whose Redis user this package
// describes.
type Process string

// The processes, as `producer acl` names them.
const (
	// Worker is cmd/worker: it serves the queues, holds the order locks and
	// writes the orders.
	Worker Process = "worker"
	// Intake is `producer serve`, the CLI (but `order put`, which writes
	// the order store: run it with the worker's rule) and any Go producer:
	// it accepts changes and reads orders, tasks and sequences.
	Intake Process = "intake"
	// IntakeAdmin is `producer serve` with INTAKE_ADMIN_KEYS set, and the
	// CLI's operator actions (`producer order retry|skip|hold|resume`):
	// the intake's rights, and those of the actions (package orderops):
	// moving a task within its queue (asynq's Inspector RunTask and
	// ArchiveTask, and keyorder.Wake to wake the change parked behind a
	// settled head), writing the sequences (skip, hold, resume, the action
	// log), the index of held orders, and the release notices; with the
	// Redis store also the two writes of an order's notes list that note
	// each action in its history (redisstore's Annotate; see rule.notes),
	// and nothing else of the order: not its hash, history, events or
	// claims.
	IntakeAdmin Process = "intake-admin"
	// Dashboard is cmd/dashboard with DASHBOARD_READ_ONLY=true (its
	// default): it reads everything it shows, and writes nothing.
	Dashboard Process = "dashboard"
	// DashboardWrite is cmd/dashboard with DASHBOARD_READ_ONLY=false: it
	// may also run, archive, delete and cancel tasks and pause queues, and
	// act on orders (the operator actions: it writes the sequences, the
	// index of held orders and the release notices, and with the Redis
	// store the notes list of an order, not the order itself).
	DashboardWrite Process = "dashboard-write"
)

// Processes returns every process, in the order of docs/operations.md's ACL rules.
func Processes() []Process { return []Process{Worker, Intake, IntakeAdmin, Dashboard, DashboardWrite} }

// Errors of [Rules], wrapped with the reason. Match them with errors.Is.
var (
	// ErrUnknownProcess is returned for a process not in [Processes].
	ErrUnknownProcess = errors.New("acl: unknown process")
	// ErrBadPrefix is returned for a key prefix that an ACL rule cannot
	// hold (a space, a quote, a parenthesis, a control byte) or that the
	// processes refuse (a brace).
	ErrBadPrefix = errors.New("acl: key prefix unusable in an ACL rule")
)

// Options are what the rules depend on. The zero value gives the rules of
// the default deployment: KEY_PREFIX "ow:" and the Redis order store.
type Options struct {
	// KeyPrefix is the processes' KEY_PREFIX. Defaults to
	// orderkeys.DefaultPrefix ("ow:").
	KeyPrefix string
	// OrderAPI is true with ORDER_STORE=http: the orders live behind the
	// upstream order API, which the workers write through with the token
	// they share in Redis, and the other processes read through with a
	// token of their own, kept in memory (cmd/internal/orderstore). The
	// workers then get the token's keys and notice channel, and no process
	// the Redis store's keys. No process but the workers' may read, delete
	// or lock the token, with or without it.
	OrderAPI bool
}

// Rules returns the ACL rules of process p, one ACL SETUSER argument each
// (a selector is one argument, "(...)"), without a user name or password:
//
//	ACL SETUSER ow-worker reset on >PASSWORD <rules...>
//
// They start with resetkeys, resetchannels and clearselectors, so that they
// set exactly these rights on an existing user too. It returns an error
// matching [ErrUnknownProcess] or [ErrBadPrefix]. It is safe for
// concurrent use.
func Rules(p Process, o Options) ([]string, error) {
	prefix := o.KeyPrefix
	if prefix == "" {
		prefix = orderkeys.DefaultPrefix
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	k := newKeys(prefix)
	var r rule
	switch p {
	case Worker:
		// asynq's server: every queue's keys and its own heartbeats; it
		// adds a queue whose tasks exist back to asynq:queues (worker's
		// gap check) but never removes one.
		r.rw(k.queueKeys, k.servers, k.workers).ro(k.asynq).only(k.allQueues, "sadd")
		r.channels(k.released, k.cancel)
		// The locks, fences and sequences, and the index of backlogs
		// that passing a turn on counts in.
		r.rw(k.locks, k.backlog)
		r.orders(o.OrderAPI, k, true)
	case Intake, IntakeAdmin:
		if p == IntakeAdmin {
			// The operator actions: asynq's RunTask and ArchiveTask and
			// keyorder.Wake move a task within its queue (its hash, its
			// pending list, its retry, scheduled and archived sets);
			// skip, hold and resume write the sequence (below), the index
			// of held orders, and the notice that wakes a waiter.
			r.rw(k.queueKeys, k.held, k.acts).channels(k.released)
			r.notes(o.OrderAPI, k)
		}
		// Acceptance: the event claims, the sequences, the WAIT markers,
		// and a task's hash, its pending or scheduled entry (or its retry
		// entry: a change accepted behind unfinished changes of its order
		// is parked in its queue's retry set) and its queue's name,
		// written by the commands asynq's Client (or the producer's script
		// doing as it does) uses and no other: it can neither delete
		// nor empty a queue. It reads tasks, locks and sequences for the
		// task and status reads. Not granted: moving a task within its
		// queue (keyorder.Wake), which a producer that gives up the head
		// position of an order tries for the task parked behind it; that
		// task then comes back after its park delay (at most the workers'
		// GAP_WAIT) instead of at once.
		r.rw(k.events, k.seqs, k.waits, k.backlog).ro(k.asynq, k.locks, k.held)
		r.only(k.taskKeys, "hset").only(k.pending, "lpush").only(k.scheduled, "zadd").only(k.retry, "zadd").only(k.allQueues, "sadd")
		r.orders(o.OrderAPI, k, false)
	case Dashboard, DashboardWrite:
		if p == DashboardWrite {
			// asynqmon's actions, and cancelling an active task; the
			// operator actions on the order page (see IntakeAdmin).
			r.rw(k.asynq, k.seqs, k.held, k.acts, k.backlog).channels(k.cancel, k.released)
			r.notes(o.OrderAPI, k)
		} else {
			// asynq's Inspector prunes the expired entries of the server,
			// worker and scheduler lists when it reads them.
			r.ro(k.asynq).only(k.servers0, "zremrangebyscore").only(k.workers0, "zremrangebyscore").only(k.schedulers, "zremrangebyscore")
		}
		// The order page and the blocked list: the sequences and locks,
		// and the index of held orders; the gauges: the index of backlogs.
		r.ro(k.locks, k.held, k.backlog)
		r.orders(o.OrderAPI, k, false)
		// asynqmon's Redis page.
		r.cmds = append(r.cmds, "+info", "+cluster|info", "+cluster|nodes")
	default:
		return nil, fmt.Errorf("%w %q (want %s)", ErrUnknownProcess, string(p), names())
	}
	return r.rules(), nil
}

func names() string {
	var s []string
	for _, p := range Processes() {
		s = append(s, string(p))
	}
	return strings.Join(s, ", ")
}

// base are the commands of every rule; see the package comment.
var base = []string{
	"resetkeys", "resetchannels", "clearselectors",
	"+@all", "-@dangerous",
	"-scan", "-randomkey", "-dbsize",
	"-cluster", "+cluster|slots", "+cluster|shards", "+cluster|keyslot", "+cluster|myid",
	"-pubsub", "-client|tracking", "-client|caching",
	"-memory", "+memory|usage",
	"-script", "+script|load", "+script|exists",
	"-function", "-fcall", "-fcall_ro",
}

// keys are the key and channel patterns of one key prefix, escaped.
type keys struct {
	orders, notes                                  string
	locks, seqs, acts, held, events, waits, token  string
	backlog                                        string
	asynq, queueKeys, taskKeys, pending, scheduled string
	retry                                          string
	allQueues, servers, workers                    string
	servers0, workers0, schedulers                 string
	released, tokenChannel, cancel                 string
}

func newKeys(prefix string) keys {
	p, q := escape(prefix), asynqredis.ACL()
	return keys{
		orders:  p + "order:{*",
		notes:   p + "order:{*}:notes",
		locks:   p + "lock:{*",
		seqs:    p + "lock:{*}:seq",
		acts:    p + "lock:{*}:acts",
		held:    p + "lock:held",
		backlog: p + "lock:backlog*",
		events:  p + "event:{*",
		waits:   p + "wait:{*",
		token:   p + `token:{upstream}*`,

		asynq:      q.All,
		queueKeys:  q.Queues,
		taskKeys:   q.Tasks,
		pending:    q.Pending,
		scheduled:  q.Scheduled,
		retry:      q.Retry,
		allQueues:  asynqredis.AllQueues,
		servers:    q.Servers,
		workers:    q.Workers,
		servers0:   q.ServersSet,
		workers0:   q.WorkersSet,
		schedulers: q.SchedulersSet,

		released:     p + "lock:released",
		tokenChannel: p + "token:{upstream}:refreshed",
		cancel:       q.Cancel,
	}
}

// escape escapes the glob characters of s for a Redis pattern.
func escape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func checkPrefix(p string) error {
	for _, c := range p {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"'(){}`, c) {
			return fmt.Errorf("%w: %q has %q (want printable ASCII without spaces, quotes, parentheses or braces)", ErrBadPrefix, p, c)
		}
	}
	return nil
}

// rule collects one process's rights.
type rule struct {
	cmds       []string
	keys       []string // "~pattern" and "%R~pattern"
	chans      []string
	writeOnly  []writeOnly
	scriptKeys []string // every pattern the process may touch
}

func (r *rule) rw(patterns ...string) *rule {
	for _, p := range patterns {
		r.keys = append(r.keys, "~"+p)
		r.scriptKeys = append(r.scriptKeys, p)
	}
	return r
}

func (r *rule) ro(patterns ...string) *rule {
	for _, p := range patterns {
		r.keys = append(r.keys, "%R~"+p)
		r.scriptKeys = append(r.scriptKeys, p)
	}
	return r
}

// writeOnly is a selector: one write command on some keys.
type writeOnly struct {
	cmd      string
	patterns []string // with their access: "%W~pattern" or "~pattern"
}

// only lets the one write command cmd change the keys of pattern, in a
// selector of its own: no other command may change them, and cmd no other
// key (a ZADD that made a queue's pending list a sorted set would stop the
// queue). The rule must let the process read the keys on its own.
func (r *rule) only(pattern, cmd string) *rule { return r.selector("%W~", pattern, cmd) }

func (r *rule) selector(access, pattern, cmd string) *rule {
	r.scriptKeys = append(r.scriptKeys, pattern)
	for i := range r.writeOnly {
		if r.writeOnly[i].cmd == cmd {
			r.writeOnly[i].patterns = append(r.writeOnly[i].patterns, access+pattern)
			return r
		}
	}
	r.writeOnly = append(r.writeOnly, writeOnly{cmd, []string{access + pattern}})
	return r
}

func (r *rule) channels(names ...string) *rule {
	for _, n := range names {
		r.chans = append(r.chans, "&"+n)
	}
	return r
}

// orders grants the order store's keys, read-write when write; with the
// order API, the token's keys and its notice channel to the workers
// (write), which share the token and refresh it, and nothing to the
// others, which keep a token of their own in memory.
func (r *rule) orders(api bool, k keys, write bool) {
	switch {
	case api && write:
		r.rw(k.token).channels(k.tokenChannel)
	case api:
	case write:
		r.rw(k.orders)
	default:
		r.ro(k.orders)
	}
}

// notes grants what an operator action's note in an order's history
// writes (redisstore's Annotate, through orderops): RPUSH and LTRIM (the
// notes' cap) of the order's notes list, each in a selector of its own.
// Nothing else of the order: its hash (fields, version, newest fence and
// position), its history of writes, its events and claims stay read-only,
// in scripts too (a script's commands run with the caller's rights). The
// rule reads the orders already. With the order API there is no note, and
// nothing to grant.
func (r *rule) notes(api bool, k keys) {
	if api {
		return
	}
	r.only(k.notes, "rpush").only(k.notes, "ltrim")
}

func (r *rule) rules() []string {
	out := append(append([]string(nil), base...), r.cmds...)
	out = append(out, r.keys...)
	out = append(out, r.chans...)
	for _, w := range r.writeOnly {
		sel := []string{"+" + w.cmd}
		sel = append(sel, w.patterns...)
		out = append(out, "("+strings.Join(sel, " ")+")")
	}
	script := []string{"+eval", "+evalsha"}
	for _, p := range covering(r.scriptKeys) {
		script = append(script, "~"+p)
	}
	return append(out, "("+strings.Join(script, " ")+")")
}

// covering drops the patterns that another of patterns covers: one that
// starts with the other's text before its final "*".
func covering(patterns []string) []string {
	var out []string
	for i, p := range patterns {
		covered := false
		for j, q := range patterns {
			stem, wild := strings.CutSuffix(q, "*")
			if i != j && wild && !strings.Contains(stem, "*") && strings.HasPrefix(p, stem) && (p != q || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	return out
}
