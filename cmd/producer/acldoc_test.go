package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/acl"
)

// aclKeys are the keys of the table of rights in docs/operations.md, one
// of each kind, for the default settings; the last is with
// ORDER_STORE=http.
var aclKeys = []struct{ name, key string }{
	{"order hash", "ow:order:{SO1}"},
	{"history", "ow:order:{SO1}:history"},
	{"notes", "ow:order:{SO1}:notes"},
	{"event record", "ow:order:{SO1}:ev:1"},
	{"lock, fence", "ow:lock:{SO1}"},
	{"sequence", "ow:lock:{SO1}:seq"},
	{"held index", "ow:lock:held"},
	{"backlog index, sum", "ow:lock:backlog"},
	{"event claim", "ow:event:{e1}"},
	{"task hash", "asynq:{q}:t:e1"},
	{"pending list", "asynq:{q}:pending"},
	{"queue list", "asynq:queues"},
	{"token (http)", "ow:token:{upstream}"},
}

// aclWords splits the one line `producer acl` prints into its rules: a
// selector, "(...)", is one.
func aclWords(line string) []string {
	var out []string
	for rest := strings.TrimSpace(line); rest != ""; rest = strings.TrimSpace(rest) {
		if strings.HasPrefix(rest, "(") {
			end := strings.Index(rest, ")")
			out = append(out, rest[:end+1])
			rest = rest[end+1:]
			continue
		}
		w, r, _ := strings.Cut(rest, " ")
		out = append(out, w)
		rest = r
	}
	return out
}

// globMatch reports whether key matches the Redis glob pattern p (with
// the * and \ escapes the rules use).
func globMatch(p, key string) bool {
	var re strings.Builder
	re.WriteString("^")
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\' && i+1 < len(p):
			i++
			re.WriteString(regexp.QuoteMeta(string(p[i])))
		case c == '*':
			re.WriteString(".*")
		default:
			re.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	re.WriteString("$")
	return regexp.MustCompile(re.String()).MatchString(key)
}

// access is what the printed rules let their user do to key: "read,
// write", "read", "read; only HSET" (write commands granted in selectors
// of their own), or "—". The selector of EVAL and EVALSHA, which only
// lets a script name the keys, grants nothing by itself.
func access(words []string, key string) string {
	read, write := false, false
	var only []string
	for _, w := range words {
		switch {
		case strings.HasPrefix(w, "(+eval "):
		case strings.HasPrefix(w, "("):
			f := strings.Fields(strings.Trim(w, "()"))
			for _, p := range f[1:] {
				pat := strings.TrimPrefix(strings.TrimPrefix(p, "%W"), "%R")
				if globMatch(strings.TrimPrefix(pat, "~"), key) {
					only = append(only, strings.ToUpper(strings.TrimPrefix(f[0], "+")))
				}
			}
		case strings.HasPrefix(w, "%R~"):
			read = read || globMatch(w[3:], key)
		case strings.HasPrefix(w, "~"):
			if globMatch(w[1:], key) {
				read, write = true, true
			}
		}
	}
	slices.Sort(only)
	only = slices.Compact(only)
	switch {
	case write:
		return "read, write"
	case read && len(only) > 0:
		return "read; only " + strings.Join(only, ", ")
	case read:
		return "read"
	case len(only) > 0:
		return "only " + strings.Join(only, ", ")
	}
	return "—"
}

// aclTable is docs/operations.md's table of what each role may do to each
// kind of key, read back from what `producer acl` prints.
func aclTable(t *testing.T) string {
	t.Helper()
	cli := cliWith(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}) // never dialled
	var b strings.Builder
	b.WriteString("| key |")
	for _, p := range acl.Processes() {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(acl.Processes())))
	b.WriteString("\n")
	for _, k := range aclKeys {
		fmt.Fprintf(&b, "| %s `%s` |", k.name, k.key)
		for _, p := range acl.Processes() {
			args := []string{"acl", string(p)}
			if strings.Contains(k.key, "token") {
				args = []string{"-order-store", "http", "-order-api-url", "https://orders.example.com", "-token-url", "https://idp.example.com/token",
					"-token-client-id", "x", "acl", string(p)}
			}
			out, err := cli(args...)
			require.NoError(t, err)
			fmt.Fprintf(&b, " %s |", access(aclWords(out), k.key))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestDocsTableOfRights checks the table of rights in docs/operations.md
// (ACL rules) against what `producer acl` prints; UPDATE_DOCS=1 rewrites
// it.
func TestDocsTableOfRights(t *testing.T) {
	const path, begin, end = "../../docs/operations.md", "<!-- acl-table:begin -->\n", "<!-- acl-table:end -->"
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	before, rest, ok := strings.Cut(string(doc), begin)
	require.True(t, ok, "%s has no %q", path, begin)
	old, after, ok := strings.Cut(rest, end)
	require.True(t, ok, "%s has no %q", path, end)
	want := aclTable(t)
	if os.Getenv("UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(path, []byte(before+begin+want+end+after), 0o644))
		return
	}
	require.Equal(t, want, old, "the table of rights in %s is not what `producer acl` prints (UPDATE_DOCS=1 go test -run TestDocsTableOfRights ./cmd/producer/ rewrites it)", path)
}
