package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/tasks"
)

// asynqmon v0.7.2's UI pastes task IDs into the URLs of its API calls
// without escaping them ("/queues/" + qname + "/pending_tasks/" + id), and
// the browser resolves the result as a URL before sending it. A task whose ID
// is "../pending_tasks:delete_all" therefore turns a click on that row's
// Delete into DELETE /api/queues/<q>/pending_tasks:delete_all: the same bytes
// as a click on "Delete all", which no server can tell apart. IDs with '?',
// '#' or "/.." act on another task.
//
// The contract's event IDs (tasks.ValidEventID) are safe in a URL as they
// are, and the intake and the producer only enqueue those; but anything that
// reaches Redis can enqueue a task with any ID. So guardTaskIDs does two
// things around asynqmon's API:
//
//   - It rewrites, in the API's JSON answers, every task ID ("id" and
//     "task_id" members) that is not a valid event ID into displayTaskID's
//     form: "~" and the ID percent-encoded, which a URL cannot read as
//     structure and which is no event ID either. The UI shows that, and any
//     action on that row carries it back.
//   - It refuses, with 400 and a JSON error, every write request (any method
//     but GET and HEAD) whose path is not canonical, whose path carries a task
//     ID that is not a valid event ID, or whose batch body (the task_ids of
//     the ":batch_*" routes) holds one. Nothing reaches asynqmon then.
//
// Tasks with such IDs stay visible, but the dashboard does nothing to them;
// remove them with asynq's Inspector or CLI.

// maxBatchBody is the largest body of a batch request, as asynqmon reads it.
const maxBatchBody = 1_000_000

// The actions asynqmon's single-task routes append to the task ID, as in
// POST .../pending_tasks/{task_id}:archive.
var taskActions = []string{":archive", ":run", ":cancel"}

// errorCodeInvalidTaskID is the error code of a write refused for its task
// ID or its path.
const errorCodeInvalidTaskID = "invalid_task_id"

// refusal is a request the guard refuses: its status, error code and
// message.
type refusal struct {
	status    int
	code, msg string
}

// guardAPI wraps asynqmon's handler with the task ID guard (above) and the
// queue guard (see queues.go); apiPrefix is the path of its API with a
// trailing slash, such as "/api/" or "/asynq/api/", and queues the queues
// the deployment defines. Requests outside the API pass through unchanged.
// The handler is safe for concurrent use.
func guardAPI(apiPrefix string, queues *queueSet, next http.Handler) http.Handler {
	prefixSegments := strings.Count(apiPrefix, "/") - 1
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !strings.HasPrefix(r.URL.Path, apiPrefix):
			next.ServeHTTP(w, r)
		case r.Method == http.MethodGet || r.Method == http.MethodHead:
			if api, ok := apiSegments(r, prefixSegments); ok {
				if rf := queues.checkNames(r.Method, api); rf != nil {
					refuse(w, r, rf)
					return
				}
			}
			if r.Method == http.MethodHead {
				next.ServeHTTP(w, r)
				return
			}
			rw := &idRewriter{ResponseWriter: w, queues: queues, stats: r.URL.Path == apiPrefix+"queue_stats"}
			next.ServeHTTP(rw, r)
			rw.flush()
		default:
			if rf := checkWrite(w, r, prefixSegments, queues); rf != nil {
				refuse(w, r, rf)
				return
			}
			next.ServeHTTP(w, r)
		}
	})
}

// apiSegments returns the segments of r's path after the API's prefix
// (which has prefixSegments segments), each decoded on its own: a task ID,
// a queue or a group is one segment, whatever '/' it has encoded. It
// reports false for a path too short or badly percent-encoded.
func apiSegments(r *http.Request, prefixSegments int) ([]string, bool) {
	segments := strings.Split(r.URL.EscapedPath(), "/")
	if len(segments) < 2+prefixSegments {
		return nil, false
	}
	for i, seg := range segments {
		d, err := url.PathUnescape(seg)
		if err != nil {
			return nil, false
		}
		segments[i] = d
	}
	return segments[1+prefixSegments:], true
}

// checkWrite checks a write request to asynqmon's API, whose path has
// prefixSegments segments before the API's own. It returns the refusal, or
// nil. It may replace r.Body with the same bytes.
func checkWrite(w http.ResponseWriter, r *http.Request, prefixSegments int, queues *queueSet) *refusal {
	// The segments as the UI wrote them: a task ID is one segment. Fewer of
	// them than the decoded path has means an encoded '/' in the prefix.
	const notCanonical = "the path is not canonical: it has an empty, '.' or '..' segment, an encoded '/' or a trailing '/'"
	if len(strings.Split(r.URL.EscapedPath(), "/")) < 2+prefixSegments {
		return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, notCanonical}
	}
	api, ok := apiSegments(r, prefixSegments) // "queues", qname, ...
	if !ok {
		return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, "the path is not canonical: bad percent-encoding"}
	}
	for i, seg := range api {
		// A segment after ".../<state>_tasks" is a task ID, perhaps with an
		// action: .../pending_tasks/{task_id} or .../{task_id}:archive.
		if i == 0 || !strings.HasSuffix(api[i-1], "_tasks") {
			continue
		}
		id := seg
		if r.Method == http.MethodPost {
			for _, a := range taskActions {
				if s, ok := strings.CutSuffix(seg, a); ok {
					id = s
					break
				}
			}
		}
		if !tasks.ValidEventID(id) {
			return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, invalidTaskID(id, "in the path")}
		}
	}

	// The path asynqmon's router matches is the decoded one, which it cleans
	// (and redirects to) first; an encoded '/' adds segments to it. Only a
	// path that reads the same every way is let through.
	p := r.URL.Path
	if path.Clean(p) != p || strings.Count(p, "/") != strings.Count(r.URL.EscapedPath(), "/") {
		return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, notCanonical}
	}
	if rf := queues.checkNames(r.Method, api); rf != nil {
		return rf
	}
	if strings.Contains(api[len(api)-1], "_tasks:batch_") {
		return checkBatch(w, r)
	}
	return nil
}

