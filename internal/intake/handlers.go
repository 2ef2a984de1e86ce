package intake

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/orderworker/orderworker/worker/orders"
)

// post enqueues a task of kind k: 202 with the producer's Result.
func (s *Server) post(k *tasks.Kind, w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	p, aerr := decodePayload(k, r.PathValue("order_no"), r.Header.Values(HeaderIdempotencyKey), body)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	httpserve.InfoFrom(r.Context()).EventID = p.Header().EventID
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	res, err := s.producer.Enqueue(ctx, p)
	s.enqueued(w, r, res, err)
}

// enqueued answers an enqueue by the producer's outcome.
func (s *Server) enqueued(w http.ResponseWriter, r *http.Request, res producer.Result, err error) {
	var dup *producer.DuplicateError
	switch {
	case err == nil:
		w.Header().Set("Location", "/v1/tasks/"+url.PathEscape(res.TaskID))
		writeJSON(w, http.StatusAccepted, res)
	case errors.As(err, &dup) && dup.LookupErr != nil:
		// The event's ID is taken, but the task holding it could not be
		// read: Redis failed, or the task went away in between (then a
		// retry enqueues it afresh).
		s.writeError(w, r, unavailable(msgUnavailable, err))
	case errors.As(err, &dup) && dup.SamePayload:
		s.writeError(w, r, &apiError{
			status: http.StatusConflict, code: codeDuplicate,
			message: fmt.Sprintf("event %q was already enqueued with this payload, as task %q in queue %s (%s)",
				dup.EventID, dup.TaskID, dup.Queue, dup.State),
			existing: &existingTask{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID, State: dup.State.String()},
		})
	case errors.As(err, &dup):
		s.writeError(w, r, &apiError{
			status: http.StatusUnprocessableEntity, code: codeKeyReused, field: "event_id",
			message: fmt.Sprintf("event %q was already enqueued with a different payload, as task %q in queue %s; use a new Idempotency-Key for a different change",
				dup.EventID, dup.TaskID, dup.Queue),
			existing: &existingTask{TaskID: dup.TaskID, Queue: dup.Queue, EventID: dup.EventID},
		})
	case errors.Is(err, producer.ErrBacklogFull):
		// Nothing was written: the order's backlog drains as its changes
		// are applied, so the same request may be sent again later.
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(s.cfg.RetryAfter.Seconds()))))
		s.writeError(w, r, &apiError{status: http.StatusTooManyRequests, code: codeBacklogFull, cause: err,
			message: "too many changes of this order wait to be applied (the producer's MAX_WAITING); nothing was enqueued: retry later with the same Idempotency-Key"})
	case errors.Is(err, tasks.ErrInvalid):
		// Unreachable: the payload was validated before.
		s.writeError(w, r, payloadError(err))
	default:
		// A Redis or timeout error, or the producer closed at shutdown.
		s.writeError(w, r, unavailable(msgUnavailable, err))
	}
}

// orderNo returns the order number of the path, or a 400.
func orderNo(r *http.Request) (string, *apiError) {
	no := r.PathValue("order_no")
	if !tasks.ValidOrderNo(no) {
		return "", badOrderNo()
	}
	return no, nil
}

// storeError answers an error of the order store.
func storeError(err error) *apiError {
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return &apiError{status: http.StatusNotFound, code: codeNotFound, message: "no such order"}
	case errors.Is(err, orders.ErrInvalid):
		return badParameter("order_no", err.Error())
	}
	return unavailable(msgUnavailableReadOnly, err)
}

