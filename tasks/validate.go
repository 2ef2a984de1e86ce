package tasks

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hibiken/asynq"
)

// ErrInvalid is matched (with errors.Is) by every error this package returns
// for a payload that breaks the contract: bad JSON, a field of the wrong type,
// an unknown field or a broken rule. Such errors also match asynq.SkipRetry, so
// a handler that returns one has asynq archive the task rather than retry it.
var ErrInvalid = errors.New("tasks: invalid payload")

// FieldError reports the one field of a payload that is at fault. It matches
// [ErrInvalid] and asynq.SkipRetry with errors.Is.
type FieldError struct {
	// Field is the field's path in the JSON payload, for example
	// "changes.items[2].qty". A key that is not a plain identifier is quoted.
	Field string
	// Msg says what is wrong, for example "must be between 1 and 10000, got 0".
	Msg string
}

// Error returns "<Field>: <Msg>".
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap returns [ErrInvalid] and asynq.SkipRetry.
func (e *FieldError) Unwrap() []error { return []error{ErrInvalid, asynq.SkipRetry} }

// payloadError reports a payload that is wrong as a whole (not JSON, too
// large, trailing data) rather than in one field.
type payloadError struct{ msg string }

func (e *payloadError) Error() string   { return e.msg }
func (e *payloadError) Unwrap() []error { return []error{ErrInvalid, asynq.SkipRetry} }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ValidOrderNo reports whether s is a well-formed order number: 1 to
// [MaxOrderNoLen] characters, each an ASCII letter, digit, '_' or '-'. Such a
// number is safe in Redis keys and hash tags as it is.
func ValidOrderNo(s string) bool { return orderNoProblem(s) == "" }

// EventIDRule says in words what [ValidEventID] accepts, for the error
// messages and documents that state the rule, so that they all read the same.
const EventIDRule = "1 to 128 characters of A-Z, a-z, 0-9, '_', '-', '.' and ':', the first a letter or digit"

// ValidEventID reports whether s is a well-formed event ID (see
// [EventIDRule]): 1 to [MaxEventIDLen] characters, each an ASCII letter or
// digit, '_', '-', '.' or ':', the first a letter or digit. A UUID, a ULID or
// "crm:order-7:v3" all qualify.
//
// The event ID is also the asynq task ID, and tools paste task IDs into URL
// paths and Redis keys without escaping them (asynqmon's UI does). So the
// rule leaves out everything a URL reads as structure ('/', '?', '#', '%',
// '\'), and a leading '.' that could make a "." or ".." path segment; a
// leading '-' or '_' is left out too, so that an ID never reads as a
// command-line flag.
func ValidEventID(s string) bool { return eventIDProblem(s) == "" }

func orderNoProblem(s string) string {
	switch {
	case s == "":
		return "required"
	case len(s) > MaxOrderNoLen:
		return fmt.Sprintf("must be at most %d characters, got %d", MaxOrderNoLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return "must contain only A-Z, a-z, 0-9, '_' and '-', got " + quote(s)
		}
	}
	return ""
}

func eventIDProblem(s string) string {
	switch {
	case s == "":
		return "required"
	case len(s) > MaxEventIDLen:
		return fmt.Sprintf("must be at most %d characters, got %d", MaxEventIDLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '-' && c != '.' && c != ':') {
			return "must be " + EventIDRule + ", got " + quote(s)
		}
	}
	return ""
}

