package logging

import (
	"context"
	"log/slog"
	"runtime"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Slog returns a *slog.Logger that writes into log's core, with log's name
// and fields: for the engine (package keyorder), which takes a
// *slog.Logger, in a program that logs with zap. Levels map to zap's
// (below Info is Debug, Warn and Error are theirs, above Error is Error);
// a record carries its caller; groups nest as zap namespaces. A nil log
// gives nil (the engine's default). The logger is safe for concurrent use.
//
// It is the small bridge go.uber.org/zap/exp/zapslog would be, without
// that module.
func Slog(log *zap.Logger) *slog.Logger {
	if log == nil {
		return nil
	}
	return slog.New(&zapHandler{core: log.Core(), name: log.Name()})
}

// zapHandler is a slog.Handler writing into a zapcore.Core.
type zapHandler struct {
	core zapcore.Core
	name string
	// open says a group was opened (WithGroup) with no field in it yet:
	// zap's namespace is only added with the group's first field.
	open []string
}

var _ slog.Handler = (*zapHandler)(nil)

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l < slog.LevelInfo:
		return zapcore.DebugLevel
	case l < slog.LevelWarn:
		return zapcore.InfoLevel
	case l < slog.LevelError:
		return zapcore.WarnLevel
	}
	return zapcore.ErrorLevel
}

func (h *zapHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.core.Enabled(zapLevel(l))
}

func (h *zapHandler) Handle(_ context.Context, r slog.Record) error {
	ent := zapcore.Entry{Level: zapLevel(r.Level), Time: r.Time, Message: r.Message, LoggerName: h.name}
	if r.PC != 0 {
		f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		ent.Caller = zapcore.NewEntryCaller(f.PC, f.File, f.Line, true)
		ent.Caller.Function = f.Function
	}
	ce := h.core.Check(ent, nil)
	if ce == nil {
		return nil
	}
	fields := make([]zap.Field, 0, r.NumAttrs()+len(h.open))
	r.Attrs(func(a slog.Attr) bool {
		fields = appendAttr(fields, a)
		return true
	})
	ce.Write(h.withOpen(fields)...)
	return nil
}

// withOpen puts the open groups' namespaces before fields, when there are
// fields.
func (h *zapHandler) withOpen(fields []zap.Field) []zap.Field {
	if len(fields) == 0 || len(h.open) == 0 {
		return fields
	}
	ns := make([]zap.Field, 0, len(h.open)+len(fields))
	for _, g := range h.open {
		ns = append(ns, zap.Namespace(g))
	}
	return append(ns, fields...)
}

func (h *zapHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	var fields []zap.Field
	for _, a := range attrs {
		fields = appendAttr(fields, a)
	}
	if len(fields) == 0 {
		return h
	}
	return &zapHandler{core: h.core.With(h.withOpen(fields)), name: h.name}
}

func (h *zapHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &zapHandler{core: h.core, name: h.name, open: append(h.open[:len(h.open):len(h.open)], name)}
}

// appendAttr appends a's field, none for an empty attribute; a group
// becomes a nested object (its fields inline when it has no key).
func appendAttr(fields []zap.Field, a slog.Attr) []zap.Field {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return fields
	}
	switch v.Kind() {
	case slog.KindGroup:
		var inner []zap.Field
		for _, g := range v.Group() {
			inner = appendAttr(inner, g)
		}
		if len(inner) == 0 {
			return fields
		}
		if a.Key == "" {
			return append(fields, inner...)
		}
		return append(fields, zap.Dict(a.Key, inner...))
	case slog.KindString:
		return append(fields, zap.String(a.Key, v.String()))
	case slog.KindInt64:
		return append(fields, zap.Int64(a.Key, v.Int64()))
	case slog.KindUint64:
		return append(fields, zap.Uint64(a.Key, v.Uint64()))
	case slog.KindFloat64:
		return append(fields, zap.Float64(a.Key, v.Float64()))
	case slog.KindBool:
		return append(fields, zap.Bool(a.Key, v.Bool()))
	case slog.KindDuration:
		return append(fields, zap.Duration(a.Key, v.Duration()))
	case slog.KindTime:
		return append(fields, zap.Time(a.Key, v.Time()))
	}
	if err, ok := v.Any().(error); ok {
		return append(fields, zap.NamedError(a.Key, err))
	}
	return append(fields, zap.Any(a.Key, v.Any()))
}
