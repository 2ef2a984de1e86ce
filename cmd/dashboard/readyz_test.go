package main

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// TestReadyzFloodMakesFewPings floods /readyz over real sockets and counts
// the PINGs Redis saw. The dashboard's Redis user here may not PING (its
// rules minus +ping), so that Redis's ACL LOG counts every PING of that
// user, and no other test's: /readyz answers 503 each time, from a PING
// made at most about once a second.
func TestReadyzFloodMakesFewPings(t *testing.T) {
	db := redistest.New(t)
	rules, err := acl.Rules(acl.Dashboard, acl.Options{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	user := db.AsUser(t, append(rules, "-ping")...)
	d := startDashboard(t, testEnv(user, "KEY_PREFIX", db.Prefix))
	pings := func() int64 {
		t.Helper()
		entries, err := db.Client.ACLLog(t.Context(), 0).Result()
		require.NoError(t, err)
		var n int64
		for _, e := range entries {
			if e.Username == user.Options.Username && e.Object == "ping" {
				n += e.Count
			}
		}
		return n
	}
	before := pings()

	const clients, each = 8, 50
	start := time.Now()
	var wg sync.WaitGroup
	statuses := make(chan int, clients*each)
	for range clients {
		c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		t.Cleanup(c.CloseIdleConnections)
		wg.Go(func() {
			for range each {
				resp, err := c.Get(d.base + "/readyz")
				if err != nil {
					statuses <- -1
					continue
				}
				_ = resp.Body.Close()
				statuses <- resp.StatusCode
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(statuses)
	for s := range statuses {
		assert.Equal(t, http.StatusServiceUnavailable, s)
	}
	made := pings() - before
	t.Logf("%d requests in %v: %d PINGs", clients*each, elapsed, made)
	assert.Positive(t, made)
	assert.LessOrEqual(t, made, int64(elapsed/time.Second)+2, "about one PING a second")
}