// serveRead answers a read: it runs read bounded by RequestTimeout, and
// answers 200 with its value, or the error fail maps its error to.
func serveRead[T any](s *Server, w http.ResponseWriter, r *http.Request, read func(context.Context) (T, error), fail func(error) *apiError) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	v, err := read(ctx)
	if err != nil {
		s.writeError(w, r, fail(err))
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// serveOrderRead is serveRead of read of the order the path names, with a
// 400 for a malformed order number.
func serveOrderRead[T any](s *Server, w http.ResponseWriter, r *http.Request, read func(ctx context.Context, orderNo string) (T, error), fail func(error) *apiError) {
	no, aerr := orderNo(r)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	serveRead(s, w, r, func(ctx context.Context) (T, error) { return read(ctx, no) }, fail)
}

// limitParam returns the ?limit= of a page read, from 1 to most, or 0 when
// it is not given; anything else is a 400.
func limitParam(r *http.Request, most int) (int, *apiError) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, badParameter("limit", fmt.Sprintf("limit must be an integer from 1 to %d", most))
	}
	return n, nil
}

// pageError answers an error of a page read: a 400 for a cursor this API
// did not answer (orderview.ErrBadCursor), else what fail answers.
func pageError(fail func(error) *apiError) func(error) *apiError {
	return func(err error) *apiError {
		if errors.Is(err, orderview.ErrBadCursor) {
			return badParameter("cursor", "cursor must be the next_cursor of a page this API answered")
		}
		return fail(err)
	}
}

// readOnlyError answers the error of a read with a 503: retry later.
func readOnlyError(err error) *apiError { return unavailable(msgUnavailableReadOnly, err) }

// getOrder answers the order.
func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) {
	serveOrderRead(s, w, r, s.store.Get, storeError)
}

// getHistory answers a page of the order's history, oldest entry first,
// with the positions its sequence skipped: ?limit= (1 to 1000, default 100)
// and ?cursor= (the next_cursor of the page before).
func (s *Server) getHistory(w http.ResponseWriter, r *http.Request) {
	no, aerr := orderNo(r)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	limit, aerr := limitParam(r, orders.MaxHistoryPage)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	q := orderview.HistoryQuery{Cursor: r.URL.Query().Get("cursor"), Limit: limit}
	serveRead(s, w, r, func(ctx context.Context) (orderview.History, error) { return s.views.History(ctx, no, q) }, pageError(storeError))
}

// getStatus answers what is happening to the order (orderview.Status): the
// order, or its absence, its lock, its sequence, its tasks and its latest
// history. An order nothing is known of is an empty status, not a 404.
func (s *Server) getStatus(w http.ResponseWriter, r *http.Request) {
	serveOrderRead(s, w, r, s.views.Status, storeError)
}

// getBlocked answers a page of the blocked-orders list
// (orderview.Reader.Blocked): ?limit= (1 to 1000, default 50), ?cursor=
// (the next_cursor of the page before) and ?reason= (one of
// orderview.Reasons). It is served at /v1/blocked-orders rather than
// /v1/orders/blocked, where it would take the place of GET
// /v1/orders/{order_no} for the order numbered "blocked", a valid one.
func (s *Server) getBlocked(w http.ResponseWriter, r *http.Request) {
	limit, aerr := limitParam(r, orderview.MaxBlockedLimit)
	if aerr != nil {
		s.writeError(w, r, aerr)
		return
	}
	q := orderview.BlockedQuery{Cursor: r.URL.Query().Get("cursor"), Reason: r.URL.Query().Get("reason"), Limit: limit}
	if q.Reason != "" && !slices.Contains(orderview.Reasons(), q.Reason) {
		s.writeError(w, r, badParameter("reason", "reason must be one of "+strings.Join(orderview.Reasons(), ", ")))
		return
	}
	serveRead(s, w, r, func(ctx context.Context) (orderview.BlockedPage, error) { return s.views.Blocked(ctx, q) }, pageError(readOnlyError))
}

// taskView is the answer of GET /v1/tasks/{task_id}.
type taskView struct {
	TaskID        string    `json:"task_id"`
	Queue         string    `json:"queue"`
	Type          string    `json:"type"`
	State         string    `json:"state"`
	MaxRetry      int       `json:"max_retry"`
	Retried       int       `json:"retried"`
	LastError     string    `json:"last_error,omitempty"`
	LastFailedAt  time.Time `json:"last_failed_at,omitzero"`
	NextProcessAt time.Time `json:"next_process_at,omitzero"`
	CompletedAt   time.Time `json:"completed_at,omitzero"`
}

