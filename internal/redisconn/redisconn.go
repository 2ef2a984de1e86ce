// Package redisconn turns a Redis URL (REDIS_URL) into the one
// redis.UniversalClient of an orderworker process, whatever the topology
// behind it:
//
//	redis://[user:password@]host:port[/db]            one node (rediss:// for TLS,
//	unix:///path/to/socket                            unix:// for a socket)
//	redis://[suser:spass@]s1:26379[/db]?master_name=mymaster&addr=s2:26379[&username=u&password=p]
//	                                                  a Sentinel group: the host and
//	                                                  every addr are sentinels; the
//	                                                  data nodes' credentials are the
//	                                                  username and password parameters
//	redis://[user:password@]h1:p1?addr=h2:p2[&addr=h3:p3]
//	                                                  a Cluster: the host and every
//	                                                  addr are seed nodes (two or more)
//
// The topology is told from the query: master_name means Sentinel, addr
// without master_name means Cluster, neither means one node. Every form
// takes go-redis's query options (dial_timeout=3s, pool_size=20, …); see
// redis.ParseURL, redis.ParseFailoverURL and redis.ParseClusterURL.
//
// A Cluster needs two or more addresses in the URL: with one, go-redis
// would take it for a single node and every command on another node's slot
// would fail with MOVED. A Cluster has database 0 only.
//
// It is not for tests' servers (see internal/testkit/redistest) and knows no
// environment variable: cmd/* reads REDIS_URL, through internal/config.
package redisconn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Topology says which kind of deployment a URL names.
type Topology string

// The topologies a URL can name.
const (
	Single   Topology = "single"   // one node (it may have replicas the client never uses)
	Sentinel Topology = "sentinel" // a master found through Sentinel, followed across failovers
	Cluster  Topology = "cluster"  // a Redis Cluster
)

// Options is a parsed Redis URL. Exactly one of Node, Failover and Cluster
// is set, as Topology says. Every form has ContextTimeoutEnabled set, so
// that a context's deadline bounds a command (the lock's release and renewal
// timeouts rely on it).
//
// Options is a value: [Options.NewClient] may be called any number of
// times, each call making an independent client with its own pool, and is
// safe for concurrent use. Do not change the fields after Parse.
type Options struct {
	Topology Topology
	Node     *redis.Options         // for Single
	Failover *redis.FailoverOptions // for Sentinel
	Cluster  *redis.ClusterOptions  // for Cluster

	redacted string
}

// ErrURL is matched (errors.Is) by every error [Parse] returns.
var ErrURL = errors.New("redisconn: bad Redis URL")

// Forms lists the accepted URL forms, for usage texts and error messages.
const Forms = "redis://[user:pass@]host:port/db (rediss:// for TLS); " +
	"Sentinel: " + sentinelForm + "; " +
	"Cluster: " + clusterForm

// Parse reads a Redis URL in one of the forms of the package comment. It
// returns an error matching [ErrURL] that says what is wrong without ever
// quoting the password. It does no I/O.
func Parse(raw string) (*Options, error) {
	raw = strings.TrimSpace(raw)
	// Parse first ourselves: url.Parse's errors quote the whole URL,
	// password included.
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: not a valid URL: %w", ErrURL, err)
	}
	q := u.Query()
	o := &Options{redacted: Redact(raw)}
	switch {
	case q.Has("master_name"):
		if q.Get("master_name") == "" {
			return nil, fmt.Errorf("%w: master_name is empty (Sentinel: %s)", ErrURL, sentinelForm)
		}
		f, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: want a Sentinel URL like %s: %w", ErrURL, sentinelForm, err)
		}
		f.ContextTimeoutEnabled = true
		o.Topology, o.Failover = Sentinel, f
	case q.Has("addr"):
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			return nil, fmt.Errorf("%w: a Cluster has database 0 only, the URL asks for /%s", ErrURL, db)
		}
		c, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: want a Cluster URL like %s: %w", ErrURL, clusterForm, err)
		}
		c.ContextTimeoutEnabled = true
		c.ClusterStateReloadInterval = ClusterStateReload
		o.Topology, o.Cluster = Cluster, c
	default:
		n, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: want %s: %w", ErrURL, Forms, err)
		}
		n.ContextTimeoutEnabled = true
		o.Topology, o.Node = Single, n
	}
	return o, nil
}

