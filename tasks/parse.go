package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ParseModify decodes a [TypeModify] payload strictly and validates it.
//
// Strictly means: b is one JSON object in valid UTF-8 of at most
// [MaxPayloadBytes] bytes, with nothing but white space after it; field names
// match exactly (case-sensitively); unknown and repeated fields are errors;
// every value has the JSON type of its field, and qty is an integer. A null
// counts as an absent field.
//
// Every error matches [ErrInvalid] and asynq.SkipRetry; where one field is at
// fault it is a [*FieldError] naming it. When the JSON decodes but
// [ModifyPayload.Validate] fails, the decoded payload is returned along with
// the error, so that a caller can log its event_id; otherwise the payload is
// the zero value on error.
func ParseModify(b []byte) (ModifyPayload, error) {
	var p ModifyPayload
	if err := decode(b, func(d *decoder) error { return d.modify(&p) }); err != nil {
		return ModifyPayload{}, err
	}
	return p, p.Validate()
}

// ParseExchange decodes a [TypeExchange] payload strictly and validates it,
// under the rules and with the errors of [ParseModify].
func ParseExchange(b []byte) (ExchangePayload, error) {
	var p ExchangePayload
	if err := decode(b, func(d *decoder) error { return d.exchange(&p) }); err != nil {
		return ExchangePayload{}, err
	}
	return p, p.Validate()
}

// DecodeModify reads a [TypeModify] payload from r, up to EOF, and parses it
// with [ParseModify], for an HTTP handler that has a request body. It reads at
// most [MaxPayloadBytes]+1 bytes.
//
// It returns the errors of [ParseModify], and a read error of r wrapped (not
// matching [ErrInvalid]).
func DecodeModify(r io.Reader) (ModifyPayload, error) {
	b, err := readPayload(r)
	if err != nil {
		return ModifyPayload{}, err
	}
	return ParseModify(b)
}

// DecodeExchange reads a [TypeExchange] payload from r and parses it with
// [ParseExchange], as [DecodeModify] does for a modify.
func DecodeExchange(r io.Reader) (ExchangePayload, error) {
	b, err := readPayload(r)
	if err != nil {
		return ExchangePayload{}, err
	}
	return ParseExchange(b)
}

func readPayload(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxPayloadBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tasks: read payload: %w", err)
	}
	return b, nil
}

