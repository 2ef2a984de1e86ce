package docs_test

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// maxREADMELines is the most lines README.md may have: the first read,
// which a newcomer follows in one sitting. The rest lives in docs/.
const maxREADMELines = 400

// testCommand is the README's test command, the one CI runs last.
const testCommand = "go test -race -count=1 ./..."

// docFiles returns the Markdown files whose links are checked, relative to
// the root: README.md, docs/*.md and cmd/*/README.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "cmd/*/README.md"} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		for _, m := range matches {
			rel, err := filepath.Rel(root, m)
			require.NoError(t, err)
			files = append(files, rel)
		}
	}
	return files
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(t, err)
	return string(b)
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	link       = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	schemeLike = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// prose returns the lines of doc outside fenced code blocks, with the code
// blocks' lines blanked (so that line numbers stay) and inline code spans
// removed: neither holds links or headings.
func prose(doc string) []string {
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
			continue
		}
		lines[i] = codeSpan.ReplaceAllString(l, "")
	}
	return lines
}

// slug is GitHub's anchor for a heading's text: lower case, the text of
// its links, letters, digits, '-' and '_' kept, spaces turned into '-',
// everything else dropped.
func slug(text string) string {
	text = link.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of doc's headings, GitHub style: a repeated
// heading's anchor gets -1, -2, ... appended.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(doc) {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			seen[s]++
			s += "-" + strconv.Itoa(n)
		} else {
			seen[s] = 1
		}
		out[s] = true
	}
	return out
}

// target is one relative link: where it was, and what it names.
type target struct {
	from   string // the file holding the link, relative to the root
	line   int    // its line, from 1
	raw    string // the link's target as written
	path   string // the file it names, relative to the root ("" for the same file)
	anchor string // the heading it names, or ""
}

// links returns the relative links of the file at rel, relative to the
// root: neither a URL with a scheme (https:, mailto:) nor inside code.
func links(t *testing.T, rel string) []target {
	t.Helper()
	lines := prose(read(t, rel))
	text := strings.Join(lines, "\n")
	var out []target
	for _, m := range link.FindAllStringSubmatchIndex(text, -1) {
		raw := text[m[4]:m[5]]
		if schemeLike.MatchString(raw) {
			continue
		}
		p, anchor, _ := strings.Cut(raw, "#")
		p, err := url.PathUnescape(p)
		require.NoError(t, err, "%s: link %q", rel, raw)
		tg := target{from: rel, line: strings.Count(text[:m[0]], "\n") + 1, raw: raw, anchor: anchor}
		if p != "" {
			tg.path = filepath.Join(filepath.Dir(rel), p)
		}
		out = append(out, tg)
	}
	return out
}

// TestRelativeLinksResolve checks that every relative link of the docs
// names a file (or a directory) that exists, and that a link with an
// anchor, to a Markdown file or within the same file, names one of its
// headings.
func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	files := docFiles(t)
	require.Contains(t, files, filepath.Join("docs", "operations.md"), "the docs were not found")
	for _, rel := range files {
		for _, l := range links(t, rel) {
			where := l.from + ":" + strconv.Itoa(l.line) + ": (" + l.raw + ")"
			file := l.path
			if file == "" {
				file = l.from
			}
			_, err := os.Stat(filepath.Join(root, file))
			if !assert.NoError(t, err, "%s: no such file", where) || l.anchor == "" {
				continue
			}
			if !assert.Equal(t, ".md", filepath.Ext(file), "%s: an anchor into a file that is not Markdown", where) {
				continue
			}
			assert.True(t, anchors(read(t, file))[l.anchor], "%s: %s has no heading with the anchor #%s", where, file, l.anchor)
		}
	}
}

// TestSlug pins the anchors GitHub gives headings, which the links use.
func TestSlug(t *testing.T) {
	t.Parallel()
	tests := []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"The lock: guarantees and limits", "the-lock-guarantees-and-limits"},
		{"Failover, tested", "failover-tested"},
		{"The quick loop: -short", "the-quick-loop--short"},
		{"The shared token's waiters", "the-shared-tokens-waiters"},
		{"HTTP intake (for systems not written in Go)", "http-intake-for-systems-not-written-in-go"},
		{"In production: the HTTP order store and the shared token", "in-production-the-http-order-store-and-the-shared-token"},
		{"`order_no` and [links](x.md)", "order_no-and-links"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, slug(codeSpan.ReplaceAllStringFunc(tt.heading, func(s string) string { return strings.Trim(s, "`") })), tt.heading)
	}
}

// TestAnchorsSkipCodeAndNumberRepeats checks that a comment in a code block
// is no heading, and that a repeated heading's anchor is numbered.
func TestAnchorsSkipCodeAndNumberRepeats(t *testing.T) {
	t.Parallel()
	doc := "# Top\n\n```sh\n# not a heading\n```\n\n## Notes\n\n## Notes\n"
	got := anchors(doc)
	assert.Equal(t, map[string]bool{"top": true, "notes": true, "notes-1": true}, got)
}

// TestREADMEIsShort keeps the README a first read: at most maxREADMELines
// lines. What does not fit belongs in docs/.
func TestREADMEIsShort(t *testing.T) {
	t.Parallel()
	n := strings.Count(strings.TrimRight(read(t, "README.md"), "\n"), "\n") + 1
	assert.LessOrEqual(t, n, maxREADMELines, "README.md has %d lines; move the detail to docs/", n)
}

// TestREADMEGivesCITestCommand checks that the README's quick start gives
// the test command verbatim, that .ci/run runs it last, and that make test
// runs it: CI runs the exact command the README gives.
func TestREADMEGivesCITestCommand(t *testing.T) {
	t.Parallel()
	readme := read(t, "README.md")
	quick, _, ok := strings.Cut(readme[strings.Index(readme, "## Quick start"):], "\n## ")
	require.True(t, ok, "README.md has no section after its quick start")
	assert.Contains(t, quick, "\n"+testCommand+" ", "the quick start does not give the test command")
	assert.Contains(t, quick, "\ngo run ./cmd/demo ", "the quick start does not give the demo command")

	var last string
	for _, l := range strings.Split(read(t, ".ci/run"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			last = l
		}
	}
	assert.Equal(t, testCommand, last, ".ci/run's last command")
	assert.Contains(t, read(t, "Makefile"), "\t$(GO) "+strings.TrimPrefix(testCommand, "go ")+"\n", "make test")
}
