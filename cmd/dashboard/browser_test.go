package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/orderviewtest"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// chromium returns the path of Debian's chromium. It skips the test when
// there is none, and fails it under CI, which must install it.
func chromium(t *testing.T) string {
	t.Helper()
	redistest.SkipShort(t, "a browser")
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

// newBrowser starts headless chromium for the test and returns the context
// of its first tab, ended with the test. The first call starts the browser;
// its life is bound to the tab's context, not to a timeout.
func newBrowser(t *testing.T, path string) context.Context {
	t.Helper()
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
	require.NoError(t, chromedp.Do(browserCtx))
	return browserCtx
}

// logIn makes every request of the tab, the UI's API calls included, carry
// the test's basic-auth credentials.
func logIn(ctx context.Context, t *testing.T) {
	t.Helper()
	creds := base64.StdEncoding.EncodeToString([]byte(testUser + ":" + testPassword))
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Basic " + creds},
	})
	require.NoError(t, err)
}

// screenshot saves the page in the test's temporary directory, or in
// TEST_ARTIFACTS_DIR when that is set, and logs the path.
func screenshot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("TEST_ARTIFACTS_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	file := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(file, shot, 0o644))
	t.Logf("screenshot: %s", file)
}

// cspWatch collects the Content-Security-Policy violations of a tab: those
// the page reports (the securitypolicyviolation event, recorded by a script
// the browser runs before the page's own) and those the browser logs.
type cspWatch struct {
	ctx    context.Context
	mu     sync.Mutex
	logged []string
}

// watchCSP starts collecting the tab's CSP violations; call it before the
// first navigation.
func watchCSP(ctx context.Context, t *testing.T) *cspWatch {
	t.Helper()
	w := &cspWatch{ctx: ctx}
	_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
		Source: `window.__csp = []; document.addEventListener("securitypolicyviolation", e => ` +
			`window.__csp.push(e.effectiveDirective + " blocked " + e.blockedURI + " at " + e.sourceFile + ":" + e.lineNumber));`,
	})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, cdplog.Enable, cdp.Empty{})
	require.NoError(t, err)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*cdplog.EventEntryAdded); ok && strings.Contains(e.Entry.Text, "Content Security Policy") {
			w.mu.Lock()
			w.logged = append(w.logged, e.Entry.Text)
			w.mu.Unlock()
		}
	}))
	return w
}

// violations returns the violations of the current page and those logged
// since the tab opened.
func (w *cspWatch) violations(t *testing.T) []string {
	t.Helper()
	got, err := chromedp.Run(w.ctx, chromedp.Evaluate[[]string](`window.__csp || ["the violation recorder did not run"]`))
	require.NoError(t, err)
	w.mu.Lock()
	defer w.mu.Unlock()
	return append(got, w.logged...)
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

	browserCtx := newBrowser(t, path)
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

	logIn(ctx, t)
	csp := watchCSP(ctx, t)

	// The home page lists the queue, under a Content-Security-Policy that
	// allows its own inline scripts by hash.
	resp, err = chromedp.RunResponse(ctx, chromedp.Navigate(d.base+"/"))
	require.NoError(t, err)
	assert.Equal(t, int64(200), resp.Status)
	policy, _ := resp.Headers["Content-Security-Policy"].(string)
	assert.Contains(t, policy, "default-src 'none'; script-src 'self' 'sha256-")
	assert.NotContains(t, policy, "unsafe-eval")
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

	screenshot(ctx, t, "dashboard-pending-tasks.png")
	assert.Empty(t, csp.violations(t), "the queue pages")

	// asynqmon's other pages render under the policy too, with no violation.
	for _, p := range []struct{ path, text string }{
		{"/queues/" + queue + "/tasks/evt-1001", "order_no=SO1001"},
		{"/queues/" + queue + "?status=archived", "No archived tasks"},
		{"/servers", "No servers found at this time."},
		{"/schedulers", "Scheduler Entries"},
		{"/redis", "Version"},
		{"/settings", "Polling Interval"},
	} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+p.path)), p.path)
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.body.innerText.includes(`+strconv.Quote(p.text)+`)`,
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "%s never showed %q", p.path, p.text)
		assert.Empty(t, csp.violations(t), p.path)
	}

	// The recorder sees a violation: an image from elsewhere is blocked.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const i = document.createElement("img"); i.src = "https://example.invalid/x.png"; document.body.append(i); return true; })()`))
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`window.__csp.length > 0`, chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err, "the violation of img-src was not reported")
	assert.Contains(t, csp.violations(t)[0], "img-src blocked https://example.invalid/x.png")
	requireNoSecrets(t, d.logs.String())
}

