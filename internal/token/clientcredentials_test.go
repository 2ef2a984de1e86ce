package token

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/oauth2"
)

const testSecret = "s3cret-client-secret"

// endpoint serves h on loopback and returns a Source of its URL that sends
// the secret in the form, where an echo would show it.
func endpoint(t *testing.T, h http.HandlerFunc) Source {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	src, err := ClientCredentials(ClientCredentialsConfig{TokenURL: srv.URL + "/token", ClientID: "id", ClientSecret: testSecret,
		AuthStyle: oauth2.AuthStyleInParams})
	require.NoError(t, err)
	return src
}

// A redirect is not followed: the secret never reaches where it points,
// and the error says so.
func TestClientCredentialsRefusesRedirects(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"access_token":"stolen","token_type":"bearer","expires_in":3600}`)
	}))
	t.Cleanup(other.Close)
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		src := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/token", status)
		})
		_, err := src.Fetch(t.Context())
		var ee *EndpointError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, status, ee.StatusCode)
		assert.ErrorContains(t, err, "redirects are not followed")
	}
	assert.Zero(t, elsewhere.Load(), "the secret went nowhere else")
}

// The endpoint's error text is cut, its control characters escaped, and
// the secret it echoes redacted; nothing of the request is in the error.
func TestClientCredentialsSanitizesEndpointText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, contentType, body string
		status                  int
		code                    string
	}{
		{"oauth2 error", "application/json", `{"error":"invalid_client","error_description":"no client with secret ` + testSecret +
			`\u001b[31m\u202e` + strings.Repeat("x", 5000) + `"}`, http.StatusUnauthorized, "invalid_client"},
		{"not oauth2", "text/html", "<html>upstream broke\r\nFAKE LOG LINE level=error " + testSecret + " " + strings.Repeat("y", 5000),
			http.StatusBadGateway, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			_, err := src.Fetch(t.Context())
			var ee *EndpointError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tt.status, ee.StatusCode)
			assert.Equal(t, tt.code, ee.Code)
			assert.LessOrEqual(t, len(ee.Text), MaxEndpointText)
			assert.True(t, strings.HasSuffix(ee.Text, "..."), ee.Text)
			msg := err.Error()
			assert.Less(t, len(msg), MaxEndpointText+100)
			assert.Contains(t, msg, "[redacted]")
			for _, bad := range []string{testSecret, "\x1b", "\u202e", "\r", "\n", "grant_type", "client_secret"} {
				assert.NotContains(t, msg, bad)
			}
			assert.False(t, errors.As(err, new(*oauth2.RetrieveError)), "the whole body and the request are not kept")
		})
	}
}

// A secret with characters that are encoded on the way (the review's
// TOP/SECRET+key=1 x) is redacted in each form the request carries it in,
// when an IdP echoes the form attempt's body or the Basic attempt's
// header, in an OAuth2 error or a page that is not one.
func TestClientCredentialsRedactsTheEncodedSecret(t *testing.T) {
	t.Parallel()
	const secret = "TOP/SECRET+key=1 x"
	header := func(r *http.Request) string { return r.Header.Get("Authorization") }
	body := func(r *http.Request) string { b, _ := io.ReadAll(r.Body); return string(b) }
	param := func(r *http.Request) string { return r.PostFormValue("client_secret") }
	credential := func(r *http.Request) string {
		b, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(header(r), "Basic "))
		return string(b)
	}
	tests := []struct {
		name  string
		style oauth2.AuthStyle
		html  bool // a text/html 500, else an OAuth2 error in JSON
		echo  func(*http.Request) string
	}{
		{"form body", oauth2.AuthStyleInParams, false, body},
		{"form body in html", oauth2.AuthStyleInParams, true, body},
		{"form value", oauth2.AuthStyleInParams, false, param},
		{"form value path-escaped", oauth2.AuthStyleInParams, true, func(r *http.Request) string { return url.PathEscape(param(r)) }},
		{"basic header", oauth2.AuthStyleInHeader, false, header},
		{"basic header in html", oauth2.AuthStyleInHeader, true, header},
		{"basic header form-encoded", oauth2.AuthStyleInHeader, false, func(r *http.Request) string { return url.QueryEscape(header(r)) }},
		{"basic header path-escaped", oauth2.AuthStyleInHeader, true, func(r *http.Request) string { return url.PathEscape(header(r)) }},
		{"basic credential decoded", oauth2.AuthStyleInHeader, false, credential},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				echo := tt.echo(r)
				if tt.html {
					w.Header().Set("Content-Type", "text/html")
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = io.WriteString(w, "<html>echo "+echo)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_request", "error_description": "echo: " + echo})
			}))
			t.Cleanup(srv.Close)
			src, err := ClientCredentials(ClientCredentialsConfig{TokenURL: srv.URL + "/token", ClientID: "orderworker", ClientSecret: secret, AuthStyle: tt.style})
			require.NoError(t, err)

			_, err = src.Fetch(t.Context())
			var ee *EndpointError
			require.ErrorAs(t, err, &ee)
			msg := err.Error()
			assert.Contains(t, msg, "[redacted]")
			// TOP and SECRET in any escaping; VE9Q is "TOP" in the
			// credential's base64 (after "orderworker:", 12 bytes).
			for _, bad := range []string{"TOP", "SECRET", "VE9Q", "b3JkZXJ3b3JrZXI6"} {
				assert.NotContains(t, msg, bad)
			}
		})
	}
}

// http:// is refused unless to loopback or allowed; https always passes.
func TestClientCredentialsRefusesPlainHTTP(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://auth.example/token", "http://10.0.0.1/token", "http://localhost.evil.example/token", "http://[2001:db8::1]/token"} {
		_, err := ClientCredentials(ClientCredentialsConfig{TokenURL: u, ClientID: "id"})
		require.ErrorIs(t, err, ErrInsecureURL, u)
		_, err = ClientCredentials(ClientCredentialsConfig{TokenURL: u, ClientID: "id", AllowInsecureHTTP: true})
		require.NoError(t, err, u)
	}
	for _, u := range []string{"https://auth.example/token", "http://127.0.0.1:8080/token", "http://localhost/token", "http://[::1]:1/token", "http://127.1.2.3/token"} {
		_, err := ClientCredentials(ClientCredentialsConfig{TokenURL: u, ClientID: "id"})
		require.NoError(t, err, u)
	}
	_, err := ClientCredentials(ClientCredentialsConfig{TokenURL: "ftp://auth.example/token", ClientID: "id"})
	require.Error(t, err)
}
