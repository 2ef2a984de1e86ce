package httpauth_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/httpauth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	oldKey = "old-key-0123456789abcdef"
	newKey = "new-key-fedcba9876543210"
)

// server serves handler behind mw; the handler echoes the principal and
// whether it still saw an Authorization header.
func server(t *testing.T, mw func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := httpauth.Principal(r.Context())
		_, _ = io.WriteString(w, p+"|"+r.Header.Get("Authorization"))
	})))
	t.Cleanup(srv.Close)
	return srv
}

type result struct {
	status    int
	body      string
	challenge []string
	ctype     string
}

func do(t *testing.T, srv *httptest.Server, header string) result {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/x", nil)
	require.NoError(t, err)
	if header != "" {
		req.Header.Set("Authorization", header)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return result{resp.StatusCode, string(body), resp.Header.Values("WWW-Authenticate"), resp.Header.Get("Content-Type")}
}

func basicHeader(user, pass string) string {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pass)
	return req.Header.Get("Authorization")
}

func TestBasic(t *testing.T) {
	t.Parallel()
	s, err := httpauth.Basic("orderworker", "admin", "correct horse")
	require.NoError(t, err)
	srv := server(t, httpauth.Require(s))

	tests := []struct {
		name   string
		header string
		status int
		body   string
	}{
		{name: "good", header: basicHeader("admin", "correct horse"), status: 200, body: "admin|"},
		{name: "none", status: 401, body: "unauthorized\n"},
		{name: "wrong password", header: basicHeader("admin", "correct horsE"), status: 401, body: "unauthorized\n"},
		{name: "password prefix", header: basicHeader("admin", "correct"), status: 401, body: "unauthorized\n"},
		{name: "wrong user", header: basicHeader("root", "correct horse"), status: 401, body: "unauthorized\n"},
		{name: "bearer instead", header: "Bearer correct horse", status: 401, body: "unauthorized\n"},
		{name: "garbage", header: "Basic !!!", status: 401, body: "unauthorized\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := do(t, srv, tt.header)
			assert.Equal(t, tt.status, got.status)
			assert.Equal(t, tt.body, got.body)
		})
	}
}

func TestRefusal(t *testing.T) {
	t.Parallel()
	s, err := httpauth.Basic("orderworker", "admin", "pw")
	require.NoError(t, err)
	t.Run("text", func(t *testing.T) {
		t.Parallel()
		srv := server(t, httpauth.Require(s))
		got := do(t, srv, "")
		assert.Equal(t, http.StatusUnauthorized, got.status)
		assert.Equal(t, []string{`Basic realm="orderworker", charset="UTF-8"`}, got.challenge)
		assert.Equal(t, "text/plain; charset=utf-8", got.ctype)
	})
	t.Run("json", func(t *testing.T) {
		t.Parallel()
		srv := server(t, httpauth.Require(s, httpauth.JSONErrors()))
		got := do(t, srv, "")
		assert.Equal(t, http.StatusUnauthorized, got.status)
		assert.Equal(t, "application/json", got.ctype)
		var body map[string]string
		require.NoError(t, json.Unmarshal([]byte(got.body), &body))
		assert.Equal(t, map[string]string{"error": "unauthorized"}, body)
	})
}