// quote returns s quoted for an error message, cut short when long.
func quote(s string) string {
	const limit = 40
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// validate checks the bounds of a trace context (nil is valid): a
// traceparent of 1 to MaxTraceparentLen bytes and a tracestate of at most
// MaxTracestateLen, both printable ASCII, as HTTP header values are. Their
// syntax is not checked: a worker starts a new trace for a value it cannot
// read, and never refuses a change for it.
func (t *TraceContext) validate() error {
	if t == nil {
		return nil
	}
	if t.Traceparent == "" {
		return fieldErr("trace.traceparent", "required")
	}
	if msg := headerValueProblem(t.Traceparent, MaxTraceparentLen); msg != "" {
		return fieldErr("trace.traceparent", "%s", msg)
	}
	if msg := headerValueProblem(t.Tracestate, MaxTracestateLen); msg != "" {
		return fieldErr("trace.tracestate", "%s", msg)
	}
	return nil
}

func headerValueProblem(s string, limit int) string {
	if len(s) > limit {
		return fmt.Sprintf("must be at most %d bytes, got %d", limit, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Sprintf("must be printable ASCII, got byte 0x%02x at %d", c, i)
		}
	}
	return ""
}

// MaxSeq is the largest seq a task may carry: 2^53-1, the largest integer
// that Redis's Lua (whose numbers are doubles) holds exactly. The producer
// hands out positions from Redis TIME in microseconds, far below it.
const MaxSeq = 1<<53 - 1

// seqRule is what an error says of a bad seq.
const seqRule = "must be an integer from 1 to 9007199254740991"

func validateSeq(seq int64) error {
	if seq < 0 || seq > MaxSeq {
		return fieldErr("seq", seqRule+", got %d", seq)
	}
	return nil
}

func validateItems(path string, items []Item) error {
	switch {
	case len(items) == 0:
		return fieldErr(path, "must have at least 1 entry")
	case len(items) > MaxItems:
		return fieldErr(path, "must have at most %d entries, got %d", MaxItems, len(items))
	}
	seen := make(map[string]int, len(items))
	for i, it := range items {
		at := path + "[" + strconv.Itoa(i) + "]"
		if err := validateSKU(at+".sku", it.SKU); err != nil {
			return err
		}
		if j, dup := seen[it.SKU]; dup {
			return fieldErr(at+".sku", "duplicate of %s[%d].sku %s", path, j, quote(it.SKU))
		}
		seen[it.SKU] = i
		if it.Qty < MinQty || it.Qty > MaxQty {
			return fieldErr(at+".qty", "must be between %d and %d, got %d", MinQty, MaxQty, it.Qty)
		}
	}
	return nil
}

func validateSKU(path, s string) error {
	switch {
	case s == "":
		return fieldErr(path, "required")
	case !utf8.ValidString(s):
		return fieldErr(path, "must be valid UTF-8")
	case strings.TrimSpace(s) == "":
		return fieldErr(path, "must not be blank")
	}
	if n := utf8.RuneCountInString(s); n > MaxSKULen {
		return fieldErr(path, "must be at most %d characters, got %d", MaxSKULen, n)
	}
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return fieldErr(path, "must not contain control characters, got %s", quote(s))
	}
	return nil
}

// CheckReason returns the *[FieldError] (field "reason") that a payload's
// Validate gives a change's reason: longer than [MaxReasonLen] bytes, not
// UTF-8, or with a control character other than a line break or a tab. An
// empty reason passes (a kind that requires one says so itself). Stores
// check a reason with it before they write one (orders.CheckExchange).
func CheckReason(s string) error { return text("reason", s, MaxReasonLen, true) }

// text checks a free-text field: valid UTF-8 of at most limit bytes, without
// control characters other than line breaks ("\n" or "\r\n") and, if tabs,
// tabs.
//
// Line breaks are text: an address has lines, and a remark typed in a
// browser's text box arrives with "\r\n". Every other control character (NUL,
// escape sequences, a carriage return on its own, DEL, the C1 controls) is
// refused: none is meant by the people who write these fields, and they
// truncate strings in C-based systems downstream, rewrite terminals that
// show them and break fixed layouts. A tab is allowed in a remark or a
// reason, where it may indent pasted text, and refused in an address, which
// is printed on labels and exported to columns where it would shift fields.
func text(path, s string, limit int, tabs bool) error {
	switch {
	case len(s) > limit:
		return fieldErr(path, "must be at most %d bytes, got %d", limit, len(s))
	case !utf8.ValidString(s):
		return fieldErr(path, "must be valid UTF-8")
	}
	for i, r := range s {
		switch {
		case !unicode.IsControl(r), r == '\n', r == '\t' && tabs:
		case r == '\r' && i+1 < len(s) && s[i+1] == '\n':
		default:
			allowed := `line breaks (\n or \r\n)`
			if tabs {
				allowed += " and tabs"
			}
			return fieldErr(path, "must not contain control characters other than %s, got %U at byte %d", allowed, r, i)
		}
	}
	return nil
}
