package keyorder

import "log/slog"

// discard is the logger of a part given none: it writes nothing.
var discard = slog.New(slog.DiscardHandler)

// errAttr is the attribute of an error in the engine's log lines.
func errAttr(err error) slog.Attr { return slog.Any("error", err) }
