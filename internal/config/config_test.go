package config_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tasks"
)

// env returns a getenv over a map.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

type demo struct {
	Addr     string
	Timeout  time.Duration
	Workers  int
	ReadOnly bool
	Keys     []string
	Password string
	Format   string
	Redis    *redisconn.Options
}

func newDemo(getenv func(string) string) (*config.Set, *demo) {
	var d demo
	s := config.NewSet("demo", getenv)
	s.SetOutput(&bytes.Buffer{})
	s.String(&d.Addr, "addr", "DEMO_ADDR", ":8090", "listen address")
	s.Duration(&d.Timeout, "timeout", "DEMO_TIMEOUT", 30*time.Second, "request timeout").Check(config.Positive)
	s.Int(&d.Workers, "workers", "DEMO_WORKERS", 4, "worker count").Check(config.Positive)
	s.Bool(&d.ReadOnly, "read-only", "DEMO_READ_ONLY", true, "refuse writes")
	s.StringList(&d.Keys, "api-keys", "DEMO_API_KEYS", []string{"default-key-123"}, "accepted keys").Secret()
	s.String(&d.Password, "password", "DEMO_PASSWORD", "", "the password").Secret().Check(func(v string) error {
		if v != "" && len(v) < 12 {
			return errors.New("must be at least 12 characters")
		}
		return nil
	})
	s.String(&d.Format, "log-format", "LOG_FORMAT", "json", "json or console").Check(config.OneOf("json", "console"))
	s.Redis(&d.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL, "Redis URL")
	return s, &d
}

func TestPrecedence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     []string
		args    []string
		want    time.Duration
		wantSrc config.Source
	}{
		{name: "default", want: 30 * time.Second, wantSrc: config.FromDefault},
		{name: "env over default", env: []string{"DEMO_TIMEOUT", "5s"}, want: 5 * time.Second, wantSrc: config.FromEnv},
		{name: "flag over env", env: []string{"DEMO_TIMEOUT", "5s"}, args: []string{"-timeout", "7s"}, want: 7 * time.Second, wantSrc: config.FromFlag},
		{name: "flag over default", args: []string{"-timeout=9s"}, want: 9 * time.Second, wantSrc: config.FromFlag},
		{name: "empty env is unset", env: []string{"DEMO_TIMEOUT", ""}, want: 30 * time.Second, wantSrc: config.FromDefault},
		{name: "flag over bad env", env: []string{"DEMO_TIMEOUT", "abc"}, args: []string{"--timeout", "1m"}, want: time.Minute, wantSrc: config.FromFlag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got time.Duration
			s := config.NewSet("demo", env(tt.env...))
			v := s.Duration(&got, "timeout", "DEMO_TIMEOUT", 30*time.Second, "request timeout")
			require.NoError(t, s.Parse(tt.args))
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantSrc, v.Source())
		})
	}
}

func TestAllKinds(t *testing.T) {
	t.Parallel()
	s, d := newDemo(env(
		"DEMO_ADDR", "127.0.0.1:1",
		"DEMO_WORKERS", "0x10",
		"DEMO_READ_ONLY", "false",
		"DEMO_API_KEYS", " k1 ,, k2 ,",
		"LOG_FORMAT", "console",
	))
	require.NoError(t, s.Parse([]string{"-read-only", "-workers", "3", "rest", "of", "args"}))
	assert.Equal(t, "127.0.0.1:1", d.Addr)
	assert.Equal(t, 3, d.Workers)
	assert.True(t, d.ReadOnly, "a bare bool flag means true and beats the env")
	assert.Equal(t, []string{"k1", "k2"}, d.Keys)
	assert.Equal(t, "console", d.Format)
	assert.Equal(t, []string{"rest", "of", "args"}, s.Args())
	assert.Equal(t, "127.0.0.1:6379", d.Redis.Node.Addr)
}

func TestDefaultsAreCopies(t *testing.T) {
	t.Parallel()
	def := []string{"a"}
	var got []string
	s := config.NewSet("demo", env())
	s.StringList(&got, "list", "DEMO_LIST", def, "a list")
	require.NoError(t, s.Parse(nil))
	got[0] = "changed"
	assert.Equal(t, []string{"a"}, def)
}

func TestBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want []string // substrings of the error
	}{
		{name: "bad duration env", env: []string{"DEMO_TIMEOUT", "abc"}, want: []string{`DEMO_TIMEOUT="abc"`, "-timeout", "not a duration"}},
		{name: "bad duration flag", args: []string{"-timeout", "abc"}, want: []string{`-timeout="abc"`, "DEMO_TIMEOUT", "not a duration"}},
		{name: "negative duration", env: []string{"DEMO_TIMEOUT", "-1s"}, want: []string{`DEMO_TIMEOUT="-1s"`, "must be positive"}},
		{name: "bad int", env: []string{"DEMO_WORKERS", "four"}, want: []string{`DEMO_WORKERS="four"`, "not an integer"}},
		{name: "zero int", args: []string{"-workers=0"}, want: []string{`-workers="0"`, "must be positive"}},
		{name: "bad bool", env: []string{"DEMO_READ_ONLY", "maybe"}, want: []string{`DEMO_READ_ONLY="maybe"`, "not a boolean"}},
		{name: "one of", env: []string{"LOG_FORMAT", "xml"}, want: []string{`LOG_FORMAT="xml"`, "must be one of json, console"}},
		{name: "redis scheme", env: []string{"REDIS_URL", "http://localhost:6379"}, want: []string{`REDIS_URL="http://localhost:6379"`, "want redis://", "invalid URL scheme"}},
		{name: "redis db", env: []string{"REDIS_URL", "redis://localhost:6379/x"}, want: []string{"REDIS_URL=", "invalid database number"}},
		{name: "redis port", args: []string{"-redis-url", "redis://h:notaport"}, want: []string{"-redis-url=", "not a valid URL"}},
		{name: "unknown flag", args: []string{"-nope"}, want: []string{"flag provided but not defined: -nope"}},
		{name: "two errors", env: []string{"DEMO_TIMEOUT", "abc", "DEMO_WORKERS", "x"}, want: []string{"DEMO_TIMEOUT", "DEMO_WORKERS"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newDemo(env(tt.env...))
			err := s.Parse(tt.args)
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestErrorType(t *testing.T) {
	t.Parallel()
	s, _ := newDemo(env("DEMO_TIMEOUT", "abc"))
	err := s.Parse(nil)
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "timeout", ce.Flag)
	assert.Equal(t, "DEMO_TIMEOUT", ce.Env)
	assert.Equal(t, config.FromEnv, ce.Source)
	assert.Equal(t, `"abc"`, ce.Value)
}

func TestBadDefaultIsChecked(t *testing.T) {
	t.Parallel()
	var d time.Duration
	s := config.NewSet("demo", env())
	s.Duration(&d, "timeout", "DEMO_TIMEOUT", 0, "request timeout").Check(config.Positive)
	err := s.Parse(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `-timeout default "0s" (env DEMO_TIMEOUT and flag unset): must be positive`)
	assert.Contains(t, err.Error(), "must be positive")
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"-h", "-help", "--help"} {
		s, _ := newDemo(env("DEMO_PASSWORD", "hunter2hunter2"))
		var out bytes.Buffer
		s.SetOutput(&out)
		err := s.Parse([]string{arg})
		require.ErrorIs(t, err, config.ErrHelp, arg)
		assert.Contains(t, out.String(), "Usage: demo [flags]")
		assert.Contains(t, out.String(), "-timeout duration")
		assert.Contains(t, out.String(), `env DEMO_TIMEOUT, default "30s"`)
		assert.Contains(t, out.String(), "env DEMO_API_KEYS, secret")
		assert.NotContains(t, out.String(), "default-key-123")
		assert.NotContains(t, out.String(), "hunter2")
	}
}

func TestFlagOnly(t *testing.T) {
	t.Parallel()
	var insecure bool
	s := config.NewSet("demo", env("INSECURE", "true"))
	s.Bool(&insecure, "insecure", "", false, "no auth")
	require.NoError(t, s.Parse(nil))
	assert.False(t, insecure, "a flag-only setting reads no env")
	require.NoError(t, s.Parse([]string{"-insecure"}))
	assert.True(t, insecure)
	assert.Contains(t, s.Markdown(), "| `-insecure` | — | `false` | no auth |")
}

func TestMarkdown(t *testing.T) {
	t.Parallel()
	s, _ := newDemo(env())
	want := "| flag | env | default | meaning |\n" +
		"|---|---|---|---|\n" +
		"| `-addr` | `DEMO_ADDR` | `:8090` | listen address |\n" +
		"| `-timeout` | `DEMO_TIMEOUT` | `30s` | request timeout |\n" +
		"| `-workers` | `DEMO_WORKERS` | `4` | worker count |\n" +
		"| `-read-only` | `DEMO_READ_ONLY` | `true` | refuse writes |\n" +
		"| `-api-keys` | `DEMO_API_KEYS` | (secret) | accepted keys |\n" +
		"| `-password` | `DEMO_PASSWORD` | (secret) | the password |\n" +
		"| `-log-format` | `LOG_FORMAT` | `json` | json or console |\n" +
		"| `-redis-url` | `REDIS_URL` | `redis://127.0.0.1:6379/0` | Redis URL |\n"
	assert.Equal(t, want, s.Markdown())
}

func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3t-pw"
	const key = "k3y-0123456789"
	const redisPW = "redis-pw-42"
	t.Run("entries", func(t *testing.T) {
		t.Parallel()
		s, _ := newDemo(env("DEMO_PASSWORD", pw+"-long-enough", "DEMO_API_KEYS", key, "REDIS_URL", "redis://u:"+redisPW+"@h:1/2"))
		require.NoError(t, s.Parse(nil))
		var all strings.Builder
		for _, e := range s.Entries() {
			all.WriteString(e.Flag + "=" + e.Value + " (" + string(e.Source) + ")\n")
		}
		out := all.String()
		assert.NotContains(t, out, pw)
		assert.NotContains(t, out, key)
		assert.NotContains(t, out, redisPW)
		assert.Contains(t, out, "password=<redacted> (env)")
		assert.Contains(t, out, "redis-url=redis://u:xxxxx@h:1/2 (env)")

		s, _ = newDemo(env("REDIS_URL", "redis://s:"+redisPW+"@s1:26379/2?master_name=m&addr=s2:26379&password="+redisPW))
		require.NoError(t, s.Parse(nil))
		for _, e := range s.Entries() {
			assert.NotContains(t, e.Value, redisPW)
		}
		assert.NotContains(t, s.Markdown(), "default-key-123")
	})
	t.Run("unset secret", func(t *testing.T) {
		t.Parallel()
		s, _ := newDemo(env())
		require.NoError(t, s.Parse(nil))
		for _, e := range s.Entries() {
			if e.Flag == "password" {
				assert.Empty(t, e.Value)
			}
		}
	})
	t.Run("failed check", func(t *testing.T) {
		t.Parallel()
		s, _ := newDemo(env("DEMO_PASSWORD", "short"))
		err := s.Parse([]string{"-password", pw})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "-password=<redacted>")
		assert.Contains(t, err.Error(), "at least 12 characters")
		assert.NotContains(t, err.Error(), pw)
	})
	t.Run("bad redis url", func(t *testing.T) {
		t.Parallel()
		for _, raw := range []string{
			"redis://:" + redisPW + "@h:notaport/0",
			"redis://:" + redisPW + "@h:1/notadb",
			"redis://:" + redisPW + "@h:1/0?nope=1",
			"http://:" + redisPW + "@h:1/0",
			"redis://:" + redisPW + "@h:1/0\x7f",
			"redis://s1:1/0?master_name=m&addr=s2&password=" + redisPW,
			"redis://s1:1/0?master_name=m&password=" + redisPW + "&nope=1",
			"redis://:" + redisPW + "@h1:1/2?addr=h2:1",
		} {
			s, _ := newDemo(env("REDIS_URL", raw))
			err := s.Parse(nil)
			require.Error(t, err, raw)
			assert.Contains(t, err.Error(), "REDIS_URL=")
			assert.NotContains(t, err.Error(), redisPW)
			assert.ErrorIs(t, err, redisconn.ErrURL)
		}
	})
}

