package tasks

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Parse decodes a payload of type P (such as [ModifyPayload]) strictly and
// validates it. [Kind.Parse] does the same for a kind known at run time.
//
// Strictly means: b is one JSON object in valid UTF-8 of at most
// [MaxPayloadBytes] bytes, with nothing but white space after it; field names
// match exactly (case-sensitively); unknown and repeated fields are errors;
// every value has the JSON type of its field, and qty is an integer. A null
// counts as an absent field.
//
// Every error matches [ErrInvalid] and asynq.SkipRetry; where one field is at
// fault it is a [*FieldError] naming it. When the JSON decodes but the
// payload's Validate fails, the decoded payload is returned along with the
// error, so that a caller can log its event_id; otherwise the payload is the
// zero value on error.
func Parse[P Payload](b []byte) (P, error) {
	var p P
	if err := decode(b, &p); err != nil {
		var zero P
		return zero, err
	}
	return p, p.Validate()
}

// decodeOptions complete the strict decoding. The JSON library
// (github.com/go-json-experiment/json, which becomes encoding/json/v2)
// already, by default, matches field names exactly (case-sensitively),
// refuses repeated names and invalid UTF-8, refuses a lone UTF-16
// surrogate escape instead of turning it into U+FFFD, refuses a number for
// an int that is not an integer, and leaves a field as it is (absent) for
// null. The options add: unknown fields are refused, and seq is positive.
var decodeOptions = json.JoinOptions(
	json.RejectUnknownMembers(true),
	json.WithUnmarshalers(json.UnmarshalFromFunc(unmarshalSeq)),
)

// decode decodes b, a single JSON object, into the payload p points to,
// strictly (see [Parse]), and turns the JSON library's errors into the
// package's: a [*FieldError] naming the field at fault, or a payload error.
func decode[P Payload](b []byte, p *P) error {
	switch {
	case len(b) > MaxPayloadBytes:
		return &payloadError{fmt.Sprintf("payload is larger than %d bytes", MaxPayloadBytes)}
	case !utf8.Valid(b):
		return &payloadError{"payload is not valid UTF-8"}
	}
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	switch k := dec.PeekKind(); k {
	case '{':
	case 'n', 't', 'f', '0', '"', '[':
		// A scalar must be read whole to be known as one ("tru" is not
		// JSON); an array is known by its first character.
		if k != '[' {
			if _, err := dec.ReadToken(); err != nil {
				return jsonError(reflect.TypeFor[P](), err)
			}
		}
		return &payloadError{"payload must be a JSON object, got " + kindName(k)}
	default: // not JSON: the read says why
		_, err := dec.ReadToken()
		return jsonError(reflect.TypeFor[P](), err)
	}
	if err := json.UnmarshalDecode(dec, p, decodeOptions); err != nil {
		return jsonError(reflect.TypeFor[P](), err)
	}
	rest := b[dec.InputOffset():]
	if trimmed := bytes.TrimLeft(rest, " \t\r\n"); len(trimmed) > 0 {
		off := len(b) - len(trimmed)
		return &payloadError{fmt.Sprintf("invalid JSON: data after the payload object at offset %d", off)}
	}
	return nil
}

// errBadSeq is the error of a seq that is not an integer from 1 to MaxSeq.
type errBadSeq struct{ lit string }

func (e errBadSeq) Error() string { return "not an integer from 1 to MaxSeq: " + e.lit }

// unmarshalSeq reads a position (the payloads' only int64, seq): a JSON
// number written as an integer from 1 to MaxSeq; null reads as 0 (none). Anything
// else is left to the library, which refuses it for its type.
func unmarshalSeq(dec *jsontext.Decoder, v *int64) error {
	if dec.PeekKind() != '0' {
		return json.SkipFunc
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	lit := tok.String()
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil || n <= 0 || n > MaxSeq {
		return errBadSeq{lit}
	}
	*v = n
	return nil
}

// errLoneSurrogate is the message of a string that escapes a lone UTF-16
// surrogate: encoding/json would replace it with U+FFFD without a word, so
// the text stored would not be the text sent.
const errLoneSurrogate = `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`

// jsonError turns an error of the JSON library, decoding into a value of
// type root, into the package's error.
func jsonError(root reflect.Type, err error) error {
	var sem *json.SemanticError
	var syn *jsontext.SyntacticError
	var seq errBadSeq
	switch {
	case errors.As(err, &seq):
		path := "seq"
		if errors.As(err, &sem) {
			path = fieldPath(root, sem.JSONPointer)
		}
		return fieldErr(path, seqRule+", got %s", quoteNumber(seq.lit))
	case errors.As(err, &sem):
		path := fieldPath(root, sem.JSONPointer)
		switch {
		case errors.Is(sem.Err, json.ErrUnknownName):
			return fieldErr(path, "unknown field")
		case sem.JSONKind == '0' && sem.JSONPointer.LastToken() == "qty":
			return fieldErr(path, "must be an integer between %d and %d, got %s", MinQty, MaxQty, quoteNumber(string(sem.JSONValue)))
		case sem.JSONKind == '0' && isInteger(sem.GoType):
			return fieldErr(path, "must be an integer, got %s", quoteNumber(string(sem.JSONValue)))
		}
		return fieldErr(path, "must be %s, got %s", expected(sem.GoType), kindName(sem.JSONKind))
	case errors.As(err, &syn):
		path := fieldPath(root, syn.JSONPointer)
		switch {
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			return fieldErr(path, "repeated field")
		case syn.Err != nil && strings.Contains(syn.Err.Error(), "invalid surrogate pair") && path != "":
			// The library reports a lone surrogate as a syntax error in the
			// string, without a sentinel: its text is pinned by the tests.
			return fieldErr(path, errLoneSurrogate)
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			return &payloadError{"invalid JSON: unexpected end of input"}
		}
		return &payloadError{fmt.Sprintf("invalid JSON at offset %d: %v", syn.ByteOffset, syn.Err)}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return &payloadError{"invalid JSON: unexpected end of input"}
	}
	return &payloadError{"invalid JSON: " + err.Error()}
}

// fieldPath turns a JSON pointer into a payload of type root into the path
// that errors name, e.g. "changes.items[2].qty": the type tells an array
// index from an object member.
func fieldPath(root reflect.Type, ptr jsontext.Pointer) string {
	path, t := "", root
	for tok := range ptr.Tokens() {
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t != nil && t.Kind() == reflect.Slice:
			path += "[" + tok + "]"
			t = t.Elem()
		default:
			path = join(path, tok)
			t = memberType(t, tok)
		}
	}
	return path
}

// memberType returns the type of the field of struct type t whose JSON name
// is name, or nil.
func memberType(t reflect.Type, name string) reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	for f := range t.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return f.Type
		}
	}
	return nil
}

// expected names the JSON type that a field of Go type t takes.
func expected(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == nil:
		return "something else"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Slice:
		return "an array"
	case t.Kind() == reflect.Struct:
		return "an object"
	case isInteger(t):
		return "an integer"
	}
	return "a " + t.Kind().String()
}

func isInteger(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return true
	}
	return false
}

// kindName names a JSON kind as the errors do.
func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	case '0':
		return "number"
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "nothing"
}

// join appends a member name to a path, quoting a name that is not a plain
// identifier so that the path stays readable and unambiguous.
func join(path, key string) string {
	if !plain(key) {
		key = quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func plain(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// quoteNumber shortens a long number literal for an error message.
func quoteNumber(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}