// craftedID is a task ID that, pasted unescaped into the URL of a row's
// Delete, makes the browser send DELETE .../pending_tasks:delete_all.
const craftedID = "../pending_tasks:delete_all"

// TestBrowserCraftedTaskID enqueues, through raw asynq (no contract), a task
// whose ID is craftedID beside ordinary pending modifies, and clicks that
// row's Delete in a writable dashboard as an operator would. The dashboard
// must refuse the request with a JSON error, and every task must still be
// pending: before the guard, the click deleted every pending task.
func TestBrowserCraftedTaskID(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	client := asynq.NewClientFromRedisClient(db.Client)
	ids := []string{"evt-2001", "evt-2002", "evt-2003", craftedID}
	for i, id := range ids {
		_, err := client.EnqueueContext(t.Context(),
			asynq.NewTask("order:modify", orderPayload(fmt.Sprintf("e%d", i), fmt.Sprintf("SO200%d", i+1))),
			asynq.Queue(queue), asynq.TaskID(id))
		require.NoError(t, err)
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(queue, true) })
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	answered := noteWrites(ctx, t)
	csp := watchCSP(ctx, t)

	// The crafted task is the one of order SO2004; its row shows its ID in
	// the dashboard's display form, never raw.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/queues/"+queue+"?status=pending")))
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](
		`document.body.innerText.includes("order_no=SO2004") && document.body.innerText.includes("order_no=SO2003")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the tasks never appeared on the task list")
	row := `//tr[td//pre[contains(., "order_no=SO2004")]]`
	shown := displayTaskID(craftedID)
	idCell, err := chromedp.Run(ctx, chromedp.Text(row+`/th`))
	require.NoError(t, err)
	assert.Equal(t, shown, strings.TrimSpace(idCell), "the crafted ID is shown escaped")

	// The row's action cell shows "…" until the pointer is on it; clicking
	// it shows Delete and Archive, Delete first.
	actions := row + `/td[last()]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(actions+`//button`)))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`(`+actions+`//button)[2]`)))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`(`+actions+`//button)[1]`)))

	select {
	case w := <-answered:
		assert.Equal(t, http.MethodDelete, w.method)
		assert.True(t, strings.HasSuffix(w.url, "/api/queues/"+queue+"/pending_tasks/"+shown), w.url)
		assert.Equal(t, int64(http.StatusBadRequest), w.status, "the dashboard refuses the click")
	case <-ctx.Done():
		t.Fatalf("no answer to the Delete click: %v", ctx.Err())
	}
	assert.Contains(t, d.logs.String(), `"status":400`)
	assert.Contains(t, d.logs.String(), `"error_code":"`+errorCodeInvalidTaskID+`"`)

	// Nothing changed: every task, the crafted one too, is still pending.
	pending, err := insp.ListPendingTasks(queue)
	require.NoError(t, err)
	var got []string
	for _, ti := range pending {
		got = append(got, ti.ID)
	}
	assert.ElementsMatch(t, ids, got, "the click changed the queue")

	screenshot(ctx, t, "dashboard-crafted-task-id.png")
	assert.Empty(t, csp.violations(t), "the row's actions under the Content-Security-Policy")
	requireNoSecrets(t, d.logs.String())
}

