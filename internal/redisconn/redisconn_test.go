package redisconn_test

import (
	"crypto/tls"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestParseSingle(t *testing.T) {
	t.Parallel()
	o, err := redisconn.Parse("rediss://app:s3cret@cache.example.com:6390/2?dial_timeout=3s")
	require.NoError(t, err)
	require.Equal(t, redisconn.Single, o.Topology)
	assert.Equal(t, "cache.example.com:6390", o.Node.Addr)
	assert.Equal(t, "app", o.Node.Username)
	assert.Equal(t, "s3cret", o.Node.Password)
	assert.Equal(t, 2, o.Node.DB)
	assert.True(t, o.Node.ContextTimeoutEnabled)
	require.NotNil(t, o.Node.TLSConfig)
	assert.GreaterOrEqual(t, o.Node.TLSConfig.MinVersion, uint16(tls.VersionTLS12))
	assert.Equal(t, []string{"cache.example.com:6390"}, o.Addrs())
	assert.NotContains(t, o.String(), "s3cret")

	c := o.NewClient()
	defer c.Close()
	assert.IsType(t, &redis.Client{}, c)
}

func TestParseSentinel(t *testing.T) {
	t.Parallel()
	o, err := redisconn.Parse("redis://sent:spw@10.0.0.1:26379/3?master_name=mymaster&addr=10.0.0.2:26379&addr=10.0.0.3:26379&username=app&password=apppw")
	require.NoError(t, err)
	require.Equal(t, redisconn.Sentinel, o.Topology)
	f := o.Failover
	assert.Equal(t, "mymaster", f.MasterName)
	assert.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, f.SentinelAddrs)
	assert.Equal(t, "sent", f.SentinelUsername)
	assert.Equal(t, "spw", f.SentinelPassword)
	assert.Equal(t, "app", f.Username)
	assert.Equal(t, "apppw", f.Password)
	assert.Equal(t, 3, f.DB)
	assert.True(t, f.ContextTimeoutEnabled)
	assert.Equal(t, f.SentinelAddrs, o.Addrs())
	assert.NotContains(t, o.String(), "spw")
	assert.NotContains(t, o.String(), "apppw")

	c := o.NewClient()
	defer c.Close()
	assert.IsType(t, &redis.Client{}, c)
}

func TestParseCluster(t *testing.T) {
	t.Parallel()
	o, err := redisconn.Parse("redis://app:cpw@10.0.0.1:7000/0?addr=10.0.0.2:7000&addr=10.0.0.3:7000&read_timeout=2s")
	require.NoError(t, err)
	require.Equal(t, redisconn.Cluster, o.Topology)
	c := o.Cluster
	assert.Equal(t, []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}, c.Addrs)
	assert.Equal(t, "app", c.Username)
	assert.Equal(t, "cpw", c.Password)
	assert.True(t, c.ContextTimeoutEnabled)
	assert.Equal(t, redisconn.ClusterStateReload, c.ClusterStateReloadInterval)
	// The tests' cluster clients follow a failover as the binaries' do.
	assert.Equal(t, redisconn.ClusterStateReload, redistest.ClusterStateReload)
	assert.Equal(t, c.Addrs, o.Addrs())
	assert.NotContains(t, o.String(), "cpw")

	cl := o.NewClient()
	defer cl.Close()
	assert.IsType(t, &redis.ClusterClient{}, cl)
}

func TestNewClientDoesNotShareOptions(t *testing.T) {
	t.Parallel()
	o, err := redisconn.Parse("redis://h1:7000?addr=h2:7000")
	require.NoError(t, err)
	c := o.NewClient()
	defer c.Close()
	assert.Equal(t, []string{"h1:7000", "h2:7000"}, o.Cluster.Addrs, "NewClient left the parsed options alone")
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	const pw = "hunter2-secret"
	tests := []struct {
		name string
		url  string
		want string
	}{
		{"scheme", "http://h:1", "want redis://"},
		{"garbage", "redis://:" + pw + "@h:port/0", "not a valid URL"},
		{"two dbs", "redis://:" + pw + "@h:1/1/2", "want redis://"},
		{"unknown option", "redis://:" + pw + "@h:1/0?frobnicate=1", "unexpected option"},
		{"empty master name", "redis://s1:26379?master_name=&password=" + pw, "master_name is empty"},
		{"sentinel bad addr", "redis://s1:26379?master_name=m&addr=nohost&password=" + pw, "want a Sentinel URL"},
		{"sentinel unix", "unix:///tmp/s.sock?master_name=m&password=" + pw, "want a Sentinel URL"},
		{"cluster db", "redis://:" + pw + "@h1:1/3?addr=h2:1", "database 0 only"},
		{"cluster bad addr", "redis://:" + pw + "@h1:1?addr=h2", "want a Cluster URL"},
		{"cluster db option", "redis://:" + pw + "@h1:1?addr=h2:1&db=2", "want a Cluster URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := redisconn.Parse(tt.url)
			require.Error(t, err)
			assert.True(t, errors.Is(err, redisconn.ErrURL))
			assert.ErrorContains(t, err, tt.want)
			assert.NotContains(t, err.Error(), pw)
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://u:pw@h:1/0", "redis://u:xxxxx@h:1/0"},
		{"redis://s:spw@s1:26379/0?master_name=m&password=pw&username=u", "redis://s:xxxxx@s1:26379/0?master_name=m&password=xxxxx&username=u"},
		{"redis://h:1?addr=h2:1", "redis://h:1?addr=h2:1"},
		{"redis://:pw@h:port", "<unparseable URL>"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, redisconn.Redact(tt.in), tt.in)
	}
}

func TestConnOptSharesTheClient(t *testing.T) {
	t.Parallel()
	o, err := redisconn.Parse("redis://h1:7000?addr=h2:7000")
	require.NoError(t, err)
	c := o.NewClient()
	defer c.Close()
	assert.Same(t, c, redisconn.ConnOpt(c).MakeRedisClient())
}

// FuzzParse checks that Parse never panics and never puts a password it
// was given into an error.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"redis://:pw@h:1/2", "rediss://h", "unix:///tmp/r.sock", "%zz", "redis://h/1/2",
		"redis://s:pw@s1:1?master_name=m&addr=s2:1&password=pw", "redis://:pw@h1:1?addr=h2:1&addr=h3:1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		o, err := redisconn.Parse(raw)
		if err != nil {
			if !errors.Is(err, redisconn.ErrURL) {
				t.Fatalf("%q: error %v does not match ErrURL", raw, err)
			}
			return
		}
		c := o.NewClient()
		_ = c.Close()
	})
}
