// Package logging builds the process's root *zap.Logger from the two
// settings every orderworker binary has: a level and a format.
//
// It keeps no global logger: the binary builds one in run, passes it down,
// and names child loggers after the package that uses them. It is for cmd/*
// packages; libraries take a *zap.Logger and never build one, except that
// the engine (package keyorder) takes a *slog.Logger, which [Slog] makes of
// a *zap.Logger.
package logging

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The log formats [New] accepts.
const (
	// FormatJSON is one JSON object a line, with the production field names
	// (ts as ISO 8601, level, logger, caller, msg). It is for log collectors.
	FormatJSON = "json"
	// FormatConsole is tab-separated text for people at a terminal.
	FormatConsole = "console"
)

// Levels lists the level names [New] accepts, least severe first.
const Levels = "debug, info, warn, error"

// ErrFormat is returned (wrapped) by [New] and [CheckFormat] for a format
// other than [FormatJSON] or [FormatConsole].
var ErrFormat = errors.New("logging: unknown format")

// ErrLevel is returned (wrapped) by [New] and [CheckLevel] for a level name
// that is not one of [Levels].
var ErrLevel = errors.New("logging: unknown level")

// New returns a logger that writes entries at level or above to w (os.Stderr
// when w is nil) in format, [FormatJSON] or [FormatConsole]; level is one of
// [Levels], in any case. Entries carry the caller; entries at DPanic or above
// also carry a stack trace. Writes to w are serialized, so w need not be safe
// for concurrent use. The logger is safe for concurrent use; call Sync
// before the process exits. New returns [ErrLevel] or [ErrFormat], wrapped
// with the bad value, for a bad setting.
func New(level, format string, w io.Writer) (*zap.Logger, error) {
	lvl, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	var enc zapcore.Encoder
	switch format {
	case FormatJSON:
		cfg := zap.NewProductionEncoderConfig()
		cfg.EncodeTime = zapcore.ISO8601TimeEncoder
		cfg.EncodeDuration = zapcore.StringDurationEncoder
		enc = zapcore.NewJSONEncoder(cfg)
	case FormatConsole:
		cfg := zap.NewDevelopmentEncoderConfig()
		cfg.EncodeDuration = zapcore.StringDurationEncoder
		enc = zapcore.NewConsoleEncoder(cfg)
	default:
		return nil, CheckFormat(format)
	}
	if w == nil {
		w = os.Stderr
	}
	ws := zapcore.Lock(zapcore.AddSync(w))
	core := zapcore.NewCore(enc, ws, lvl)
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.DPanicLevel), zap.ErrorOutput(ws)), nil
}

func parseLevel(level string) (zapcore.Level, error) {
	var lvl zapcore.Level
	switch l := strings.ToLower(strings.TrimSpace(level)); l {
	case "debug", "info", "warn", "error":
		if err := lvl.UnmarshalText([]byte(l)); err != nil {
			return lvl, fmt.Errorf("%w %q: %w", ErrLevel, level, err)
		}
		return lvl, nil
	}
	return lvl, fmt.Errorf("%w %q (want one of %s)", ErrLevel, level, Levels)
}

// CheckLevel returns an error unless level is one [New] accepts; it fits
// config's Var.Check so that a bad LOG_LEVEL is reported with the others.
func CheckLevel(level string) error {
	_, err := parseLevel(level)
	return err
}

// CheckFormat returns an error unless format is one [New] accepts; it fits
// config's Var.Check.
func CheckFormat(format string) error {
	if format != FormatJSON && format != FormatConsole {
		return fmt.Errorf("%w %q (want %s or %s)", ErrFormat, format, FormatJSON, FormatConsole)
	}
	return nil
}
