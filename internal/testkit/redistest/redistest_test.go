package redistest_test

import (
	"maps"
	"testing"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

func TestNewIsolatesTests(t *testing.T) {
	a, b := redistest.New(t), redistest.New(t)
	if a.Prefix == b.Prefix {
		t.Fatalf("two tests share prefix %q", a.Prefix)
	}
	ctx := t.Context()
	if err := a.Client.Set(ctx, a.Prefix+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if a.Kind == redistest.Spawned && a.Options.DB == b.Options.DB {
		t.Fatalf("two tests share database %d on a spawned server", a.Options.DB)
	}
}

func TestDedicatedRestart(t *testing.T) {
	p := redistest.Dedicated(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	// Persistence is off, so the restarted server is empty and the client
	// reconnects on its own.
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v", n, err)
	}
}

// CallsDuring counts what the server ran during fn, a script's calls
// included, and not its own INFO.
func TestCallsDuring(t *testing.T) {
	p := redistest.Dedicated(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got := redistest.CallsDuring(t, c, func() {
		if err := c.Eval(ctx, `redis.call('SET', KEYS[1], 'v'); return redis.call('GET', KEYS[1])`, []string{"k"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, "k").Err(); err != nil {
			t.Fatal(err)
		}
	})
	want := redistest.Calls{"eval": 1, "set": 1, "get": 2}
	if !maps.Equal(got, want) || got.Total() != 4 {
		t.Fatalf("calls %v (%d), want %v", got, got.Total(), want)
	}
	if got := redistest.CallsDuring(t, c, func() {}); len(got) != 0 {
		t.Fatalf("calls %v during nothing", got)
	}
}