// TestBrowserOrderPage opens the order page of a writable dashboard under a
// root path, as an operator asking about order SO1001 would: it searches
// for the order, reads what the page says of its waiting, retried and
// archived tasks, follows a task's link into asynqmon, and runs the
// archived task again from the order page. The screenshot is kept like
// TestBrowser's.
func TestBrowserOrderPage(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() {
		_ = insp.DeleteQueue(tasks.QueueModify, true)
		_ = insp.DeleteQueue(tasks.QueueExchange, true)
	})
	s := orderviewtest.Build(t, db.Client, db.Prefix, "SO1001")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false", "DASHBOARD_ROOT", "/ops"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	csp := watchCSP(ctx, t)

	// The search box leads to the order's page.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/orders")))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`input[name="no"]`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`input[name="no"]`), "SO1001")))
	require.NoError(t, chromedp.Do(ctx, chromedp.Submit(chromedp.CSS(`input[name="no"]`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#order-no`))))
	loc, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.pathname`))
	require.NoError(t, err)
	assert.Equal(t, "/ops/orders/SO1001", loc)

	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	summary := text(`#summary`)
	assert.Contains(t, summary, "SO1001 is active, version 2")
	lead := text(`#summary li:first-child`)
	assert.True(t, strings.HasPrefix(lead, "Its next change fails: task "+s.Retried+" (order:modify, position "), "the failing head leads: %s", lead)
	assert.Contains(t, lead, "failed 1 of 6 allowed times, last at ")
	assert.Contains(t, lead, ": upstream said 503. It runs again at ")
	assert.Contains(t, summary, "1 task(s) wait for their turn, parked in asynq's retry set (not failures).")
	assert.Contains(t, summary, "1 of its tasks are archived")
	assert.Contains(t, text(`#order`), "2 New Rd, "+s.Applied)
	assert.Contains(t, text(`#lock`), "Free.")
	waiting := text(`#waiting`)
	assert.Contains(t, waiting, fmt.Sprintf("%d\tnext\treserved", s.Seq[s.Retried]))
	assert.Contains(t, waiting, s.Parked)
	assert.Contains(t, text(`#log`), "archived: failed 1 times, out of its failure budget of 0 retries: upstream said 500")

	row := func(id string) string { return `#tasks tr[data-task="` + id + `"]` }
	assert.Contains(t, text(row(s.Retried)), "its turn: failed 1 of 6 allowed times; runs again at ")
	assert.Contains(t, text(row(s.Parked)), "waits for its turn (1 position is ahead of it): parked in asynq's retry set, not failed")
	assert.Contains(t, text(row(s.Archived)), "archived")
	assert.Contains(t, text(row(s.Applied)), "applied: version 2, changed address")
	hrefs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#tasks tr[data-task="`+s.Retried+`"] a')).map(a => a.getAttribute("href"))`))
	require.NoError(t, err)
	assert.Equal(t, []string{"/ops/queues/order_modify/tasks/" + s.Retried, "/ops/queues/order_modify?status=retry"}, hrefs,
		"links into asynqmon's task page and state list, under the root")
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#tasks tr[data-task="`+s.Archived+`"] button')).map(b => b.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"Run", "Delete"}, buttons, "asynqmon's actions for an archived task")
	screenshot(ctx, t, "dashboard-order-page.png")

	// The task's link opens asynqmon's page of that task.
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(row(s.Archived)+` td:first-child a`)))
	require.NoError(t, err)
	assert.Equal(t, int64(http.StatusOK), resp.Status)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`location.pathname === "/ops/queues/order_modify/tasks/`+s.Archived+`" && document.body.innerText.includes("`+orderviewtest.FailArchived+`")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "asynqmon's task page did not show the archived task")

	// Run the archived task again from the order page: it goes through
	// asynqmon's API and its guards, and the page shows it pending.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/orders/SO1001")))
	// The button's request succeeds and the page reloads.
	_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(row(s.Archived)+` button`)))
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`(() => { const r = document.querySelector('#tasks tr[data-task="`+s.Archived+`"]'); return r !== null && r.innerText.includes("pending"); })()`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the archived task never showed pending after Run")
	info, err := insp.GetTaskInfo(tasks.QueueModify, s.Archived)
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State)
	assert.Contains(t, d.logs.String(), `"method":"POST","path":"/ops/api/queues/order_modify/archived_tasks/`+s.Archived+`:run"`)
	assert.Empty(t, csp.violations(t), "the order page and asynqmon's under /ops")
	requireNoSecrets(t, d.logs.String())
}

// TestBrowserPlantedQueues reproduces the planted queues of issue 21 in a
// writable dashboard: beside order_modify with 3 pending changes, asynq's
// set of queues gets "order_modify/pending_tasks:delete_all" and
// "order_modify/pending_tasks:archive_all#". asynqmon's home page would
// show a row for each, and a click on the first row's Delete sent
// DELETE /api/queues/order_modify/pending_tasks:delete_all, one on the
// second row's Pause POST /api/queues/order_modify/pending_tasks:archive_all:
// "Delete all" and "Archive all" of order_modify. The test clicks Pause and
// Delete on every row a planted name shows in, as an operator would; the
// dashboard must show no such row, and the 3 changes must still be pending.
func TestBrowserPlantedQueues(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	client := asynq.NewClientFromRedisClient(db.Client)
	for i := range 3 {
		id := fmt.Sprintf("evt-300%d", i+1)
		_, err := client.EnqueueContext(t.Context(), asynq.NewTask("order:modify", orderPayload(id, fmt.Sprintf("SO300%d", i+1))),
			asynq.Queue(queue), asynq.TaskID(id))
		require.NoError(t, err)
	}
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	t.Cleanup(func() { _ = insp.DeleteQueue(queue, true) })
	plantQueues(t, db, plantedDelete, plantedArchive)
	d := startDashboard(t, testEnv(db, "DASHBOARD_READ_ONLY", "false"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	writes := noteWrites(ctx, t)
	csp := watchCSP(ctx, t)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/")))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`//table[@aria-label="queues overview table"]//tr[td[contains(., "`+queue+`")] or th[contains(., "`+queue+`")]]`)))
	screenshot(ctx, t, "dashboard-planted-queues.png")

	rowOf := func(name string) string {
		return `//table[@aria-label="queues overview table"]/tbody/tr[*[1][contains(., "` + name + `")]]`
	}
	rows := func(name string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.evaluate('count(`+rowOf(name)+`)', document, null, XPathResult.NUMBER_TYPE, null).numberValue`))
		require.NoError(t, err)
		return n
	}
	// Click, on each row of a planted name, what an operator would: the
	// row's "…", then Pause (the archive one) or Delete and its
	// confirmation (the delete one).
	clicked := 0
	for _, p := range []struct {
		name   string
		button int // 1 Pause, 2 Delete
	}{{"pending_tasks:archive_all", 1}, {"pending_tasks:delete_all", 2}} {
		if rows(p.name) == 0 {
			continue
		}
		actions := rowOf(p.name) + `/td[last()]`
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(actions+`//button`)))
		require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`(`+actions+`//button)[2]`)))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(fmt.Sprintf(`(%s//button)[%d]`, actions, p.button))))
		if p.button == 2 {
			confirm := `//div[@role="dialog"]//button[contains(., "Delete")]`
			require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(confirm)))
			require.NoError(t, chromedp.Do(ctx, chromedp.Click(confirm)))
		}
		clicked++
		select {
		case w := <-writes:
			t.Logf("the click on %q sent %s %s: %d", p.name, w.method, w.url, w.status)
		case <-ctx.Done():
			t.Fatalf("no answer to the click on %q: %v", p.name, ctx.Err())
		}
	}

	assert.Zero(t, clicked, "a planted queue had a row with actions on asynqmon's home page")
	assert.Zero(t, rows("pending_tasks:"), "no row shows a planted queue")
	info, err := insp.GetQueueInfo(queue)
	require.NoError(t, err)
	assert.Equal(t, 3, info.Pending, "the 3 pending changes are still pending")
	assert.Zero(t, info.Archived, "nothing was archived")
	assert.False(t, info.Paused)

	// The order page's search view lists them as suspicious instead.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/orders")))
	text, err := chromedp.Run(ctx, chromedp.Text(`#suspicious`))
	require.NoError(t, err)
	assert.Contains(t, text, `"`+plantedDelete+`"`)
	assert.Contains(t, text, `"`+plantedArchive+`"`)
	assert.Empty(t, csp.violations(t))
	requireNoSecrets(t, d.logs.String())
}

