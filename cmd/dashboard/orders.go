package main

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/cmd/internal/safetext"
	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The order page sits beside asynqmon, under its root, because asynqmon
// finds a task only by its ID, and operators ask about an order:
//
//	GET <root>/orders             a search box; ?no=SO1 redirects to <root>/orders/SO1
//	GET <root>/orders/{order_no}  what is happening to the order (orderview.Status)
//	GET <root>/orders/order.js    the page's script; order.css its style
//
// It links into asynqmon's own pages (<root>/queues/{queue}/tasks/{id} and
// <root>/queues/{queue}?status={state}). In read-write mode each task has
// the write actions asynqmon's UI offers for its state; a button sends the
// same request to asynqmon's API that asynqmon's UI sends, so it passes
// the same guards (authentication, cross-origin protection, the task ID
// guard, read-only mode) and nothing new can write.

//go:embed orderpage
var orderFiles embed.FS

// orderTimeout bounds the Redis work of one order page.
const orderTimeout = 10 * time.Second

// orderCSP is the order page's Content-Security-Policy: its own script and
// style only, and requests to its own origin only.
const orderCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// orderPages serves the order page. It is safe for concurrent use.
type orderPages struct {
	views    *orderview.Reader
	rdb      redis.UniversalClient
	queues   *queueSet
	kinds    tasks.Table // the kinds whose queues asynqmon's pages are linked for
	root     string      // asynqmon's root path: "" or "/asynq"
	readOnly bool
	ops      *orderops.Ops
	log      *zap.Logger
	tmpl     *template.Template
}

// action is a write button of the order page: one asynqmon API request.
type action struct {
	Label, Method, URL, TaskID string
	// Confirm, when set, is asked before the request is sent.
	Confirm string
}

// pageData is what the order page's template reads.
type pageData struct {
	Root     string
	ReadOnly bool
	Query    string
	Error    string
	St       *orderview.Status
	// Suspicious are the queues asynq knows that the deployment does not
	// define, quoted (at most maxListedQueues, of SuspiciousTotal); the
	// search view lists them.
	Suspicious      []string
	SuspiciousTotal int
	Shards          string
}

// newOrderPages returns the order page over views; rdb and queues find the
// suspicious queues its search view lists; it links asynqmon's pages of
// the tasks in the queues of kinds.
func newOrderPages(views *orderview.Reader, ops *orderops.Ops, rdb redis.UniversalClient, queues *queueSet, kinds tasks.Table, root string, readOnly bool, log *zap.Logger) (*orderPages, error) {
	p := &orderPages{views: views, ops: ops, rdb: rdb, queues: queues, kinds: kinds, root: root, readOnly: readOnly, log: log}
	funcs := template.FuncMap{
		"taskURL":  p.taskURL,
		"queueURL": p.queueURL,
		"contains": strings.Contains,
		// clean escapes control and bidi characters, as the CLI does:
		// html/template escapes HTML, not an override that makes the
		// rest of a remark read backwards.
		"clean":        safetext.Escape,
		"actions":      p.actions,
		"orderActions": p.orderActions,
		"time":         func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"ago":          func(now, t time.Time) string { return max(now.Sub(t), 0).Round(time.Second).String() + " ago" },
		"ms":           func(n int64) string { return (time.Duration(n) * time.Millisecond).Round(time.Second).String() },
		"count":        orderview.Count,
		"waiting":      func(s orderview.Sequence) int64 { return s.Last - s.Done },
	}
	t, err := template.New("order.html").Funcs(funcs).ParseFS(orderFiles, "orderpage/order.html")
	if err != nil {
		return nil, err
	}
	p.tmpl = t
	return p, nil
}

// ServeHTTP serves <root>/orders and what is under it.
func (p *orderPages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if no, action, ok := actionPath(strings.TrimPrefix(r.URL.Path, p.root+"/orders/")); ok && r.URL.Path != p.root+"/orders" {
		p.act(w, r, no, action)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, p.root+"/orders")
	switch rest {
	case "", "/":
		p.search(w, r)
	case "/order.js", "/order.css":
		p.asset(w, r, rest[1:])
	default:
		p.order(w, r, rest[1:])
	}
}

// search answers the search box, and sends a search to the order's page.
func (p *orderPages) search(w http.ResponseWriter, r *http.Request) {
	no := strings.TrimSpace(r.URL.Query().Get("no"))
	switch {
	case no == "":
		p.render(w, r, http.StatusOK, p.suspicious(r.Context()))
	case !tasks.ValidOrderNo(no):
		p.render(w, r, http.StatusBadRequest, pageData{Query: no, Error: badOrderNo(no)})
	default:
		http.Redirect(w, r, p.root+"/orders/"+no, http.StatusSeeOther)
	}
}

