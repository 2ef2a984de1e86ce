package logging_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/orderworker/orderworker/internal/logging"
)

func TestSlogWritesIntoTheZapCore(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.InfoLevel)
	log := logging.Slog(zap.New(core).Named("engine").With(zap.String("role", "worker")))
	log.Debug("hidden")
	log.With("key", "K").Warn("the key's sequence does not exist", slog.Int64("seq", 7),
		slog.Duration("wait", time.Second), slog.Bool("ok", true), slog.Any("error", errors.New("boom")))
	log.Error("failed", slog.Group("lock", slog.Int64("fence", 3)))

	entries := logs.All()
	require.Len(t, entries, 2, "debug is below info")
	w := entries[0]
	assert.Equal(t, zapcore.WarnLevel, w.Level)
	assert.Equal(t, "engine", w.LoggerName)
	assert.Equal(t, "the key's sequence does not exist", w.Message)
	assert.Equal(t, map[string]any{"role": "worker", "key": "K", "seq": int64(7), "wait": time.Second, "ok": true, "error": "boom"},
		w.ContextMap())
	assert.True(t, w.Caller.Defined)
	assert.Contains(t, w.Caller.File, "slog_test.go")
	e := entries[1]
	assert.Equal(t, zapcore.ErrorLevel, e.Level)
	assert.Equal(t, map[string]any{"fence": int64(3)}, e.ContextMap()["lock"])
}

func TestSlogNestsGroupsAsNamespaces(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.DebugLevel)
	log := logging.Slog(zap.New(core))
	log.WithGroup("run").With("key", "K").WithGroup("empty").Info("line", "seq", 1)
	log.WithGroup("unused").Info("bare")
	entries := logs.All()
	require.Len(t, entries, 2)
	assert.Equal(t, map[string]any{"run": map[string]any{"key": "K", "empty": map[string]any{"seq": int64(1)}}}, entries[0].ContextMap())
	assert.Empty(t, entries[1].ContextMap(), "a group without fields is left out")
}

func TestSlogOfNilIsNil(t *testing.T) {
	t.Parallel()
	assert.Nil(t, logging.Slog(nil))
}