// write is a write request the page sent, with the status of its answer.
type write struct {
	method, url string
	status      int64
}

// noteWrites notes every write request the tab sends and returns a channel
// that receives each one once answered.
func noteWrites(ctx context.Context, t *testing.T) <-chan write {
	t.Helper()
	var mu sync.Mutex
	writes := map[network.RequestID]*write{}
	answered := make(chan write, 16)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			if ev.Request.Method != http.MethodGet && ev.Request.Method != http.MethodHead {
				writes[ev.RequestID] = &write{method: ev.Request.Method, url: ev.Request.URL}
			}
		case *network.EventResponseReceived:
			if w, ok := writes[ev.RequestID]; ok {
				w.status = ev.Response.Status
				select {
				case answered <- *w:
				default:
				}
			}
		}
	}))
	return answered
}

// TestBrowserBlockedPage opens the blocked-orders page of a read-only
// dashboard under a root path, from the order page's link, as an operator
// looking for stuck orders would: it reads the counts and the rows (a held
// order, whose reason has a bidi override, and three scheduled ones),
// filters by reason, pages, and follows an order's link to its order page
// and a task's link to asynqmon's page of it. Then a dashboard whose Redis
// is down shows its error on the page. Both fail on any CSP violation.
func TestBrowserBlockedPage(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	seedScheduled(t, db, "SO1", "SO2", "SO3", "SOH")
	seedHeld(t, db, "SOH", "ops@example.com", "check the \u202eaddress", time.Now().Add(-time.Hour))
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms", "DASHBOARD_ROOT", "/ops"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	csp := watchCSP(ctx, t)

	b := blockedTab{t, ctx}
	loaded, rows := b.loaded, b.rows
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	row := func(no string) string { return `#orders tr[data-order="` + no + `"]` }

	// The order page links to the list.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/orders")))
	_, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`header a[href="/ops/blocked-orders"]`)))
	require.NoError(t, err)
	loaded("from the order page")
	loc, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.pathname`))
	require.NoError(t, err)
	assert.Equal(t, "/ops/blocked-orders", loc)

	assert.Equal(t, []string{"SOH", "SO1", "SO2", "SO3"}, rows(), "oldest first")
	reasons := text(`#reason-list`)
	for _, c := range []string{"all 4", "held 1", "scheduled 3", "failing 0", "gap 0"} {
		assert.Contains(t, reasons, c)
	}
	assert.Contains(t, text(`#list-title`), "Orders: 4")
	held := text(row("SOH"))
	assert.Contains(t, held, "held")
	assert.Contains(t, held, "1h00m")
	assert.Contains(t, held, `Held by ops@example.com since `)
	assert.Contains(t, held, `check the \u202eaddress`, "the override is shown escaped")
	assert.NotContains(t, held, "\u202e")
	so1 := text(row("SO1"))
	assert.Contains(t, so1, "scheduled")
	assert.Contains(t, so1, "Its next change, task SO1-later, is scheduled to run at ")
	hrefs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('`+row("SO1")+` a')).map(a => a.getAttribute("href"))`))
	require.NoError(t, err)
	assert.Equal(t, []string{"/ops/orders/SO1", "/ops/queues/order_modify/tasks/SO1-later", "/ops/queues/order_modify?status=scheduled"}, hrefs,
		"the order page, asynqmon's task page and its state list, under the root")
	actions, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#orders td.actions").length`))
	require.NoError(t, err)
	assert.Zero(t, actions, "no actions column when read-only")
	screenshot(ctx, t, "dashboard-blocked-orders.png")

	// A reason's count filters the list.
	_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`#reason-list li[data-reason="held"] a`)))
	require.NoError(t, err)
	loaded("filtered")
	assert.Equal(t, []string{"SOH"}, rows())
	assert.Contains(t, text(`#list-title`), "Orders blocked for held: 1")

	// Pages of 3: the next page has the last one, and leads back.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/blocked-orders?limit=3")))
	loaded("first page")
	assert.Equal(t, []string{"SOH", "SO1", "SO2"}, rows())
	_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`#next`)))
	require.NoError(t, err)
	loaded("next page")
	assert.Equal(t, []string{"SO3"}, rows())
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`[document.getElementById("next").hidden, document.getElementById("first").hidden]`))
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false}, hidden, "no next page; a link to the first")

	// An order's link opens its order page.
	_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(row("SO3")+` a.order`)))
	require.NoError(t, err)
	assert.Equal(t, "SO3", text(`#order-no`))

	// A task's link opens asynqmon's page of it.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/blocked-orders")))
	loaded("again")
	_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(row("SO1")+` a.task`)))
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`location.pathname === "/ops/queues/order_modify/tasks/SO1-later" && document.body.innerText.includes("order_no=SO1")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "asynqmon's task page did not show the task")
	assert.Empty(t, csp.violations(t), "the blocked-orders page, the order page and asynqmon's under /ops")
	requireNoSecrets(t, d.logs.String())

	// With Redis down the page says so, and nothing is thrown.
	down := startDashboard(t, redisDownEnv(t))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(down.base+"/blocked-orders")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("blocked").dataset.state === "error"`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page did not show the error")
	assert.Contains(t, text(`#error`), "Could not read the blocked orders: Redis failed or is unreachable. Try again.")
	assert.Empty(t, csp.violations(t), "the error")
}