// suspicious returns the search view's data: the queues asynq knows that
// the deployment does not define. When Redis fails the view goes without
// them, and the failure is logged.
func (p *orderPages) suspicious(ctx context.Context) pageData {
	ctx, cancel := context.WithTimeout(ctx, orderTimeout)
	defer cancel()
	names, total, err := p.queues.unknownQueues(ctx, p.rdb)
	if err != nil {
		p.log.Warn("order page: could not list the suspicious queues", zap.Error(err))
		return pageData{}
	}
	d := pageData{SuspiciousTotal: total, Shards: p.queues.shards}
	for _, n := range names {
		d.Suspicious = append(d.Suspicious, quoteName(n))
	}
	return d
}

// order answers the page of order no.
func (p *orderPages) order(w http.ResponseWriter, r *http.Request, no string) {
	if !tasks.ValidOrderNo(no) {
		p.render(w, r, http.StatusBadRequest, pageData{Query: no, Error: badOrderNo(no)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), orderTimeout)
	defer cancel()
	st, err := p.views.Status(ctx, no)
	if err != nil {
		status, msg := http.StatusServiceUnavailable, "Could not read the order: Redis failed or is unreachable. Try again."
		if errors.Is(err, orders.ErrInvalid) {
			status, msg = http.StatusBadRequest, badOrderNo(no)
		} else {
			p.log.Warn("order page: status read failed", zap.String("order_no", no), zap.Error(err))
			httpserve.InfoFrom(r.Context()).Code = "unavailable"
		}
		p.render(w, r, status, pageData{Query: no, Error: msg})
		return
	}
	p.render(w, r, http.StatusOK, pageData{Query: no, St: &st})
}

func badOrderNo(no string) string {
	return "Not an order number: " + safeField(no) + ". An order number is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'."
}

// render writes the page with status.
func (p *orderPages) render(w http.ResponseWriter, r *http.Request, status int, d pageData) {
	d.Root, d.ReadOnly = p.root, p.readOnly
	writePage(w, r, status, p.tmpl, d, p.log.With(zap.String("page", "order")))
}

// writePage renders tmpl with data and writes it with status and the
// headers of the dashboard's own pages (no caching, orderCSP); HEAD gets
// the headers alone. A template that fails is logged and answered 500.
func writePage(w http.ResponseWriter, r *http.Request, status int, tmpl *template.Template, data any, log *zap.Logger) {
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		log.Error("page template failed", zap.Error(err))
		http.Error(w, "could not render the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", orderCSP)
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.Bytes())
	}
}

// asset serves the page's script or style.
func (p *orderPages) asset(w http.ResponseWriter, r *http.Request, name string) {
	b, err := orderFiles.ReadFile("orderpage/" + name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ct := "text/css; charset=utf-8"
	if strings.HasSuffix(name, ".js") {
		ct = "text/javascript; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
}

// taskURL is asynqmon's page of a task; "#" for an ID outside the contract,
// whose page asynqmon cannot open, or a queue of no configured kind.
func (p *orderPages) taskURL(queue, id string) string {
	if !tasks.ValidEventID(id) || p.kinds.OfQueue(queue) == nil {
		return "#"
	}
	return p.root + "/queues/" + url.PathEscape(queue) + "/tasks/" + url.PathEscape(id)
}

// queueURL is asynqmon's list of a queue's tasks in state.
func (p *orderPages) queueURL(queue, state string) string {
	if p.kinds.OfQueue(queue) == nil {
		return "#"
	}
	return p.root + "/queues/" + url.PathEscape(queue) + "?status=" + url.QueryEscape(state)
}

// actionPath reads "<order_no>/actions/<action>".
func actionPath(rest string) (no, action string, ok bool) {
	no, action, ok = strings.Cut(rest, "/actions/")
	return no, action, ok && !strings.Contains(action, "/")
}

// act answers POST <root>/orders/{order_no}/actions/{action}: an operator
// action on the order (orderops), as the dashboard user, with the reason
// of the JSON body {"reason": "..."}. In read-only mode every action is
// refused, 403. The answer is JSON: the action's result, or
// {"error": "..."}.
func (p *orderPages) act(w http.ResponseWriter, r *http.Request, no, name string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		actionJSON(w, http.StatusMethodNotAllowed, actionError{"method not allowed"})
		return
	}
	if p.readOnly {
		httpserve.InfoFrom(r.Context()).Code = "read_only"
		actionJSON(w, http.StatusForbidden, actionError{"the dashboard is read-only (DASHBOARD_READ_ONLY): no action is allowed"})
		return
	}
	a, ok := orderops.ParseAction(name)
	if !ok || !tasks.ValidOrderNo(no) {
		actionJSON(w, http.StatusNotFound, actionError{"no such action"})
		return
	}
	// The body is decoded as strictly as the intake's: an unknown or
	// repeated field is refused.
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, orderops.MaxBodyLen))
	var body orderops.Body
	if err == nil {
		body, err = orderops.DecodeBody(b)
	}
	if err != nil {
		actionJSON(w, http.StatusBadRequest, actionError{fmt.Sprintf(`the body must be one JSON object, {"reason": "..."}, of at most %d bytes, without other or repeated fields`, orderops.MaxBodyLen)})
		return
	}
	by, _ := httpauth.Principal(r.Context())
	ctx, cancel := context.WithTimeout(r.Context(), orderTimeout)
	defer cancel()
	res, err := p.ops.Do(ctx, a, orderops.Request{OrderNo: no, By: cmp.Or(by, "dashboard"), Reason: body.Reason})
	// The answer's text quotes what Redis holds (a hold's principal and
	// reason): it is escaped as the pages escape it, since the pages show
	// it.
	var rl *orderops.RateLimitError
	switch {
	case err == nil:
		escapeText(reflect.ValueOf(&res))
		actionJSON(w, http.StatusOK, res)
	case errors.As(err, &rl):
		secs := int64(rl.RetryAfter / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		actionJSON(w, http.StatusTooManyRequests, actionError{fmt.Sprintf("too many operator actions by this user; try again in %d s", secs)})
	case errors.Is(err, orderops.ErrInvalid):
		actionJSON(w, http.StatusBadRequest, actionError{safetext.Escape(err.Error())})
	case errors.Is(err, orderops.ErrRefused):
		actionJSON(w, http.StatusConflict, actionError{safetext.Escape(err.Error())})
	default:
		p.log.Warn("order action failed", zap.String("order_no", no), zap.String("action", name), zap.Error(err))
		actionJSON(w, http.StatusServiceUnavailable, actionError{"Redis failed or is unreachable; try again"})
	}
}