func TestRedis(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		url    string
		addr   string
		user   string
		pass   string
		db     int
		tls    bool
		server string
	}{
		{name: "default", url: "", addr: "127.0.0.1:6379"},
		{name: "db and password", url: "redis://:pw@cache:6380/3", addr: "cache:6380", pass: "pw", db: 3},
		{name: "acl user", url: "redis://app:pw@cache/1", addr: "cache:6379", user: "app", pass: "pw", db: 1},
		{name: "tls", url: "rediss://app:pw@redis.example.com:6390/2", addr: "redis.example.com:6390", user: "app", pass: "pw", db: 2, tls: true, server: "redis.example.com"},
		{name: "escaped password", url: "redis://:p%40ss%3Aword@h:1/0", addr: "h:1", pass: "p@ss:word"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var p *redisconn.Options
			s := config.NewSet("demo", env("REDIS_URL", tt.url))
			s.Redis(&p, "redis-url", "REDIS_URL", config.DefaultRedisURL, "Redis URL")
			require.NoError(t, s.Parse(nil))
			require.Equal(t, redisconn.Single, p.Topology)
			o := p.Node
			assert.Equal(t, tt.addr, o.Addr)
			assert.Equal(t, tt.user, o.Username)
			assert.Equal(t, tt.pass, o.Password)
			assert.Equal(t, tt.db, o.DB)
			assert.True(t, o.ContextTimeoutEnabled)
			if !tt.tls {
				assert.Nil(t, o.TLSConfig)
				return
			}
			require.NotNil(t, o.TLSConfig)
			assert.Equal(t, tt.server, o.TLSConfig.ServerName)
			assert.GreaterOrEqual(t, o.TLSConfig.MinVersion, uint16(tls.VersionTLS12))
		})
	}
}