// blockedTab drives the blocked-orders page in a browser tab for a test.
type blockedTab struct {
	t   *testing.T
	ctx context.Context
}

// loaded waits for the list to be read, and requires it read without
// error.
func (b blockedTab) loaded(what string) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.getElementById("blocked").dataset.state !== "loading"`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(b.t, err, "%s: the list never loaded", what)
	state, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.getElementById("blocked").dataset.state`))
	require.NoError(b.t, err)
	require.Equal(b.t, "loaded", state, what)
}

// evalOn evaluates expr on b's page and returns its value.
func evalOn[T any](b blockedTab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	require.NoError(b.t, err, expr)
	return v
}

// rows returns the order numbers of the list's rows, in order.
func (b blockedTab) rows() []string {
	b.t.Helper()
	return evalOn[[]string](b, `Array.from(document.querySelectorAll("#orders tbody tr")).map(r => r.dataset.order)`)
}

// buttons returns the labels of order no's action buttons.
func (b blockedTab) buttons(no string) []string {
	b.t.Helper()
	return evalOn[[]string](b, `Array.from(document.querySelectorAll('#orders tr[data-order="`+no+`"] td.actions button')).map(b => b.textContent)`)
}

// act clicks order no's button of action, and waits for its outcome in
// #action-result: "done" (the list read again) or "refused". It returns
// the outcome and its text.
func (b blockedTab) act(no, action string) (state, text string) {
	b.t.Helper()
	evalOn[string](b, `document.getElementById("action-result").dataset.state = ""`)
	require.NoError(b.t, chromedp.Do(b.ctx, chromedp.Click(chromedp.CSS(`#orders tr[data-order="`+no+`"] button[data-action="`+action+`"]`))))
	_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`["done", "refused"].includes(document.getElementById("action-result").dataset.state)`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(b.t, err, "%s of %s never ended", action, no)
	return evalOn[string](b, `document.getElementById("action-result").dataset.state`),
		evalOn[string](b, `document.getElementById("action-result").textContent`)
}