func TestBearerRotation(t *testing.T) {
	t.Parallel()
	s, err := httpauth.Bearer("intake", []string{oldKey, newKey})
	require.NoError(t, err)
	srv := server(t, httpauth.Require(s, httpauth.JSONErrors()))

	tests := []struct {
		name   string
		header string
		status int
		body   string
	}{
		{name: "old key", header: "Bearer " + oldKey, status: 200, body: "key#1|"},
		{name: "new key", header: "Bearer " + newKey, status: 200, body: "key#2|"},
		{name: "scheme in any case", header: "bEaReR  " + newKey + " ", status: 200, body: "key#2|"},
		{name: "unknown key", header: "Bearer " + strings.Repeat("x", 24), status: 401, body: `{"error":"unauthorized"}` + "\n"},
		{name: "key prefix", header: "Bearer " + oldKey[:20], status: 401, body: `{"error":"unauthorized"}` + "\n"},
		{name: "key with suffix", header: "Bearer " + oldKey + "x", status: 401, body: `{"error":"unauthorized"}` + "\n"},
		{name: "empty token", header: "Bearer ", status: 401, body: `{"error":"unauthorized"}` + "\n"},
		{name: "no scheme", header: oldKey, status: 401, body: `{"error":"unauthorized"}` + "\n"},
		{name: "basic with key", header: basicHeader("x", oldKey), status: 401, body: `{"error":"unauthorized"}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := do(t, srv, tt.header)
			assert.Equal(t, tt.status, got.status)
			assert.Equal(t, tt.body, got.body)
		})
	}
	got := do(t, srv, "")
	assert.Equal(t, []string{`Bearer realm="intake"`}, got.challenge)
}

func TestAny(t *testing.T) {
	t.Parallel()
	b, err := httpauth.Basic("dashboard", "admin", "pw")
	require.NoError(t, err)
	k, err := httpauth.Bearer("dashboard", []string{newKey})
	require.NoError(t, err)
	srv := server(t, httpauth.Require(httpauth.Any(b, k)))

	assert.Equal(t, "admin|", do(t, srv, basicHeader("admin", "pw")).body)
	assert.Equal(t, "key#1|", do(t, srv, "Bearer "+newKey).body)
	got := do(t, srv, "Bearer nope-nope-nope-nope")
	assert.Equal(t, http.StatusUnauthorized, got.status)
	assert.Equal(t, []string{`Basic realm="dashboard", charset="UTF-8"`, `Bearer realm="dashboard"`}, got.challenge)

	none := server(t, httpauth.Require(httpauth.Any()))
	assert.Equal(t, http.StatusUnauthorized, do(t, none, basicHeader("admin", "pw")).status)
}

// TestSeveralAuthorizationHeaders checks that a request with more than one
// Authorization header is refused by every scheme, whichever of them is
// valid: proxies and servers disagree on which one counts.
func TestSeveralAuthorizationHeaders(t *testing.T) {
	t.Parallel()
	b, err := httpauth.Basic("dashboard", "admin", "pw")
	require.NoError(t, err)
	k, err := httpauth.Bearer("dashboard", []string{oldKey, newKey})
	require.NoError(t, err)
	good, wrong := basicHeader("admin", "pw"), "Bearer "+strings.Repeat("x", 24)
	tests := []struct {
		name    string
		headers []string
	}{
		{"valid first", []string{"Bearer " + newKey, wrong}},
		{"valid second", []string{wrong, "Bearer " + newKey}},
		{"the same key twice", []string{"Bearer " + newKey, "Bearer " + newKey}},
		{"two valid keys", []string{"Bearer " + oldKey, "Bearer " + newKey}},
		{"basic and bearer", []string{good, "Bearer " + newKey}},
		{"basic twice", []string{good, good}},
		{"valid and empty", []string{"Bearer " + newKey, ""}},
	}
	for _, scheme := range []struct {
		name string
		s    httpauth.Scheme
	}{{"basic", b}, {"bearer", k}, {"any", httpauth.Any(b, k)}} {
		srv := server(t, httpauth.Require(scheme.s))
		for _, tt := range tests {
			t.Run(scheme.name+"/"+tt.name, func(t *testing.T) {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/x", nil)
				require.NoError(t, err)
				for _, h := range tt.headers {
					req.Header.Add("Authorization", h)
				}
				resp, err := srv.Client().Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			})
		}
	}
	// One header is still fine.
	srv := server(t, httpauth.Require(httpauth.Any(b, k)))
	assert.Equal(t, "key#2|", do(t, srv, "Bearer "+newKey).body)
	assert.Equal(t, "admin|", do(t, srv, good).body)
}

func TestPrincipalWithoutMiddleware(t *testing.T) {
	t.Parallel()
	_, ok := httpauth.Principal(t.Context())
	assert.False(t, ok)
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	const secret = "a-secret-that-must-not-show"
	tests := []struct {
		name string
		make func() (httpauth.Scheme, error)
		want string
	}{
		{name: "empty user", make: func() (httpauth.Scheme, error) { return httpauth.Basic("r", "", "pw") }, want: "empty basic-auth user"},
		{name: "colon user", make: func() (httpauth.Scheme, error) { return httpauth.Basic("r", "a:b", "pw") }, want: "colon"},
		{name: "empty password", make: func() (httpauth.Scheme, error) { return httpauth.Basic("r", "a", "") }, want: "empty basic-auth password"},
		{name: "empty realm", make: func() (httpauth.Scheme, error) { return httpauth.Basic("", "a", "b") }, want: "empty realm"},
		{name: "quote in realm", make: func() (httpauth.Scheme, error) { return httpauth.Bearer(`a"b`, []string{newKey}) }, want: "realm"},
		{name: "no keys", make: func() (httpauth.Scheme, error) { return httpauth.Bearer("r", nil) }, want: "no bearer keys"},
		{name: "short key", make: func() (httpauth.Scheme, error) { return httpauth.Bearer("r", []string{newKey, "short"}) }, want: "bearer key #2 is shorter than 16 bytes"},
		{name: "space in key", make: func() (httpauth.Scheme, error) { return httpauth.Bearer("r", []string{secret + " x"}) }, want: "bearer key #1 has a space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := tt.make()
			require.ErrorIs(t, err, httpauth.ErrConfig)
			assert.ErrorContains(t, err, tt.want)
			assert.NotContains(t, err.Error(), secret)
		})
	}
}