// checkBatch reads the body of a batch request as asynqmon does and checks
// its task IDs, then gives r the same body again.
func checkBatch(w http.ResponseWriter, r *http.Request) *refusal {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBatchBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &refusal{http.StatusRequestEntityTooLarge, errorCodeInvalidTaskID, fmt.Sprintf("the body is larger than %d bytes", maxBatchBody)}
	case err != nil:
		return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, "could not read the body"}
	}
	// The same decoding as asynqmon's: what it would act on is what is
	// checked.
	var req struct {
		TaskIDs []string `json:"task_ids"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, `the body must be {"task_ids": [...]}`}
	}
	for _, id := range req.TaskIDs {
		if !tasks.ValidEventID(id) {
			return &refusal{http.StatusBadRequest, errorCodeInvalidTaskID, invalidTaskID(id, "in task_ids")}
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}

func invalidTaskID(id, where string) string {
	const limit = 60
	shown := id
	if len(shown) > limit {
		shown = shown[:limit] + "..."
	}
	return fmt.Sprintf("task ID %s %s is not an event ID (%s); the dashboard does nothing to such a task",
		strconv.QuoteToASCII(shown), where, tasks.EventIDRule)
}

// refuse answers a refused request with a JSON error and notes its code
// for the access log.
func refuse(w http.ResponseWriter, r *http.Request, rf *refusal) {
	httpserve.InfoFrom(r.Context()).Code = rf.code
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = rf.code, rf.msg
	b, _ := json.Marshal(body) // strings only: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(rf.status)
	_, _ = w.Write(append(b, '\n'))
}

// displayTaskID is how the API shows a task ID that is not a valid event ID:
// "~" and the ID with every byte outside [A-Za-z0-9_.:-] percent-encoded, so
// "../pending_tasks:delete_all" reads "~..%2Fpending_tasks:delete_all". It
// has no '/', '?', '#' or '\', is never a "." or ".." path segment, and
// decodes to something that is not an event ID (it starts with '~'), so an
// action the UI builds from it is refused.
func displayTaskID(id string) string {
	var b strings.Builder
	b.WriteByte('~')
	for i := 0; i < len(id); i++ {
		c := id[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_.:-", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// idRewriter holds back a GET answer of asynqmon's API so that flush can
// rewrite the task IDs in it and hide the queues and groups queues hides.
// stats says the answer is that of .../queue_stats.
type idRewriter struct {
	http.ResponseWriter
	queues *queueSet
	stats  bool
	status int
	buf    bytes.Buffer
}

func (w *idRewriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *idRewriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.buf.Write(p)
}

// flush sends the answer held back, with its task IDs rewritten and its
// queues and groups outside the deployment hidden when it is JSON and has
// any. asynqmon v0.7.2 sets no Content-Type on its
// JSON answers (net/http then sniffs one), so an answer without one is
// tried as JSON too.
func (w *idRewriter) flush() {
	b := w.buf.Bytes()
	ct := w.Header().Get("Content-Type")
	if mt, _, _ := strings.Cut(ct, ";"); ct == "" || strings.TrimSpace(mt) == "application/json" {
		if out, ok := rewriteAnswer(b, w.queues, w.stats); ok {
			b = out
			w.Header().Del("Content-Length")
		}
	}
	if w.status != 0 {
		w.ResponseWriter.WriteHeader(w.status)
	}
	_, _ = w.ResponseWriter.Write(b)
}

// rewriteAnswer rewrites, in the JSON document b, every string member
// named "id" or "task_id" that is not a valid event ID into its
// displayTaskID form, and hides what names a queue outside the deployment
// or an unsafe group (queueSet.hideNames; stats for the answer of
// .../queue_stats). It reports false, and returns nothing, when there was
// nothing to change or b is not JSON.
func rewriteAnswer(b []byte, queues *queueSet, stats bool) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	hidden := queues.hideNames(doc, stats)
	if !rewriteValue(doc) && !hidden {
		return nil, false
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, false
	}
	return append(out, '\n'), true
}

// rewriteValue rewrites v in place and reports whether it changed anything.
func rewriteValue(v any) bool {
	changed := false
	switch v := v.(type) {
	case map[string]any:
		for k, m := range v {
			if s, ok := m.(string); ok && (k == "id" || k == "task_id") && !tasks.ValidEventID(s) {
				v[k] = displayTaskID(s)
				changed = true
				continue
			}
			changed = rewriteValue(m) || changed
		}
	case []any:
		for _, m := range v {
			changed = rewriteValue(m) || changed
		}
	}
	return changed
}