// pausedOf returns order no's hold as its sequence records it, nil when it
// is not held.
func pausedOf(t *testing.T, db *redistest.DB, no string) *keyorder.Pause {
	t.Helper()
	seq, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
	require.NoError(t, err)
	st, err := seq.Status(t.Context(), no)
	require.NoError(t, err)
	return st.Paused
}

// TestBrowserBlockedActions uses the operator actions of the blocked-orders
// page of a writable dashboard under a root path, as an operator would:
// two orders are blocked, scheduled. A hold without a reason is refused
// with the dashboard's message and changes nothing; with a reason, it
// holds the order (the list then shows it held by the dashboard user, for
// that reason, with only Resume); Resume ends the hold; Retry now runs the
// other order's change at once, which takes it off the list. The sequence
// and asynq are checked after each. It fails on any CSP violation.
func TestBrowserBlockedActions(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	seedScheduled(t, db, "SO1", "SO2")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms", "DASHBOARD_ROOT", "/ops",
		"DASHBOARD_READ_ONLY", "false"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	csp := watchCSP(ctx, t)
	b := blockedTab{t, ctx}
	row := func(no string) string {
		t.Helper()
		return evalOn[string](b, `document.querySelector('#orders tr[data-order="`+no+`"]').innerText`)
	}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/blocked-orders")))
	b.loaded("first")
	require.ElementsMatch(t, []string{"SO1", "SO2"}, b.rows())
	for _, no := range []string{"SO1", "SO2"} {
		assert.Equal(t, []string{"Retry now", "Skip", "Hold"}, b.buttons(no), "a scheduled order's actions")
	}

	// Hold needs a reason: refused, and nothing changes.
	state, text := b.act("SO1", "hold")
	assert.Equal(t, "refused", state)
	assert.Contains(t, text, "Hold SO1 refused: orderops: invalid request: hold needs a reason")
	assert.Nil(t, pausedOf(t, db, "SO1"))

	// With a reason, the order is held by the dashboard user.
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#action-reason`), "customer called")))
	state, text = b.act("SO1", "hold")
	require.Equal(t, "done", state, text)
	assert.Contains(t, text, "Hold SO1: on hold since ")
	b.loaded("after the hold")
	assert.Equal(t, "held", evalOn[string](b, `document.querySelector('#orders tr[data-order="SO1"]').dataset.reason`))
	assert.Contains(t, row("SO1"), "Held by "+testUser+" since ")
	assert.Contains(t, row("SO1"), "customer called")
	assert.Equal(t, []string{"Resume"}, b.buttons("SO1"), "a held order's action")
	p := pausedOf(t, db, "SO1")
	require.NotNil(t, p, "the sequence is paused")
	assert.Equal(t, testUser, p.By)
	assert.Equal(t, "customer called", p.Reason)
	screenshot(ctx, t, "dashboard-blocked-actions.png")

	// Resume ends the hold: the order is blocked as scheduled again.
	state, text = b.act("SO1", "resume")
	require.Equal(t, "done", state, text)
	assert.Contains(t, text, "Resume SO1: the hold (hold by "+testUser+": customer called) ended")
	assert.Equal(t, "scheduled", evalOn[string](b, `document.querySelector('#orders tr[data-order="SO1"]').dataset.reason`))
	assert.NotContains(t, row("SO1"), "Held by")
	assert.Equal(t, []string{"Retry now", "Skip", "Hold"}, b.buttons("SO1"))
	assert.Nil(t, pausedOf(t, db, "SO1"), "the hold is gone from the sequence")

	// Retry now runs SO2's scheduled change at once: it is pending, and the
	// order is no longer listed.
	state, text = b.act("SO2", "retry")
	require.Equal(t, "done", state, text)
	assert.Contains(t, text, "Retry now SO2: task SO2-later (position ")
	assert.Contains(t, text, ") moved from scheduled to pending: it runs next")
	assert.Equal(t, []string{"SO1"}, b.rows())
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "SO2-later")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStatePending, info.State)

	assert.Contains(t, d.logs.String(), `"method":"POST","path":"/ops/orders/SO1/actions/hold"`)
	assert.Empty(t, csp.violations(t), "the blocked-orders page's actions")
	requireNoSecrets(t, d.logs.String())
}