// decode runs body over b, a single JSON value, and checks what surrounds it.
func decode(b []byte, body func(*decoder) error) error {
	switch {
	case len(b) > MaxPayloadBytes:
		return &payloadError{fmt.Sprintf("payload is larger than %d bytes", MaxPayloadBytes)}
	case !utf8.Valid(b):
		return &payloadError{"payload is not valid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	d := &decoder{dec: dec, b: b}
	if err := body(d); err != nil {
		return err
	}
	rest := b[dec.InputOffset():]
	if trimmed := bytes.TrimLeft(rest, " \t\r\n"); len(trimmed) > 0 {
		off := len(b) - len(trimmed)
		return &payloadError{fmt.Sprintf("invalid JSON: data after the payload object at offset %d", off)}
	}
	return nil
}

// decoder reads the payloads token by token, so that it can name the field at
// fault, match names exactly and refuse repeated names, none of which
// json.Unmarshal does. b is the whole input, for the raw form of a string.
type decoder struct {
	dec *json.Decoder
	b   []byte
}

func (d *decoder) modify(p *ModifyPayload) error {
	return d.object("", func(key, path string) (err error) {
		switch key {
		case "event_id":
			p.EventID, err = d.str(path)
		case "order_no":
			p.OrderNo, err = d.str(path)
		case "changes":
			err = d.changes(path, &p.Changes)
		case "seq":
			p.Seq, err = d.seq(path)
		default:
			err = unknown(path)
		}
		return err
	})
}

func (d *decoder) changes(path string, c *Changes) error {
	return d.object(path, func(key, path string) (err error) {
		switch key {
		case "address":
			c.Address, err = d.optStr(path)
		case "remark":
			c.Remark, err = d.optStr(path)
		case "items":
			c.Items, err = d.items(path)
		default:
			err = unknown(path)
		}
		return err
	})
}

func (d *decoder) exchange(p *ExchangePayload) error {
	return d.object("", func(key, path string) (err error) {
		switch key {
		case "event_id":
			p.EventID, err = d.str(path)
		case "order_no":
			p.OrderNo, err = d.str(path)
		case "items":
			p.Items, err = d.items(path)
		case "new_order_no":
			p.NewOrderNo, err = d.str(path)
		case "reason":
			p.Reason, err = d.str(path)
		case "seq":
			p.Seq, err = d.seq(path)
		default:
			err = unknown(path)
		}
		return err
	})
}

// items reads an items list: nil for null, a non-nil slice for an array.
func (d *decoder) items(path string) ([]Item, error) {
	tok, err := d.token()
	if err != nil || tok == nil {
		return nil, err
	}
	if tok != json.Delim('[') {
		return nil, mismatch(path, "an array", tok)
	}
	items := []Item{}
	for d.dec.More() {
		if len(items) == MaxItems {
			return nil, fieldErr(path, "must have at most %d entries", MaxItems)
		}
		var it Item
		at := path + "[" + strconv.Itoa(len(items)) + "]"
		err := d.object(at, func(key, path string) (err error) {
			switch key {
			case "sku":
				it.SKU, err = d.str(path)
			case "qty":
				it.Qty, err = d.qty(path)
			default:
				err = unknown(path)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	_, err = d.token() // ']'
	return items, err
}

// object reads an object, calling member for each of its members with the
// member's name and path; member must consume the value. A null at the top
// level is an error, and elsewhere counts as an empty object.
func (d *decoder) object(path string, member func(key, path string) error) error {
	tok, err := d.token()
	switch {
	case err != nil:
		return err
	case tok == nil && path != "":
		return nil
	case tok != json.Delim('{'):
		if path == "" {
			return &payloadError{"payload must be a JSON object, got " + kind(tok)}
		}
		return mismatch(path, "an object", tok)
	}
	seen := make(map[string]bool)
	for d.dec.More() {
		tok, err := d.token()
		if err != nil {
			return err
		}
		key := tok.(string) // json.Decoder only yields strings as object keys
		at := join(path, key)
		if seen[key] {
			return fieldErr(at, "repeated field")
		}
		seen[key] = true
		if err := member(key, at); err != nil {
			return err
		}
	}
	_, err = d.token() // '}'
	return err
}

// str reads a string; null reads as "".
func (d *decoder) str(path string) (string, error) {
	s, err := d.optStr(path)
	if err != nil || s == nil {
		return "", err
	}
	return *s, nil
}

// optStr reads a string; null reads as nil. A string that escapes a lone
// UTF-16 surrogate is an error: encoding/json would replace it with U+FFFD
// without a word, so the text stored would not be the text sent.
func (d *decoder) optStr(path string) (*string, error) {
	start := d.dec.InputOffset()
	tok, err := d.token()
	if err != nil || tok == nil {
		return nil, err
	}
	s, ok := tok.(string)
	if !ok {
		return nil, mismatch(path, "a string", tok)
	}
	// Only a string with U+FFFD in it can have had a lone surrogate. Between
	// start and the end of the token lie white space, perhaps a ':' or ',',
	// and the string literal, which begins at the first '"'.
	if strings.ContainsRune(s, utf8.RuneError) {
		raw := d.b[start:d.dec.InputOffset()]
		if loneSurrogate(raw[bytes.IndexByte(raw, '"'):]) {
			return nil, fieldErr(path, `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`)
		}
	}
	return &s, nil
}

// loneSurrogate reports whether lit, a well-formed JSON string literal,
// escapes a UTF-16 surrogate (\ud800 to \udfff) that is not half of a
// high-low pair.
func loneSurrogate(lit []byte) bool {
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		i++ // the escaped character; the loop steps past it
		if lit[i] != 'u' {
			continue
		}
		r := hex4(lit[i+1:])
		i += 4
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return true // a low surrogate first
		case r >= 0xd800 && r <= 0xdbff:
			if i+6 >= len(lit) || lit[i+1] != '\\' || lit[i+2] != 'u' {
				return true
			}
			if lo := hex4(lit[i+3:]); lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 6 // the low half
		}
	}
	return false
}

// hex4 decodes the four hexadecimal digits at the start of b, which the
// JSON decoder has already checked.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// qty reads a quantity, a JSON number written as an integer; null reads as 0.
func (d *decoder) qty(path string) (int, error) {
	tok, err := d.token()
	if err != nil || tok == nil {
		return 0, err
	}
	n, ok := tok.(json.Number)
	if !ok {
		return 0, mismatch(path, "an integer", tok)
	}
	v, err := strconv.ParseInt(string(n), 10, 0)
	if err != nil {
		return 0, fieldErr(path, "must be an integer between %d and %d, got %s", MinQty, MaxQty, quoteNumber(string(n)))
	}
	return int(v), nil
}

// seq reads a position, a JSON number written as a positive integer; null
// reads as 0 (none).
func (d *decoder) seq(path string) (int64, error) {
	tok, err := d.token()
	if err != nil || tok == nil {
		return 0, err
	}
	n, ok := tok.(json.Number)
	if !ok {
		return 0, mismatch(path, "an integer", tok)
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || v <= 0 {
		return 0, fieldErr(path, "must be a positive integer, got %s", quoteNumber(string(n)))
	}
	return v, nil
}

// token returns the next token, turning a JSON syntax error into a payload
// error.
func (d *decoder) token() (json.Token, error) {
	tok, err := d.dec.Token()
	if err == nil {
		return tok, nil
	}
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn):
		return nil, &payloadError{fmt.Sprintf("invalid JSON at offset %d: %s", syn.Offset, syn.Error())}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return nil, &payloadError{"invalid JSON: unexpected end of input"}
	default:
		return nil, &payloadError{"invalid JSON: " + err.Error()}
	}
}

func unknown(path string) error { return fieldErr(path, "unknown field") }

func mismatch(path, want string, got json.Token) error {
	return fieldErr(path, "must be %s, got %s", want, kind(got))
}

// kind names the JSON type of a token that starts a value.
func kind(tok json.Token) string {
	switch tok := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case json.Delim:
		if tok == '[' {
			return "array"
		}
		return "object"
	}
	return fmt.Sprintf("%T", tok)
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
