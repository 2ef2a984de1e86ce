package orderstore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/orderworker/orderworker/internal/orders/httpstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// parse returns the settings that env gives, as a binary parses them.
func parse(t *testing.T, env map[string]string) *Settings {
	t.Helper()
	s := config.NewSet("test", func(k string) string { return env[k] })
	var c Settings
	Declare(s, &c)
	require.NoError(t, s.Parse(nil))
	return &c
}

// settings returns the HTTP store's settings for the order API at url,
// with ORDER_API_ALLOW_INSECURE_HTTP set to allow.
func settings(t *testing.T, url, allow string) *Settings {
	t.Helper()
	return parse(t, map[string]string{"ORDER_STORE": HTTP, "ORDER_API_URL": url, "ORDER_API_ALLOW_INSECURE_HTTP": allow,
		"TOKEN_URL": "https://auth.example.com/token", "TOKEN_CLIENT_ID": "id", "TOKEN_CLIENT_SECRET": "hunter2"})
}

// ORDER_API_URL may not be http:// to a host that is not loopback: the
// workers' token goes with every request.
func TestOpenRefusesPlainHTTPToTheOrderAPI(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"http://orders.example.com/v1", "http://10.1.2.3:8080/v1", "http://[2001:db8::1]/v1", "http://localhost.example.com/v1"} {
		_, err := Open(nil, "ow:", settings(t, url, ""), Hooks{}, zap.NewNop())
		require.ErrorIs(t, err, httpstore.ErrInsecureURL, url)
	}
}

// http:// to a loopback host (a sidecar, a test) is taken, and to any
// host with ORDER_API_ALLOW_INSECURE_HTTP=true; https:// always.
func TestOpenTakesPlainHTTPToLoopbackOrWhenAllowed(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, url, allow string }{
		{"loopback", "http://127.0.0.1:8080/v1", ""},
		{"localhost", "http://localhost:8080/v1", ""},
		{"::1", "http://[::1]:8080/v1", ""},
		{"a host, allowed", "http://orders.example.com/v1", "true"},
		{"https", "https://orders.example.com/v1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Open(nil, "ow:", settings(t, tt.url, tt.allow), Hooks{}, zap.NewNop())
			require.NoError(t, err)
			require.NoError(t, s.Close())
		})
	}
}

// The refusal names the setting at fault and the one that allows it, and
// no secret.
func TestOpenRefusalNamesTheSettings(t *testing.T) {
	t.Parallel()
	_, err := Open(nil, "ow:", settings(t, "http://orders.example.com/v1", ""), Hooks{}, zap.NewNop())
	require.ErrorIs(t, err, httpstore.ErrInsecureURL)
	for _, want := range []string{"ORDER_API_URL (-order-api-url)", "not loopback", "ORDER_API_ALLOW_INSECURE_HTTP=true (-order-api-allow-insecure-http)"} {
		assert.ErrorContains(t, err, want)
	}
	assert.NotContains(t, err.Error(), "hunter2")
}
