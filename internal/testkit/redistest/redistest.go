// Package redistest gives each test a real Redis.
//
// The server is chosen once per test binary, in this order:
//
//  1. TEST_REDIS_URL, when set: a server the helper did not start. It is
//     never flushed; tests are isolated by a unique key prefix and their keys
//     are deleted with t.Cleanup.
//  2. A redis-server found on PATH, spawned on a free loopback port the first
//     time a test asks for one and killed when the test binary exits.
//  3. The in-process miniredis, with a loud note on stderr. Tests that need a
//     real server process (restart, kill, CLIENT PAUSE) skip there with the
//     reason. When the CI environment variable is set this fallback is an
//     error instead, so CI never passes on the stand-in.
//
// On a server the helper owns (2 and 3), each test also gets a database of
// its own, flushed before use, so that keys without the test's prefix (such
// as asynq's) do not meet either.
//
// Use [New] for an isolated client on the shared server and [Dedicated] for a
// server of the test's own that it may stop and restart. Packages that use the
// shared server should call [Main] from TestMain so the server is stopped when
// the tests end.
//
// Beyond one node, [NewCluster] gives a test a client on a Redis Cluster of
// 3 masters with one replica each, and [NewSentinel] one on a Sentinel group
// (1 master, 1 replica, 3 sentinels); each is started once per test binary
// from redis-server and stopped by [Main]. [DedicatedSentinel] starts a
// group a test may fail over, [DedicatedCluster] a cluster whose masters a
// test may kill. [redisproc.Cluster.OnEachMaster] picks keys or order
// numbers whose slots land on every master.
//
// redistest is imported by _test.go files only (the lint's depguard rules
// enforce it). The processes themselves are package redisproc's, which dev
// tools may use.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/embedded"
	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/redis/go-redis/v9"
)

// Kind says which sort of server backs a [DB].
type Kind string

// The kinds of server, see the package comment.
const (
	External  Kind = "external"  // TEST_REDIS_URL
	Spawned   Kind = "spawned"   // a redis-server started by this package
	Miniredis Kind = "miniredis" // the in-process stand-in
)

// databases is how many logical databases a spawned server has; database 0 is
// left unused so that a test author poking around with redis-cli sees nothing
// surprising there.
const databases = redisproc.Databases

// DB is one test's view of the shared Redis.
type DB struct {
	// Client is connected to the test's database and closed by t.Cleanup.
	Client *redis.Client
	// Options are the options Client was made with; use them to make more
	// clients (for example one per simulated replica).
	Options *redis.Options
	// Prefix is unique to the test. Keys a test creates should start with it:
	// on an external server they are the only keys deleted at cleanup.
	Prefix string
	// Kind says what backs the database.
	Kind Kind
}

