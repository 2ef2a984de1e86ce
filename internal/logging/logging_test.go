package logging_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/logging"
)

func TestJSON(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New("INFO", logging.FormatJSON, &buf)
	require.NoError(t, err)
	log.Debug("hidden")
	log.Named("dashboard").Info("listening", zap.String("addr", ":8090"))
	require.NoError(t, log.Sync())

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, "debug is below info")
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &entry))
	assert.Equal(t, "info", entry["level"])
	assert.Equal(t, "dashboard", entry["logger"])
	assert.Equal(t, "listening", entry["msg"])
	assert.Equal(t, ":8090", entry["addr"])
	assert.Contains(t, entry, "ts")
	assert.Contains(t, entry["caller"], "logging_test.go")
}

func TestConsole(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New("debug", logging.FormatConsole, &buf)
	require.NoError(t, err)
	log.Debug("shown", zap.Int("n", 1))
	assert.Contains(t, buf.String(), "DEBUG")
	assert.Contains(t, buf.String(), "shown")
	assert.Contains(t, buf.String(), `{"n": 1}`)
}

func TestBadSettings(t *testing.T) {
	t.Parallel()
	_, err := logging.New("verbose", logging.FormatJSON, nil)
	require.ErrorIs(t, err, logging.ErrLevel)
	assert.EqualError(t, err, `logging: unknown level "verbose" (want one of debug, info, warn, error)`)

	_, err = logging.New("info", "xml", nil)
	require.ErrorIs(t, err, logging.ErrFormat)
	assert.EqualError(t, err, `logging: unknown format "xml" (want json or console)`)

	assert.NoError(t, logging.CheckLevel(" Warn "))
	assert.ErrorIs(t, logging.CheckLevel("fatal"), logging.ErrLevel)
	assert.NoError(t, logging.CheckFormat("console"))
	assert.ErrorIs(t, logging.CheckFormat("JSON"), logging.ErrFormat)
}

// go-redis's lines reach zap as one structured entry each, once set, and
// are dropped before.
func TestRedisSink(t *testing.T) {
	var s logging.RedisSink
	s.Printf(t.Context(), "dropped %d", 1)
	core, logs := observer.New(zapcore.DebugLevel)
	s.Set(zap.New(core))
	s.Printf(t.Context(), "redis: %s failed to dial: %v", "127.0.0.1:1", "connection refused")
	require.Equal(t, 1, logs.Len())
	e := logs.All()[0]
	require.Equal(t, "redis client", e.Message)
	require.Equal(t, "redis", e.LoggerName)
	require.Equal(t, zapcore.WarnLevel, e.Level)
	require.Equal(t, "redis: 127.0.0.1:1 failed to dial: connection refused", e.ContextMap()["detail"])
	s.Set(nil)
	s.Printf(t.Context(), "dropped again")
	require.Equal(t, 1, logs.Len())
}