// FuzzBearer checks that no Authorization header but the exact key is let in.
func FuzzBearer(f *testing.F) {
	for _, seed := range []string{"", "Bearer " + newKey, "bearer " + newKey, "Bearer  " + newKey + "\t", "Basic Zm9vOmJhcg==", "Bearer", newKey} {
		f.Add(seed)
	}
	s, err := httpauth.Bearer("r", []string{newKey})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, header string) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header["Authorization"] = []string{header}
		_, ok := s.Authenticate(req)
		if ok && !strings.EqualFold(header[:7], "bearer ") {
			t.Fatalf("accepted %q", header)
		}
		if ok && strings.TrimSpace(header[7:]) != newKey {
			t.Fatalf("accepted %q", header)
		}
	})
}

// TestNamedBearer names its principals as asked, and Any of two bearer
// schemes accepts either key, each under its own name, with one challenge.
func TestNamedBearer(t *testing.T) {
	ui, err := httpauth.NamedBearer("r", "dashboard-token", []string{oldKey})
	require.NoError(t, err)
	metrics, err := httpauth.NamedBearer("r", "metrics", []string{"x-key-0123456789abcdef", newKey})
	require.NoError(t, err)
	srv := server(t, httpauth.Require(httpauth.Any(ui, metrics)))
	assert.Equal(t, "dashboard-token#1|", do(t, srv, "Bearer "+oldKey).body)
	assert.Equal(t, "metrics#2|", do(t, srv, "Bearer "+newKey).body)
	r := do(t, srv, "Bearer wrong-key-0123456789")
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Equal(t, []string{`Bearer realm="r"`}, httpauth.Any(ui, metrics).Challenges())
	for _, name := range []string{"", "Key", "a b", "key#", strings.Repeat("k", 33)} {
		_, err := httpauth.NamedBearer("r", name, []string{oldKey})
		assert.ErrorIs(t, err, httpauth.ErrConfig, "%q", name)
	}
}