// TestBrowserBlockedPageWithCredentialsInTheURL opens the blocked-orders
// page of a writable dashboard as http://user:pass@host/blocked-orders, as
// a bookmark or a monitoring check would, with no other login: the list
// loads (a page whose URL has credentials cannot fetch a URL resolved
// against it; the page's requests are built from its origin), an
// operator action on it acts, and so does one on the order page.
func TestBrowserBlockedPageWithCredentialsInTheURL(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	seedScheduled(t, db, "SO1", "SO2")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms", "DASHBOARD_READ_ONLY", "false"))
	u, err := url.Parse(d.base)
	require.NoError(t, err)
	u.User = url.UserPassword(testUser, testPassword)

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	csp := watchCSP(ctx, t)
	_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	b := blockedTab{t, ctx}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u.String()+"/blocked-orders")))
	b.loaded("with credentials in the URL")
	require.ElementsMatch(t, []string{"SO1", "SO2"}, b.rows())

	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#action-reason`), "customer called")))
	state, text := b.act("SO1", "hold")
	require.Equal(t, "done", state, text)
	require.NotNil(t, pausedOf(t, db, "SO1"), "held")

	// The order page's buttons too.
	writes := noteWrites(ctx, t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u.String()+"/orders/SO1")))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#order-no`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#action-reason`), "done checking")))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`button[data-url$="/actions/resume"]`))))
	select {
	case w := <-writes:
		assert.Equal(t, write{http.MethodPost, d.base + "/orders/SO1/actions/resume", http.StatusOK}, w,
			"sent from the page's origin, without the credentials of its URL")
	case <-ctx.Done():
		t.Fatal("the order page sent no resume")
	}
	assert.Nil(t, pausedOf(t, db, "SO1"), "resumed from the order page")
	assert.Empty(t, csp.violations(t))
	requireNoSecrets(t, d.logs.String())
}

