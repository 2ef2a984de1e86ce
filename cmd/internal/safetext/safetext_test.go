package safetext

import (
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