// ClusterStateReload is how old a Cluster client's map of slots to masters
// may get before its next command reloads it (CLUSTER SLOTS on one node,
// in the background). go-redis's default of 60 s would leave a client
// dialing a crashed master for up to a minute after its replica took over
// (it reloads at once only on a MOVED, which a dead node cannot send); at
// 1 s a client follows within about a second of the cluster's election, for
// one small command per second per process.
const ClusterStateReload = time.Second

const (
	sentinelForm = "redis://[user:pass@]sentinel:26379/db?master_name=NAME&addr=sentinel2:26379[&username=U&password=P]"
	clusterForm  = "redis://[user:pass@]node1:6379?addr=node2:6379&addr=node3:6379"
)

// NewClient returns a new client for the topology: a *redis.Client for one
// node, a *redis.Client that follows the Sentinel group's master for
// Sentinel, and a *redis.ClusterClient for a Cluster. A Sentinel client
// also moves its subscriptions to the new master after a failover, at its
// first connection there (go-redis alone leaves them on the old master). It does no I/O; the
// first command dials. The caller closes it.
func (o *Options) NewClient() redis.UniversalClient {
	switch o.Topology {
	case Sentinel:
		f := *o.Failover
		f.SentinelAddrs = append([]string(nil), f.SentinelAddrs...)
		c := redis.NewFailoverClient(&f)
		c.AddHook(newFollowMaster())
		return c
	case Cluster:
		c := *o.Cluster
		c.Addrs = append([]string(nil), c.Addrs...)
		return redis.NewClusterClient(&c)
	default:
		n := *o.Node
		return redis.NewClient(&n)
	}
}

// String returns the URL with its passwords redacted (see [Redact]).
func (o *Options) String() string { return o.redacted }

// Addrs returns the addresses the URL names: the node's, the sentinels' or
// the cluster's seed nodes. They carry no credentials and may be logged.
func (o *Options) Addrs() []string {
	switch o.Topology {
	case Sentinel:
		return append([]string(nil), o.Failover.SentinelAddrs...)
	case Cluster:
		return append([]string(nil), o.Cluster.Addrs...)
	default:
		return []string{o.Node.Addr}
	}
}

// secretParams are the query parameters that carry a password.
var secretParams = []string{"password", "sentinel_password"}

// Redact returns raw with the password of its user info and of its
// password query parameter replaced by "xxxxx", for logs and error
// messages. A string that does not parse as a URL is hidden whole, since it
// may be a password typed in the wrong place.
func Redact(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "<unparseable URL>"
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for _, k := range secretParams {
			if q.Has(k) {
				q.Set(k, "xxxxx")
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}

// ConnOpt returns an asynq.RedisConnOpt that hands out rdb itself, for
// asynqmon, which takes its connection only as a RedisConnOpt and calls
// MakeRedisClient for its own use and for its Inspector.
//
// Handing it the process's client keeps one pool and every option of the
// URL (ContextTimeoutEnabled, pool sizes, the Sentinel credentials), and
// works for every topology: asynqmon tells its Redis info page from the
// client's type (*redis.ClusterClient for a Cluster, *redis.Client for one
// node and Sentinel). The caller must therefore never call asynqmon's
// HTTPHandler.Close, which would close rdb; it closes rdb itself, once,
// after the server has stopped.
func ConnOpt(rdb redis.UniversalClient) asynq.RedisConnOpt { return sharedConn{rdb} }

type sharedConn struct{ client redis.UniversalClient }

// MakeRedisClient returns the shared client.
func (c sharedConn) MakeRedisClient() any { return c.client }
