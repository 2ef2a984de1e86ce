package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/orderworker/orderworker/cmd/internal/safetext"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/tasks"
)

// The blocked-orders page lists, without an order number, the orders that
// are stuck, why and since when (orderview.Reader.Blocked), beside the order
// page and behind the same authentication:
//
//	GET <root>/blocked-orders       the page: the counts by reason (each a
//	                                filter), the list oldest first, the next page
//	GET <root>/blocked-orders.json  a page of the list, which the page's script
//	                                fetches: ?limit= (1 to 1000, default 50),
//	                                ?cursor= (next_cursor), ?reason=
//	GET <root>/blocked-orders.js    the page's script; blocked-orders.css its
//	                                style, over the order page's
//
// It is not under <root>/orders/, where it would take the place of the page
// of the order numbered "blocked", a valid order number (the intake serves
// the list at /v1/blocked-orders for the same reason), and asynqmon has no
// page of that name.
//
// The page is a shell; its script renders the list from the JSON with
// textContent only, and every string of the JSON that came from Redis is
// escaped as the order page escapes it (see escapeText). The links are
// built here, as the order page builds them: each order to its order page,
// each task to asynqmon's page of it.

// blockedPath is the path of the page under asynqmon's root.
const blockedPath = "/blocked-orders"

// blockedPages serves the blocked-orders page. It is safe for concurrent
// use.
type blockedPages struct {
	views    *orderview.Reader
	links    *orderPages // asynqmon's task and queue links
	root     string      // asynqmon's root path: "" or "/asynq"
	readOnly bool
	log      *zap.Logger
	tmpl     *template.Template
}

// newBlockedPages returns the blocked-orders page over views, linking
// tasks as the order page links does.
func newBlockedPages(views *orderview.Reader, links *orderPages, root string, readOnly bool, log *zap.Logger) (*blockedPages, error) {
	t, err := template.ParseFS(orderFiles, "orderpage/blocked.html")
	if err != nil {
		return nil, err
	}
	return &blockedPages{views: views, links: links, root: root, readOnly: readOnly, log: log, tmpl: t}, nil
}

// ServeHTTP serves the page, its data and its script.
func (p *blockedPages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, p.root+blockedPath)
	switch rest {
	case "":
		p.page(w, r)
	case ".json":
		p.data(w, r)
	case ".js", ".css":
		p.links.asset(w, r, "blocked"+rest)
	default:
		http.NotFound(w, r)
	}
}

// page writes the page's shell; its script fills it in.
func (p *blockedPages) page(w http.ResponseWriter, r *http.Request) {
	writePage(w, r, http.StatusOK, p.tmpl, struct {
		Root     string
		ReadOnly bool
	}{p.root, p.readOnly}, p.log.With(zap.String("page", "blocked")))
}

// The error codes of <root>/blocked-orders.json.
const (
	errorCodeBadParameter = "bad_parameter"
	errorCodeUnavailable  = "unavailable"
)

