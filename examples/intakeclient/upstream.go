// Package intakeclient is an upstream's client of the orderworker intake,
// generated from api/openapi.yaml by oapi-codegen (client.gen.go; see
// oapi-codegen.yaml and the README's intake section), with the little an
// upstream adds around it: the API key and a request ID set once for
// every call, and enqueues that retry a lost or failed answer with the
// same Idempotency-Key.
//
// Its test (upstream_test.go) runs it against a real intake and worker.
package intakeclient

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml ../../api/openapi.yaml

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// New returns a client of the intake at base (http://host:port) that sends
// key as its bearer token, and a request ID, on every call: the headers
// the spec leaves out of the operations' parameters so that a client sets
// them once. doer is the HTTP client (nil: http.DefaultClient).
func New(base, key string, doer HttpRequestDoer) (*ClientWithResponses, error) {
	opts := []ClientOption{WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+key)
		return nil
	})}
	if doer != nil {
		opts = append(opts, WithHTTPClient(doer))
	}
	c, err := NewClientWithResponses(base, opts...)
	if err != nil {
		return nil, fmt.Errorf("intake client for %s: %w", base, err)
	}
	return c, nil
}

// Enqueued is an accepted change: its task and its position in the order's
// sequence.
type Enqueued struct {
	TaskID string
	Seq    int64
	// Tries is how many requests it took (more than 1 when an answer was
	// lost or failed and the request was sent again with the same key).
	Tries int
}

// retries is how many times an enqueue is sent before giving up.
const retries = 5

// Modify enqueues a modify of order no under event ID key. A 5xx answer,
// or none, is retried with the same key, and a 409 (the key was enqueued
// before with this payload: an earlier try whose answer was lost) counts
// as accepted, so the change is applied once however often it is sent.
func Modify(ctx context.Context, c *ClientWithResponses, no, key string, changes Changes) (Enqueued, error) {
	return enqueue(ctx, func(ctx context.Context) (int, *EnqueueResult, *DuplicateError, error) {
		r, err := c.EnqueueModifyWithResponse(ctx, no, &EnqueueModifyParams{IdempotencyKey: &key}, ModifyRequest{Changes: changes})
		if err != nil {
			return 0, nil, nil, err
		}
		return r.StatusCode(), r.JSON202, r.JSON409, nil
	})
}

// Exchange enqueues the exchange of order no for replacement newNo, with
// items, under event ID key, retried as Modify is.
func Exchange(ctx context.Context, c *ClientWithResponses, no, newNo, key string, items Items, reason string) (Enqueued, error) {
	return enqueue(ctx, func(ctx context.Context) (int, *EnqueueResult, *DuplicateError, error) {
		r, err := c.EnqueueExchangeWithResponse(ctx, no, &EnqueueExchangeParams{IdempotencyKey: &key},
			ExchangeRequest{Items: items, NewOrderNo: &newNo, Reason: &reason})
		if err != nil {
			return 0, nil, nil, err
		}
		return r.StatusCode(), r.JSON202, r.JSON409, nil
	})
}

func enqueue(ctx context.Context, send func(context.Context) (int, *EnqueueResult, *DuplicateError, error)) (Enqueued, error) {
	var last error
	for try := 1; try <= retries; try++ {
		status, ok, dup, err := send(ctx)
		switch {
		case err != nil:
			last = err // no answer: send it again, with the same key
		case status == http.StatusAccepted && ok != nil:
			return Enqueued{TaskID: ok.TaskId, Seq: ok.Seq, Tries: try}, nil
		case status == http.StatusConflict && dup != nil:
			return Enqueued{TaskID: dup.TaskId, Tries: try}, nil
		case status >= 500:
			last = fmt.Errorf("answered %d", status)
		default:
			return Enqueued{}, fmt.Errorf("enqueue refused: %d", status)
		}
		select {
		case <-ctx.Done():
			return Enqueued{}, errors.Join(last, ctx.Err())
		case <-time.After(time.Duration(try) * 50 * time.Millisecond):
		}
	}
	return Enqueued{}, fmt.Errorf("enqueue: %d tries: %w", retries, last)
}

// WaitTask polls task id until it ends, and returns its last state:
// completed, or archived with its last error.
func WaitTask(ctx context.Context, c *ClientWithResponses, id string) (*Task, error) {
	for {
		r, err := c.GetTaskWithResponse(ctx, id, nil)
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", id, err)
		}
		if r.JSON200 != nil && (r.JSON200.State == TaskStateCompleted || r.JSON200.State == TaskStateArchived) {
			return r.JSON200, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("task %s did not end (last answer %d %s): %w", id, r.StatusCode(), r.Body, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
