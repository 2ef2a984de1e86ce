// Package conntest builds Redis clients for tests the way the binaries
// build theirs: from a URL (one node, a Sentinel group or a Cluster),
// through internal/redisconn. It is test support: only _test.go files
// import it (depguard). It lives apart from redistest because redisconn's
// own tests import redistest.
package conntest

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/internal/redisconn"
)

// Client returns a client built by redisconn from url, as a binary builds
// its one client, closed when the test ends: one more "process" for a test
// on a Cluster or a Sentinel group. It fails the test for a bad URL.
func Client(tb testing.TB, url string) redis.UniversalClient {
	tb.Helper()
	o, err := redisconn.Parse(url)
	if err != nil {
		tb.Fatalf("conntest: %v", err)
	}
	c := o.NewClient()
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