// TestBrowserBlockedActionsReadOnly opens the blocked-orders page of a
// read-only dashboard (the default): no actions column, no button, no
// reason field; and an action POSTed from the page itself, with its
// origin and credentials, is answered 403 with a JSON error, and the order
// is not held.
func TestBrowserBlockedActionsReadOnly(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	seedScheduled(t, db, "SO1")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "BLOCKED_AFTER", "1ms"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	csp := watchCSP(ctx, t)
	b := blockedTab{t, ctx}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/blocked-orders")))
	b.loaded("read-only")
	assert.Equal(t, []string{"SO1"}, b.rows())
	assert.Equal(t, []string{"order", "reason", "waiting since", "changes held back", "next change", "why"},
		evalOn[[]string](b, `Array.from(document.querySelectorAll("#orders th")).map(h => h.textContent)`), "no actions column")
	assert.Zero(t, evalOn[int](b, `document.querySelectorAll("#orders button, #orders td.actions").length`), "no action button")
	assert.False(t, evalOn[bool](b, `document.getElementById("action-reason") !== null`), "no reason field")

	// The page's own request, as a button would send it, is refused.
	type answer struct {
		Status      int    `json:"status"`
		ContentType string `json:"contentType"`
		Error       string `json:"error"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[answer](`(async () => {
		const r = await fetch("/orders/SO1/actions/hold", { method: "POST", credentials: "same-origin",
			headers: { "Content-Type": "application/json" }, body: JSON.stringify({ reason: "customer called" }) });
		return { status: r.status, contentType: r.headers.get("Content-Type"), error: (await r.json()).error };
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, answer{Status: http.StatusForbidden, ContentType: "application/json",
		Error: "the dashboard is read-only (DASHBOARD_READ_ONLY): no action is allowed"}, got)
	assert.Nil(t, pausedOf(t, db, "SO1"), "nothing was held")
	info, err := asynq.NewInspectorFromRedisClient(db.Client).GetTaskInfo(tasks.QueueModify, "SO1-later")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateScheduled, info.State, "nothing was run")
	assert.Contains(t, d.logs.String(), `"error_code":"read_only"`)
	assert.Empty(t, csp.violations(t), "the read-only blocked-orders page")
}

// TestBrowserOrderActions holds and resumes an order from its order page
// on a writable dashboard, as an operator would: a reason typed beside the
// buttons, Hold, then Resume. After each the page reloads and its
// sequence log says who did it and why; the sequence is checked too.
func TestBrowserOrderActions(t *testing.T) {
	path := chromium(t)
	db := redistest.New(t)
	seedWaiting(t, db, "SO1001", "crm-7f3a9c")
	d := startDashboard(t, testEnv(db, "KEY_PREFIX", db.Prefix, "DASHBOARD_READ_ONLY", "false"))

	browserCtx := newBrowser(t, path)
	ctx, cancel := context.WithTimeout(browserCtx, 90*time.Second)
	defer cancel()
	logIn(ctx, t)
	csp := watchCSP(ctx, t)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/orders/SO1001")))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#order-actions`))))
	labels, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#order-actions button")).map(b => b.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"Retry now", "Skip", "Hold", "Resume"}, labels)

	// press clicks the button labelled label, whose success reloads the
	// page, and waits for want in the sequence log.
	press := func(label, want string) {
		t.Helper()
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//section[@id="order-actions"]//button[.="`+label+`"]`))
		require.NoError(t, err, label)
		require.Equal(t, int64(http.StatusOK), resp.Status, label)
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("log") !== null && document.getElementById("log").innerText.includes(`+strconv.Quote(want)+`)`,
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "%s: the page never showed %q", label, want)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#action-reason`), "customer called")))
	press("Hold", "hold by "+testUser+": customer called")
	p := pausedOf(t, db, "SO1001")
	require.NotNil(t, p)
	assert.Equal(t, testUser, p.By)
	assert.Equal(t, "customer called", p.Reason)
	assert.Contains(t, d.logs.String(), `"method":"POST","path":"/orders/SO1001/actions/hold"`)

	press("Resume", "resume by "+testUser)
	assert.Nil(t, pausedOf(t, db, "SO1001"), "the hold is gone")
	assert.Empty(t, csp.violations(t), "the order page's actions")
	requireNoSecrets(t, d.logs.String())
}
