package intake

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// rawExchange sends head (a request's header block, without the blank line)
// and then body over a new connection, and reads the answer; it does not
// close the connection's writing side, so a body shorter than announced
// stalls. It never waits more than 10 s. It also reports whether the
// answer closes the connection.
func (e *env) rawExchange(t *testing.T, head, body string) (response, bool, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, head+"\r\n\r\n"+body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, resp.Close, conn
}

// TestStalledBody sends a POST's headers and the first byte of its body,
// then nothing, over a real socket: once the read timeout has passed, the
// answer is 408 in the API's error shape, saying nothing of the sockets.
func TestStalledBody(t *testing.T) {
	t.Parallel()
	e := newEnvServer(t, nil, func(s *http.Server) { s.ReadTimeout = 300 * time.Millisecond })
	tests := []struct {
		name, path, framing, body string
	}{
		{"modify, chunked", "/v1/orders/SO1/modify", "Transfer-Encoding: chunked", "1\r\n{\r\n"},
	}
	// Every kind's enqueue route, so that a kind added to the table has its
	// route's 408 covered.
	for _, k := range tasks.Kinds() {
		tests = append(tests, struct{ name, path, framing, body string }{
			k.Name + ", Content-Length", kindPath(k, "SO1"), "Content-Length: 100", "{"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head := strings.Join([]string{
				"POST " + tt.path + " HTTP/1.1",
				"Host: intake",
				"Authorization: Bearer " + key1,
				"Content-Type: application/json",
				"Idempotency-Key: evt-stalled",
				tt.framing,
			}, "\r\n")
			r, closes, conn := e.rawExchange(t, head, tt.body)
			require.Equal(t, http.StatusRequestTimeout, r.status, "%s", r.body)
			body := r.errorBody(t)
			assert.Equal(t, codeRequestTimeout, body.Error.Code)
			assert.True(t, closes, "Connection: close")
			for _, leak := range []string{conn.LocalAddr().String(), conn.RemoteAddr().String(), "127.0.0.1", "tcp", "i/o timeout"} {
				assert.NotContains(t, string(r.body), leak)
			}
		})
	}
	assert.Equal(t, 0, e.queued(t), "nothing is enqueued")
}

// TestBrokenBody checks that a body that cannot be read for another reason
// (a bad chunk, a connection that ends early) is a 400 that names no
// socket either.
func TestBrokenBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	head := strings.Join([]string{
		"POST /v1/orders/SO1/modify HTTP/1.1",
		"Host: intake",
		"Authorization: Bearer " + key1,
		"Idempotency-Key: evt-broken",
		"Transfer-Encoding: chunked",
	}, "\r\n")
	r, _, conn := e.rawExchange(t, head, "zz\r\n")
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, codeMalformedBody, r.errorBody(t).Error.Code)
	assert.NotContains(t, string(r.body), conn.LocalAddr().String())
	assert.Equal(t, 0, e.queued(t), "nothing is enqueued")
}
