package httpserve_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServeFinishesRequestsInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		_, _ = w.Write([]byte("done"))
	})
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- httpserve.Serve(ctx, ln, h, httpserve.Config{ShutdownTimeout: 10 * time.Second}, zap.NewNop())
	}()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	<-entered
	cancel() // shutdown starts with the request in flight
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 5*time.Second, time.Millisecond, "still accepting after shutdown began")
	close(release)
	require.Equal(t, "done", <-got)
	require.NoError(t, <-served)
}

func TestAccessLog(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	h := httpserve.AccessLog(zap.New(core), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := httpserve.InfoFrom(r.Context())
		info.Principal, info.EventID = "key#2", "ev-1"
		w.WriteHeader(http.StatusAccepted)
	}))
	tests := []struct {
		name, id string
		keep     bool
	}{
		{"kept", "req-42", true},
		{"control characters replaced", "a\x01b", false},
		{"too long replaced", strings.Repeat("x", 129), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/v1/x?secret=1", nil)
			req.Header.Set(httpserve.HeaderRequestID, tt.id)
			req.Header.Set("Authorization", "Bearer do-not-log-me")
			h.ServeHTTP(rec, req)
			echoed := rec.Header().Get(httpserve.HeaderRequestID)
			require.Equal(t, tt.keep, echoed == tt.id)
			entry := logs.TakeAll()[0]
			fields := entry.ContextMap()
			require.Equal(t, echoed, fields["request_id"])
			require.Equal(t, "/v1/x", fields["path"])
			require.Equal(t, int64(http.StatusAccepted), fields["status"])
			require.Equal(t, "key#2", fields["principal"])
			require.Equal(t, "ev-1", fields["event_id"])
			for _, v := range fields {
				if s, ok := v.(string); ok {
					require.NotContains(t, s, "do-not-log-me")
					require.NotContains(t, s, "secret")
				}
			}
		})
	}
}