// NewClient returns one more client to the test's database, closed by
// t.Cleanup. Each client has its own connection pool, as a separate process
// would.
func (db *DB) NewClient(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(db.Options)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// URL returns a redis:// URL for the test's database, for code under test that
// parses one itself (binaries, config). It carries the user and password of
// a DB that [DB.AsUser] returned.
func (db *DB) URL() string {
	if db.Options.Username != "" {
		return fmt.Sprintf("redis://%s:%s@%s/%d", url.PathEscape(db.Options.Username), url.PathEscape(db.Options.Password),
			db.Options.Addr, db.Options.DB)
	}
	return fmt.Sprintf("redis://%s/%d", db.Options.Addr, db.Options.DB)
}

// AsUser makes a Redis ACL user with rules (the arguments of ACL SETUSER
// after the user name and password), named after the test and deleted by
// tb.Cleanup, and returns a view of the same database, prefix and kind as
// that user: its Client, Options and URL log in with the user's name and
// password (which [DB.Password] returns). ACL users are the server's, not
// the database's, so the name is unique to the test. It skips the test on
// the in-process miniredis, which has no ACLs.
func (db *DB) AsUser(tb testing.TB, rules ...string) *DB {
	tb.Helper()
	db.RequireProcess(tb, "ACL users")
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "test-" + hex.EncodeToString(b[:])
	password := "pw-" + hex.EncodeToString(b[:]) + "-secret"
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := db.Client.Do(context.Background(), args...).Err(); err != nil {
		tb.Fatalf("redistest: ACL SETUSER %s: %v", name, err)
	}
	tb.Cleanup(func() {
		c := redis.NewClient(db.Options) // db's own user made it
		defer c.Close()
		_ = c.Do(context.Background(), "ACL", "DELUSER", name).Err()
	})
	opts := *db.Options
	opts.Username, opts.Password = name, password
	u := &DB{Options: &opts, Prefix: db.Prefix, Kind: db.Kind}
	u.Client = u.NewClient(tb)
	return u
}

// Password returns the password of a DB that [DB.AsUser] returned, "" for
// the default user's.
func (db *DB) Password() string { return db.Options.Password }

// RequireProcess skips the test when the server is the in-process miniredis,
// giving reason in the skip message.
func (db *DB) RequireProcess(tb testing.TB, reason string) {
	tb.Helper()
	if db.Kind == Miniredis {
		tb.Skipf("needs a real redis-server process (%s); running on miniredis", reason)
	}
}

type shared struct {
	once   sync.Once
	err    error
	kind   Kind
	opts   *redis.Options
	proc   *redisproc.Process
	mini   *embedded.Server
	mu     sync.Mutex
	nextDB int
}

var pkg shared

// New returns a client isolated for this test on the package's shared server.
// It fails the test when no server can be had (and, under CI, when only the
// in-process fallback is left).
func New(tb testing.TB) *DB {
	tb.Helper()
	pkg.once.Do(pkg.start)
	if pkg.err != nil {
		tb.Fatalf("redistest: %v", pkg.err)
	}
	opts := *pkg.opts
	db := &DB{Options: &opts, Prefix: prefix(tb), Kind: pkg.kind}
	if pkg.kind != External { // a server this package owns: a database per test
		pkg.mu.Lock()
		pkg.nextDB = pkg.nextDB%(databases-1) + 1
		opts.DB = pkg.nextDB
		pkg.mu.Unlock()
	}
	db.Client = db.NewClient(tb)
	ctx := context.Background()
	if pkg.kind != External {
		if err := db.Client.FlushDB(ctx).Err(); err != nil {
			tb.Fatalf("redistest: flush db %d: %v", opts.DB, err)
		}
	}
	tb.Cleanup(func() { deletePrefix(tb, db) })
	return db
}

// deletePrefix removes the keys a test made under its prefix. It uses SCAN so
// that it is safe on a server the helper does not own.
func deletePrefix(tb testing.TB, db *DB) {
	c := redis.NewClient(db.Options)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, db.Prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		// The test may have stopped the server on purpose; nothing to clean.
		tb.Logf("redistest: cleanup scan: %v", err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		_ = c.Del(ctx, keys[:n]...).Err()
		keys = keys[n:]
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// prefix builds a key prefix that is unique to the test and readable in
// redis-cli: "test:<name>:<random>:".
func prefix(tb testing.TB) string {
	name := unsafeChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

func (s *shared) start() {
	if url := os.Getenv("TEST_REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			s.err = fmt.Errorf("TEST_REDIS_URL: %w", err)
			return
		}
		opts.ContextTimeoutEnabled = true
		s.kind, s.opts = External, opts
		return
	}
	p, err := redisproc.Start()
	if err == nil {
		s.kind, s.proc = Spawned, p
		s.opts = &redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true}
		return
	}
	if os.Getenv("CI") != "" {
		s.err = fmt.Errorf("no Redis for tests under CI (set TEST_REDIS_URL or install redis-server): %w", err)
		return
	}
	fmt.Fprintf(os.Stderr, "\n"+
		"!!! redistest: %v\n"+
		"!!! falling back to the in-process miniredis: tests that need a real\n"+
		"!!! server skip, and the rest do not prove behaviour on real Redis.\n"+
		"!!! Install redis-server or set TEST_REDIS_URL.\n\n", err)
	m, err := embedded.Start()
	if err != nil {
		s.err = err
		return
	}
	s.kind, s.mini = Miniredis, m
	s.opts = &redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}
}

// Dedicated starts a redis-server for this test alone, stopped by t.Cleanup,
// so the test may stop, pause and restart it. It skips the test when there is
// no redis-server binary (and fails it under CI).
func Dedicated(tb testing.TB, extra ...string) *redisproc.Process {
	tb.Helper()
	p, err := redisproc.Start(extra...)
	if errors.Is(err, redisproc.ErrNoServer) && os.Getenv("CI") == "" {
		tb.Skipf("needs a real redis-server process: %v", err)
	}
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(p.Stop)
	return p
}

// Main runs the tests of a package and then stops the shared server, if this
// package started one. Use it from TestMain, wrapped by goleak where the
// package starts goroutines:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }
func Main(m interface{ Run() int }) interface{ Run() int } {
	return runner{m}
}

type runner struct{ m interface{ Run() int } }

func (r runner) Run() int {
	code := r.m.Run()
	stopTopologies()
	if pkg.proc != nil {
		pkg.proc.Stop()
	}
	if pkg.mini != nil {
		pkg.mini.Close()
	}
	return code
}

// CallsDuring runs fn and returns the commands that the server behind c
// ran meanwhile, by name as INFO commandstats names them ("hmget",
// "evalsha_ro", "client|setinfo"), the calls that scripts make included
// and its own INFO excluded. The counts are the whole server's: use it on
// a [Dedicated] server, which only the test talks to. A test that bounds
// the work a call does by these counts, rather than by how long the call
// took, passes on a loaded machine and fails for the extra work only.
func CallsDuring(tb testing.TB, c redis.UniversalClient, fn func()) Calls {
	tb.Helper()
	before := commandStats(tb, c)
	fn()
	after := commandStats(tb, c)
	after["info"]-- // the INFO that read before
	for name, n := range before {
		after[name] -= n
	}
	for name, n := range after {
		if n == 0 {
			delete(after, name)
		}
	}
	return after
}

// Calls counts the commands a server ran, by name; see [CallsDuring].
type Calls map[string]int64

// Total is the count of every command in c.
func (c Calls) Total() int64 {
	var n int64
	for _, calls := range c {
		n += calls
	}
	return n
}

var cmdstatLine = regexp.MustCompile(`(?m)^cmdstat_(\S+):calls=(\d+),`)

// commandStats returns the calls of each command that the server behind c
// has counted.
func commandStats(tb testing.TB, c redis.UniversalClient) Calls {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats: %v", err)
	}
	calls := Calls{}
	for _, m := range cmdstatLine.FindAllStringSubmatch(info, -1) {
		n, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			tb.Fatalf("redistest: INFO commandstats: %q: %v", m[0], err)
		}
		calls[m[1]] = n
	}
	return calls
}
