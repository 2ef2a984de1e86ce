package safetext

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestEscape keeps what is shown as text and escapes what a terminal would
// obey or a browser would reorder by.
func TestEscape(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"1 Main St, Springfield", "1 Main St, Springfield"},
		{"Straße ✓ 東京 שלום", "Straße ✓ 東京 שלום"},
		{"line\nbreak\ttab", `line\nbreak\ttab`},
		{"\x1b[2Jgone", `\x1b[2Jgone`},
		{"\u202eevil", `\u202eevil`},
		{"invoice\u202Etxt.exe", `invoice\u202etxt.exe`},
		{"a\u2066b\u2067c\u2068d\u2069e", `a\u2066b\u2067c\u2068d\u2069e`},
		{"\u202a\u202b\u202c\u202d", `\u202a\u202b\u202c\u202d`},
		{"\u200e\u200f\u061c", `\u200e\u200f\u061c`},
		{"zero\u200bwidth\ufeff", `zero\u200bwidth\ufeff`},
		{"bad \xff byte", `bad \xff byte`},
		{"\u0085next", `\u0085next`},
		{"\x00", `\x00`},
	}
	for _, tt := range tests {
		got := Escape(tt.in)
		assert.Equal(t, tt.want, got, "%q", tt.in)
		assert.True(t, utf8.ValidString(got), "%q", tt.in)
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"plain", "\u202e", "\xff", "a\nb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Escape(s)
		if !utf8.ValidString(got) {
			t.Fatalf("Escape(%q) = %q: not UTF-8", s, got)
		}
		for _, r := range got {
			if unsafe(r) {
				t.Fatalf("Escape(%q) = %q keeps %U", s, got, r)
			}
		}
		if again := Escape(got); again != got {
			t.Fatalf("Escape(%q) = %q: a second pass changed it", got, again)
		}
	})
}

// TestJSON escapes in JSON text what a terminal would obey or reorder by,
// as JSON escapes: the value decodes the same.
func TestJSON(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain Straße ✓", "\u202eevil", "a\u2066b\u2069", "\u0085\u009b[2J\x7f", "tag\U000E0041", "\n\x1b"} {
		b, err := json.MarshalIndent(map[string]string{"reason": s}, "", "\t")
		assert.NoError(t, err)
		got := JSON(b)
		for _, r := range string(got) {
			assert.False(t, unsafe(r) && r != '\n' && r != '\t', "%q keeps %U", got, r)
		}
		var back map[string]string
		assert.NoError(t, json.Unmarshal(got, &back), "%s", got)
		assert.Equal(t, s, back["reason"])
	}
	assert.Equal(t, `{"r":"\u202eevil"}`, string(JSON([]byte("{\"r\":\"\u202eevil\"}"))))
}