// getTask answers the state of a task, looked for in the queues of each
// kind of the producer in its order (the contract's: the exchange queues,
// then the modify queues; every shard), or in the one the queue parameter
// names. The reads are bounded by RequestTimeout (see taskInfo).
func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("task_id")
	if !tasks.ValidEventID(id) {
		s.writeError(w, r, badParameter("task_id", "the task ID in the path must be an event ID: "+tasks.EventIDRule))
		return
	}
	queues := s.queues
	if q := r.URL.Query().Get("queue"); q != "" {
		if !slices.Contains(s.queues, q) {
			s.writeError(w, r, badParameter("queue", "queue must be one of "+strings.Join(s.queues, ", ")))
			return
		}
		queues = []string{q}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	for _, q := range queues {
		// A queue missing from asynq's set of queues (lost in a failover)
		// whose task exists is listed again, as an enqueue into it would:
		// its task is answered, not taken for gone. asynq.ErrQueueNotFound
		// is left only when the task does not exist either.
		info, relisted, err := s.taskInfo(ctx, q, id)
		if relisted {
			s.log.Warn("queue was missing from asynq's set of queues while its tasks exist; listed it again",
				zap.String("queue", q), zap.String("task_id", id))
		}
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
			continue
		case err != nil:
			s.writeError(w, r, unavailable(msgUnavailableReadOnly, err))
			return
		}
		var due time.Time
		if info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry {
			// asynq says "now" for other states; it means nothing there.
			due = utc(info.NextProcessAt)
		}
		writeJSON(w, http.StatusOK, taskView{
			TaskID:        info.ID,
			Queue:         info.Queue,
			Type:          info.Type,
			State:         info.State.String(),
			MaxRetry:      tasks.FailureBudget(info.MaxRetry),
			Retried:       info.Retried,
			LastError:     info.LastErr,
			LastFailedAt:  utc(info.LastFailedAt),
			NextProcessAt: due,
			CompletedAt:   utc(info.CompletedAt),
		})
		return
	}
	s.writeError(w, r, &apiError{status: http.StatusNotFound, code: codeNotFound,
		message: "no such task in " + strings.Join(queues, " or ")})
}

// taskInfo is asynqredis.TaskInfo bounded by ctx: asynq's Inspector takes
// no context, so the read runs on a goroutine of its own and ctx's end
// answers for it, with ctx's error, wrapped. The goroutine then ends with
// the read, which the Redis client's own timeouts bound; its answer is
// dropped.
func (s *Server) taskInfo(ctx context.Context, queue, id string) (*asynq.TaskInfo, bool, error) {
	type answer struct {
		info     *asynq.TaskInfo
		relisted bool
		err      error
	}
	done := make(chan answer, 1)
	go func() {
		info, relisted, err := asynqredis.TaskInfo(ctx, s.inspector, s.rdb, queue, id)
		done <- answer{info, relisted, err}
	}()
	select {
	case a := <-done:
		return a.info, a.relisted, a.err
	case <-ctx.Done():
		return nil, false, fmt.Errorf("read task %s of queue %s: %w", id, queue, ctx.Err())
	}
}

// utc returns t in UTC, keeping the zero time zero.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// status is the answer of /healthz and /readyz.
type status struct {
	Status string `json:"status"`
}

// healthz answers 200 while the process serves.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, status{"ok"})
}

// readyz answers 200 while Redis answers PING within ProbeTimeout; the
// answer is kept for a second (s.ready), so that a flood of probes makes
// about one PING a second.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.ready.Check(r.Context()); err != nil {
		s.writeError(w, r, unavailable("Redis does not answer", err))
		return
	}
	writeJSON(w, http.StatusOK, status{"ready"})
}
