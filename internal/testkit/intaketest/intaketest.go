// Package intaketest sends changes to a running intake the way an upstream
// does under a fault test: each modify with its Idempotency-Key, every
// answer checked against what the intake promises while Redis fails over.
// It is test support: only _test.go files import it (depguard).
package intaketest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderworker/orderworker/producer"
)

// Sender posts modifies to the intake at Base with API key Key. Its
// methods are safe for concurrent use.
type Sender struct {
	// Base is the intake's base URL, such as "http://127.0.0.1:8080".
	Base string
	// Key is the API key sent as a bearer token.
	Key string
	// Unavailable counts the 503 answers.
	Unavailable atomic.Int64

	client http.Client
}

// NewSender returns a Sender to the intake at base with key, whose requests
// time out after 30 seconds. Its idle connections are closed when the test
// ends.
func NewSender(tb testing.TB, base, key string) *Sender {
	s := &Sender{Base: base, Key: key, client: http.Client{Timeout: 30 * time.Second}}
	tb.Cleanup(s.client.CloseIdleConnections)
	return s
}

// Modify posts a modify of order no setting its remark, with eventID as
// its Idempotency-Key. The answer must be a 202 with a position (returned),
// a 409 (an earlier attempt was accepted: position 0, nil error), or a 503
// with a Retry-After of whole seconds (counted in Unavailable, returned as
// an error, to be sent again); anything else fails tb and is returned as an
// error. A transport error fails tb unless ctx has ended.
func (s *Sender) Modify(ctx context.Context, tb testing.TB, no, eventID, remark string) (seq int64, err error) {
	body := fmt.Sprintf(`{"changes":{"remark":%q}}`, remark)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Base+"/v1/orders/"+no+"/modify", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", eventID)
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			tb.Errorf("intake: %s: %v", eventID, err)
		}
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	switch resp.StatusCode {
	case http.StatusAccepted:
		var res producer.Result
		if err := json.Unmarshal(b, &res); err != nil || res.Seq <= 0 {
			tb.Errorf("intake: 202 for %s without a position: %s", eventID, b)
		}
		return res.Seq, nil
	case http.StatusConflict:
		return 0, nil
	case http.StatusServiceUnavailable:
		s.Unavailable.Add(1)
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || n < 1 {
			tb.Errorf("intake: 503 for %s with Retry-After %q", eventID, resp.Header.Get("Retry-After"))
		}
		return 0, fmt.Errorf("intake: 503: %s", strings.TrimSpace(string(b)))
	}
	tb.Errorf("intake: %d for %s: %s", resp.StatusCode, eventID, b)
	return 0, fmt.Errorf("intake: %d", resp.StatusCode)
}