func TestRedisTopologies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		url   string
		want  redisconn.Topology
		addrs []string
	}{
		{"sentinel", "redis://s1:26379/2?master_name=mymaster&addr=s2:26379", redisconn.Sentinel, []string{"s1:26379", "s2:26379"}},
		{"cluster", "redis://h1:7000?addr=h2:7000&addr=h3:7000", redisconn.Cluster, []string{"h1:7000", "h2:7000", "h3:7000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var p *redisconn.Options
			s := config.NewSet("demo", env("REDIS_URL", tt.url))
			s.Redis(&p, "redis-url", "REDIS_URL", config.DefaultRedisURL, "Redis URL")
			require.NoError(t, s.Parse(nil))
			assert.Equal(t, tt.want, p.Topology)
			assert.Equal(t, tt.addrs, p.Addrs())
		})
	}
}

func TestDeclaredTwicePanics(t *testing.T) {
	t.Parallel()
	var a, b string
	s := config.NewSet("demo", env())
	s.String(&a, "addr", "DEMO_ADDR", "", "")
	assert.Panics(t, func() { s.String(&b, "addr", "OTHER", "", "") })
	assert.Panics(t, func() { s.String(&b, "other", "DEMO_ADDR", "", "") })
}

func TestValidators(t *testing.T) {
	t.Parallel()
	assert.NoError(t, config.Positive(time.Second))
	assert.Error(t, config.Positive(time.Duration(0)))
	assert.NoError(t, config.NonNegative(0))
	assert.Error(t, config.NonNegative(-1.5))
	assert.NoError(t, config.NotEmpty("x"))
	assert.Error(t, config.NotEmpty("  "))
	assert.NoError(t, config.AtLeastOne([]string{"x"}))
	assert.Error(t, config.AtLeastOne(nil))

	tests := []struct {
		name    string
		schemes []string
		in      string
		wantErr string
	}{
		{name: "empty passes", in: ""},
		{name: "http", schemes: []string{"http", "https"}, in: "http://prometheus:9090"},
		{name: "relative", in: "/just/a/path", wantErr: "must be an absolute URL"},
		{name: "no host", in: "http:///x", wantErr: "must be an absolute URL"},
		{name: "scheme", schemes: []string{"https"}, in: "http://h", wantErr: "URL scheme must be one of https"},
		{name: "garbage", in: "http://h:port", wantErr: "not a valid URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := config.URL(tt.schemes...)(tt.in)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// FuzzParse feeds arbitrary text to every kind of setting: Parse never
// panics, and every error it returns is a *config.Error naming a variable.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"", "abc", "-1s", "0x10", "true", "a,b", "redis://:pw@h:1/2", "rediss://h", "unix:///tmp/r.sock", "%zz", "redis://h/1/2"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		for _, name := range []string{"DEMO_ADDR", "DEMO_TIMEOUT", "DEMO_WORKERS", "DEMO_READ_ONLY", "DEMO_API_KEYS", "LOG_FORMAT", "REDIS_URL"} {
			s, _ := newDemo(env(name, raw))
			err := s.Parse(nil)
			if err == nil {
				continue
			}
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Env != name {
				t.Fatalf("%s=%q: error %v does not name the variable", name, raw, err)
			}
		}
	})
}

func TestShards(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want tasks.Shards
	}{
		{name: "default", want: tasks.Shards{Count: 1}},
		{name: "env", env: []string{"QUEUE_SHARDS", "3"}, want: tasks.Shards{Count: 3}},
		{name: "draining", env: []string{"QUEUE_SHARDS", "3,1"}, want: tasks.Shards{Count: 3, Draining: []int{1}}},
		{name: "flag wins", env: []string{"QUEUE_SHARDS", "3,1"}, args: []string{"-queue-shards", "3"}, want: tasks.Shards{Count: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got tasks.Shards
			s := config.NewSet("demo", env(tt.env...))
			s.Shards(&got, "queue-shards", "QUEUE_SHARDS", "queue shards")
			require.NoError(t, s.Parse(tt.args))
			assert.Equal(t, tt.want, got)
		})
	}
	var got tasks.Shards
	s := config.NewSet("demo", env("QUEUE_SHARDS", "3,0"))
	s.Shards(&got, "queue-shards", "QUEUE_SHARDS", "queue shards")
	err := s.Parse(nil)
	require.ErrorIs(t, err, tasks.ErrShards)
	assert.EqualError(t, err, `config: QUEUE_SHARDS="3,0" (env; flag -queue-shards): want a count from 1 to 64, then the counts that drain, e.g. 3 or 3,1`)
	assert.Contains(t, s.Markdown(), "| `-queue-shards` | `QUEUE_SHARDS` | `1` | queue shards |")
}