// data answers a page of the list as a blockedView, or a JSON error:
// 400 bad_parameter for a bad limit, reason or cursor, 503 unavailable
// when Redis fails.
func (p *blockedPages) data(w http.ResponseWriter, r *http.Request) {
	q := orderview.BlockedQuery{Cursor: r.URL.Query().Get("cursor"), Reason: r.URL.Query().Get("reason")}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > orderview.MaxBlockedLimit {
			refuse(w, r, &refusal{http.StatusBadRequest, errorCodeBadParameter,
				fmt.Sprintf("limit must be an integer from 1 to %d", orderview.MaxBlockedLimit)})
			return
		}
		q.Limit = n
	}
	if q.Reason != "" && !slices.Contains(orderview.Reasons(), q.Reason) {
		refuse(w, r, &refusal{http.StatusBadRequest, errorCodeBadParameter,
			"reason must be one of " + strings.Join(orderview.Reasons(), ", ")})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), orderTimeout)
	defer cancel()
	page, err := p.views.Blocked(ctx, q)
	switch {
	case errors.Is(err, orderview.ErrBadCursor), errors.Is(err, orderview.ErrBadQuery):
		refuse(w, r, &refusal{http.StatusBadRequest, errorCodeBadParameter,
			"cursor must be the next_cursor of a page this dashboard answered"})
		return
	case err != nil:
		p.log.Warn("blocked page: list read failed", zap.Error(err))
		refuse(w, r, &refusal{http.StatusServiceUnavailable, errorCodeUnavailable,
			"Could not read the blocked orders: Redis failed or is unreachable. Try again."})
		return
	}
	b, err := json.Marshal(p.view(page, q.Reason))
	if err != nil {
		p.log.Error("blocked page: encode failed", zap.Error(err))
		http.Error(w, "could not encode the list", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if r.Method != http.MethodHead {
		_, _ = w.Write(append(b, '\n'))
	}
}

// blockedView is the answer of <root>/blocked-orders.json: a page of the
// list, with its strings escaped (see escapeText), and the links the page
// shows.
type blockedView struct {
	orderview.BlockedPage
	// Orders are the page's orders; this field hides BlockedPage.Orders.
	Orders []blockedRow `json:"orders"`
	// Reasons are all the reasons, in the list's order; Reason is the one
	// the page was asked for, empty for all.
	Reasons []string `json:"reasons"`
	Reason  string   `json:"reason,omitempty"`
}

// blockedRow is an order of the list with its links. A link is empty
// where there is nothing to open.
type blockedRow struct {
	orderview.BlockedOrder
	// OrderURL is the order's page.
	OrderURL string `json:"order_url"`
	// TaskURL is asynqmon's page of the head's task, and StateURL its
	// queue's list of the tasks in that state; empty when asynq has no
	// such task, or for an ID or queue outside the contract.
	TaskURL  string `json:"task_url,omitempty"`
	StateURL string `json:"state_url,omitempty"`
	// StaleTaskURL is asynqmon's page of the task that holds a stale lock,
	// when it is not the head's.
	StaleTaskURL string `json:"stale_task_url,omitempty"`
	// FromURL is the order page of the order whose exchange creates this
	// one (ReasonCreation).
	FromURL string `json:"from_url,omitempty"`
	// Actions are the operator actions the row offers (blockedActions);
	// none when the dashboard is read-only.
	Actions []rowAction `json:"actions,omitempty"`
}

// rowAction is an operator action of a row: a POST of {"reason": "..."}
// to URL, the order page's endpoint <root>/orders/{order_no}/actions/{action}
// (see orderPages.act), which answers the result or {"error": "..."}.
type rowAction struct {
	Action string `json:"action"`
	Label  string `json:"label"`
	URL    string `json:"url"`
	// NeedsReason says the action is refused without a reason (skip, hold).
	NeedsReason bool `json:"needs_reason,omitempty"`
	// Confirm, when set, is asked before the request is sent.
	Confirm string `json:"confirm,omitempty"`
}

// blockedActions returns the operator actions that may unblock, or stop,
// an order blocked for reason, in the order the row shows them:
//
//   - failing, scheduled: retry now (its task waits in asynq's retry or
//     scheduled set), skip, hold;
//   - gap, lock_stale, waiting: skip, hold (retry now applies only to a
//     task in the retry or scheduled set);
//   - creation: hold, and skip only when the exchange that makes the
//     order will never run (orderops.SkipsCreation of c's ExchangeState;
//     otherwise the skip is refused: the exchange, on its own order's
//     row, is what to skip or hold);
//   - halted: retry (in its place, ending the halt), skip;
//   - held: resume;
//   - unreadable: none (no action can read its sequence).
//
// They are offers: orderops.Ops.Do decides, and refuses with a message
// what the order's state does not allow when the button is pressed.
func blockedActions(reason string, c *orderview.Creation) []orderops.Action {
	switch reason {
	case orderview.ReasonFailing, orderview.ReasonScheduled:
		return []orderops.Action{orderops.Retry, orderops.Skip, orderops.Hold}
	case orderview.ReasonHalted:
		return []orderops.Action{orderops.Retry, orderops.Skip}
	case orderview.ReasonCreation:
		if c != nil && !orderops.SkipsCreation(c.ExchangeState) {
			return []orderops.Action{orderops.Hold}
		}
		return []orderops.Action{orderops.Skip, orderops.Hold}
	case orderview.ReasonGap, orderview.ReasonLockStale, orderview.ReasonWaiting:
		return []orderops.Action{orderops.Skip, orderops.Hold}
	case orderview.ReasonHeld:
		return []orderops.Action{orderops.Resume}
	default:
		return nil
	}
}

// view builds the answer of page, read for reason: the links first, from
// the values as read, then the strings escaped.
func (p *blockedPages) view(page orderview.BlockedPage, reason string) blockedView {
	v := blockedView{BlockedPage: page, Orders: make([]blockedRow, 0, len(page.Orders)), Reasons: orderview.Reasons(), Reason: reason}
	v.BlockedPage.Orders = nil
	for _, b := range page.Orders {
		row := blockedRow{BlockedOrder: b, OrderURL: p.orderURL(b.OrderNo)}
		if h := b.Head; h != nil && h.TaskID != "" && h.TaskState != orderview.TaskMissing {
			row.TaskURL = p.taskURL(h.Queue, h.TaskID)
			row.StateURL = p.links.queueURL(h.Queue, h.TaskState)
			if row.StateURL == "#" {
				row.StateURL = ""
			}
		}
		if l := b.Lock; l != nil && l.TaskState != orderview.TaskMissing && (b.Head == nil || l.TaskID != b.Head.TaskID) {
			row.StaleTaskURL = p.taskURL(l.Queue, l.TaskID)
		}
		if c := b.Creation; c != nil {
			row.FromURL = p.orderURL(c.From)
		}
		if !p.readOnly && row.OrderURL != "" {
			for _, a := range blockedActions(b.Reason, b.Creation) {
				act := p.links.orderAction(b.OrderNo, a)
				row.Actions = append(row.Actions, rowAction{Action: string(a), Label: act.Label, URL: act.URL,
					NeedsReason: a.NeedsReason(), Confirm: act.Confirm})
			}
		}
		escapeText(reflect.ValueOf(&row.BlockedOrder))
		v.Orders = append(v.Orders, row)
	}
	return v
}

// orderURL is the order page of order no; empty for what is not an order
// number.
func (p *blockedPages) orderURL(no string) string {
	if !tasks.ValidOrderNo(no) {
		return ""
	}
	return p.root + "/orders/" + url.PathEscape(no)
}

// taskURL is asynqmon's page of a task, as the order page links it; empty
// where the order page has "#".
func (p *blockedPages) taskURL(queue, id string) string {
	if u := p.links.taskURL(queue, id); u != "#" {
		return u
	}
	return ""
}

// escapeText escapes, with safetext.Escape, every string reachable from v
// through pointers, exported struct fields and slices, in place: the text
// of a blocked order (its explanation, labels, last error, a hold's reason,
// task IDs, the chain of creations) is shown as the order page and the CLI
// show it, a bidirectional override as `\u202e`. It visits every field, so a
// field added to orderview.BlockedOrder is escaped too. Maps are not
// visited (a blocked order has none).
func escapeText(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			escapeText(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				escapeText(f)
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			escapeText(v.Index(i))
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(safetext.Escape(v.String()))
		}
	default:
	}
}
