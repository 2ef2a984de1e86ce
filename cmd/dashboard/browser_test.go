package main

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/redistest"
)

// chromium returns the path of Debian's chromium. It skips the test when
// there is none, and fails it under CI, which must install it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and CI must run the browser test: apt-get install -y chromium")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium); skipping the browser test")
	return ""
}

// TestBrowser opens the dashboard in headless chromium, as an operator
// would: the page without credentials is refused, and with them the queue
// and an order task's payload are shown. The screenshot is saved in the
// test's temporary directory, or in TEST_ARTIFACTS_DIR when that is set.
func TestBrowser(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	enqueueOrders(t, db)
	d := startDashboard(t, testEnv(db))

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		// The UI links web fonts from the internet; resolve no host name at
		// all, so that the browser talks to the loopback dashboard only.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.WindowSize(1400, 900),
	)
	t.Cleanup(cancelAlloc)
	browserCtx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	// The first call starts the browser; bind its life to browserCtx, not to
	// the timeout below.
	require.NoError(t, chromedp.Do(browserCtx))
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()

	// Without credentials the dashboard answers 401. Headless chromium,
	// having no one to ask for a password, turns that into the load error
	// ERR_INVALID_AUTH_CREDENTIALS; a browser that shows the 401 page
	// instead is fine too.
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(d.base+"/"))
	if err != nil {
		require.ErrorContains(t, err, "ERR_INVALID_AUTH_CREDENTIALS")
	} else {
		assert.Equal(t, int64(401), resp.Status)
	}
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	require.NoError(t, err)
	assert.NotContains(t, text, "Queues")
	assert.Contains(t, d.logs.String(), `"method":"GET","path":"/","route":"/","status":401`)

	// Log in: every request of the tab, the UI's API calls included,
	// carries the basic-auth header.
	creds := base64.StdEncoding.EncodeToString([]byte(testUser + ":" + testPassword))
	_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Basic " + creds},
	})
	require.NoError(t, err)

	// The home page lists the queue.
	resp, err = chromedp.RunResponse(ctx, chromedp.Navigate(d.base+"/"))
	require.NoError(t, err)
	assert.Equal(t, int64(200), resp.Status)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`document.body.innerText.includes("order_modify")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the queue name never appeared on the home page")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`//a[contains(., "order_modify")] | //td[contains(., "order_modify")]`)))

	// The pending tasks page shows the order task with its header line.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/queues/"+queue+"?status=pending")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`document.body.innerText.includes("order_no=SO1001")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the order task's payload never appeared on the task list")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`//pre[contains(., "order_no=SO1001")]`)))
	text, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	require.NoError(t, err)
	assert.Contains(t, text, "order:modify  order_no=SO1001\nevent_id=evt-1001")
	assert.Contains(t, text, "order_no=SO1002")
	assert.Contains(t, text, `"address": "1 Main St"`)

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("TEST_ARTIFACTS_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	file := filepath.Join(dir, "dashboard-pending-tasks.png")
	require.NoError(t, os.WriteFile(file, shot, 0o644))
	t.Logf("screenshot: %s", file)

	requireNoSecrets(t, d.logs.String())
}
