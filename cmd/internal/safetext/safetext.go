// Package safetext shows text that came from outside (an order's address,
// a remark, a SKU, an error message) so that it cannot disguise itself: the
// CLI prints it to a terminal, the dashboard's order page to a browser.
//
// It lives under cmd/ because only the commands show such text to people.
package safetext

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Escape escapes the control characters (Unicode Cc: "\n", "\x1b",
// "\u0085") and the format characters (Cf: the bidirectional overrides,
// embeddings and isolates U+202A–U+202E and U+2066–U+2069, the marks
// U+200E, U+200F and U+061C, zero-width joiners, the BOM) of s, as Go
// quotes them ("\n", "\x1b", "\u202e"), and every byte of invalid UTF-8 as
// "\xff". The rest of s, letters and symbols of any script included, is
// left as it is, so "Straße ✓" stays "Straße ✓".
//
// A terminal obeys control characters, and both a terminal and a browser
// reorder text after a bidirectional override: "\u202e" in a remark makes
// what follows read backwards, so "txt.exe" can read "exe.txt". Escaped, the
// override shows as the six characters `\u202e`.
//
// Escape is not an HTML or shell escape: the caller still escapes for its
// medium (html/template does for the order page). It is safe for concurrent
// use.
func Escape(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || unsafe(r) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s // the common case: nothing to escape, no copy
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafe(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

// unsafe reports a control or format character.
func unsafe(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// JSON escapes, in JSON text b such as encoding/json writes, the control
// and format characters that the encoder leaves as they are (U+007F, the C1
// controls, the Cf characters such as U+202E) with JSON's own escapes
// ("\u202e", a surrogate pair above U+FFFF): the text decodes to the same
// value, and a terminal shows each escape as its six characters. JSON text
// holds such characters only inside strings (its white space between
// tokens, "\n" and "\t" among it, is left alone), so escaping them anywhere
// is sound. It returns b itself when nothing needs escaping. It is safe for
// concurrent use.
func JSON(b []byte) []byte {
	i := 0
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if jsonUnsafe(r) {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+12)
	out = append(out, b[:i]...)
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case !jsonUnsafe(r):
			out = append(out, b[i:i+size]...)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

// jsonUnsafe reports a control or format character that encoding/json
// does not escape: it escapes those below U+0020 inside strings, and
// writes "\n" and "\t" between tokens.
func jsonUnsafe(r rune) bool { return r >= 0x7f && unsafe(r) }
