package httpserve_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// What a caller sends is cut in the access log: a 60 KiB path or a 4 KiB
// method (a valid token) make a line of about a kilobyte, not 60; the
// user agent and the query are not logged at all.
func TestAccessLogCapsWhatTheCallerSent(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	srv := httptest.NewServer(httpserve.AccessLog(zap.New(core), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpserve.InfoFrom(r.Context()).Quiet = r.URL.Query().Has("quiet")
		w.WriteHeader(http.StatusUnauthorized)
	})))
	t.Cleanup(srv.Close)
	long := "/v1/" + strings.Repeat("é", 30<<10) // 2 bytes each: cuts fall inside a rune
	method := strings.Repeat("M", 4<<10)
	for _, q := range []string{"", "?quiet"} {
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+long+q, nil)
		require.NoError(t, err)
		req.Header.Set("User-Agent", strings.Repeat("u", 8<<10))
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	}
	entries := logs.TakeAll()
	require.Len(t, entries, 2)
	require.Equal(t, zap.InfoLevel, entries[0].Level)
	require.Equal(t, zap.DebugLevel, entries[1].Level, "a Quiet request is logged at debug")
	fields := entries[0].ContextMap()
	path, _ := fields["path"].(string)
	require.True(t, strings.HasPrefix(path, "/v1/éé"), path)
	require.True(t, strings.HasSuffix(path, fmt.Sprintf("...(%d bytes)", len(long))), path)
	require.True(t, utf8.ValidString(path))
	require.Equal(t, strings.Repeat("M", httpserve.MaxLoggedLen)+"...(4096 bytes)", fields["method"])
	size := 0
	for k, v := range fields {
		s := fmt.Sprint(v)
		size += len(k) + len(s)
		require.NotContains(t, s, "uuu", "no user agent")
	}
	require.Less(t, size, 1024, "the line stays small")
}

func TestEveryInterface(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:0": false, "[::1]:0": false, ":0": true, "0.0.0.0:0": true} {
		ln, err := net.Listen("tcp", addr)
		if err != nil && strings.Contains(addr, "::") {
			continue // no IPv6 here
		}
		require.NoError(t, err)
		require.Equal(t, want, httpserve.EveryInterface(ln.Addr()), addr)
		require.NoError(t, ln.Close())
	}
}

func TestServeWarnsOnEveryInterface(t *testing.T) {
	tests := []struct {
		name, addr string
		warns      bool
	}{
		{"no host", ":0", true},
		{"unspecified IPv4", "0.0.0.0:0", true},
		{"loopback", "127.0.0.1:0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", tt.addr)
			require.NoError(t, err)
			core, logs := observer.New(zap.WarnLevel)
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // Serve warns before it serves, then shuts down at once
			require.NoError(t, httpserve.Serve(ctx, ln, http.NotFoundHandler(), httpserve.Config{}, zap.New(core)))
			warned := logs.FilterMessageSnippet("listening on every interface").All()
			require.Equal(t, tt.warns, len(warned) == 1, "warnings: %v", logs.All())
			if tt.warns {
				require.Equal(t, ln.Addr().String(), warned[0].ContextMap()["addr"])
			}
		})
	}
}