// actionError is the JSON of a refused action.
type actionError struct {
	Error string `json:"error"`
}

func actionJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// orderActions are the operator actions' buttons of the order page: one
// request each to <root>/orders/{order_no}/actions/{action}, with the
// reason typed beside them.
func (p *orderPages) orderActions(no string) []action {
	if p.readOnly {
		return nil
	}
	var out []action
	for _, a := range orderops.Actions() {
		out = append(out, p.orderAction(no, a))
	}
	return out
}

// orderAction is the button of operator action a on order no, on the
// order page and the blocked-orders page alike.
func (p *orderPages) orderAction(no string, a orderops.Action) action {
	labels := map[orderops.Action]string{orderops.Retry: "Retry now", orderops.Skip: "Skip", orderops.Hold: "Hold", orderops.Resume: "Resume"}
	act := action{Label: labels[a], Method: http.MethodPost, URL: p.root + "/orders/" + url.PathEscape(no) + "/actions/" + string(a), TaskID: no}
	if a == orderops.Skip {
		act.Confirm = "Skip the change whose turn it is in " + no + "? It is archived and will not be applied; the changes behind it go on."
	}
	return act
}

// actions returns the write actions asynqmon's UI offers for a task in its
// state, as asynqmon API requests; none in read-only mode or for a task ID
// outside the contract (the guard would refuse them).
func (p *orderPages) actions(t orderview.Task) []action {
	if p.readOnly || !tasks.ValidEventID(t.TaskID) || p.kinds.OfQueue(t.Queue) == nil {
		return nil
	}
	base := p.root + "/api/queues/" + url.PathEscape(t.Queue) + "/" + t.State + "_tasks/" + url.PathEscape(t.TaskID)
	run := action{Label: "Run", Method: http.MethodPost, URL: base + ":run", TaskID: t.TaskID}
	archive := action{Label: "Archive", Method: http.MethodPost, URL: base + ":archive", TaskID: t.TaskID,
		Confirm: "Archive task " + t.TaskID + "? Its change will not be applied unless it is run again; the changes behind it go on without it."}
	del := action{Label: "Delete", Method: http.MethodDelete, URL: base, TaskID: t.TaskID,
		Confirm: "Delete task " + t.TaskID + "? Its change is lost for good; if it is waiting, its position is skipped after the gap wait."}
	switch t.State {
	case "pending":
		return []action{archive, del}
	case "active":
		return []action{{Label: "Cancel", Method: http.MethodPost, URL: base + ":cancel", TaskID: t.TaskID}}
	case "scheduled", "retry":
		return []action{run, archive, del}
	case "archived":
		return []action{run, del}
	case "completed":
		del.Confirm = "Delete completed task " + t.TaskID + "? Its event ID can then be enqueued again (the store still applies it at most once)."
		return []action{del}
	}
	return nil
}
