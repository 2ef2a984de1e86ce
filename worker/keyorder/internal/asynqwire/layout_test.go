package asynqwire_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// asynqwirePath is this package's import path, and asynqredisPath that of
// its public face (package asynqredis), whose names the rules below treat
// as this package's.
const (
	asynqwirePath  = "github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
	asynqredisPath = "github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

var (
	// asynqKey matches an asynq key, key prefix or channel in a string:
	// "asynq:{", "asynq:queues", "asynq:servers:", "asynq:cancel". It
	// leaves alone the import path "github.com/hibiken/asynq" and prose
	// that names asynq ("asynq: ...", "asynq's queues").
	asynqKey = regexp.MustCompile(`asynq:[{a-z]`)
	// asynqField matches a field of asynq's task hash in a Lua script
	// ("pending_since" is asynq's own; "msg" only as a quoted Lua string).
	asynqField = regexp.MustCompile(`pending_since|'msg'`)
)

// layoutSpellings returns where f, outside package asynqwire, spells asynq's
// private Redis layout, or reads or writes it around asynqwire:
//   - a string literal that names an asynq key ([asynqKey]) or a field of
//     asynq's task hash ([asynqField]);
//   - a string literal added to something of asynqwire's
//     (asynqwire.QueueKey(q) + "paused"): a key built from the layout;
//   - a call x.M(ctx, asynqwire.…, …), a go-redis command on one of
//     asynqwire's keys (rdb.SAdd(ctx, asynqwire.AllQueues, q)): a raw read
//     or write of asynq's data, which asynqwire's functions make;
//   - a constant or variable declared as one of asynqwire's names as it
//     is (const allQueues = asynqwire.AllQueues): a copy, through which
//     the rules above no longer see the key.
//
// Handing asynqwire's keys to a script built with asynqwire's Lua (the
// producer's acceptance), to ACL rules, or to a slot computation is fine.
func layoutSpellings(fset *token.FileSet, f *ast.File) []string {
	wire := map[string]bool{} // the names asynqwire is imported under
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == asynqwirePath || p == asynqredisPath {
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			wire[name] = true
		}
	}
	isWire := func(e ast.Expr) bool {
		if c, ok := e.(*ast.CallExpr); ok {
			e = c.Fun
		}
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && wire[id.Name]
	}
	// isSentinel says e is one of asynqwire's errors (ErrQueueUnlisted),
	// which errors.Is matches: no key.
	isSentinel := func(e ast.Expr) bool {
		sel, ok := e.(*ast.SelectorExpr)
		return ok && strings.HasPrefix(sel.Sel.Name, "Err")
	}
	isLit := func(e ast.Expr) bool {
		lit, ok := e.(*ast.BasicLit)
		return ok && lit.Kind == token.STRING
	}
	var found []string
	add := func(n ast.Node, why string) {
		found = append(found, fset.Position(n.Pos()).String()+": "+why)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ImportSpec:
			return false
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				break
			}
			v, err := strconv.Unquote(n.Value)
			if err == nil && (asynqKey.MatchString(v) || asynqField.MatchString(v)) {
				add(n, "spells asynq's layout: "+n.Value)
			}
		case *ast.BinaryExpr:
			if n.Op == token.ADD && (isWire(n.X) && isLit(n.Y) || isLit(n.X) && isWire(n.Y)) {
				add(n, "builds a key from asynqwire's: use or add one of its key functions")
			}
		case *ast.ValueSpec:
			for _, v := range n.Values {
				if _, call := v.(*ast.CallExpr); !call && isWire(v) {
					add(v, "copies asynqwire's name: use it where it is needed")
				}
			}
		case *ast.CallExpr:
			if _, method := n.Fun.(*ast.SelectorExpr); method && !isWire(n.Fun) && len(n.Args) >= 2 && isWire(n.Args[1]) && !isSentinel(n.Args[1]) {
				add(n, "a Redis command on asynq's key: use or add an asynqwire function")
			}
		}
		return true
	})
	return found
}

// TestOnlyThisPackageSpellsAsynqKeys keeps asynq's private Redis layout in
// one package: no production (non-test) Go file of the module outside
// this package and its public face (worker/keyorder/asynqredis, which
// hands this package's names out as they are) spells an asynq key, builds
// one, or runs a Redis command on one (see layoutSpellings). Two bugs came from copies of the
// layout elsewhere; an asynq upgrade checks this package only.
func TestOnlyThisPackageSpellsAsynqKeys(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..", "..")
	own, err := filepath.Abs(".")
	require.NoError(t, err)
	face, err := filepath.Abs(filepath.Join("..", "..", "asynqredis"))
	require.NoError(t, err)
	var found []string
	files := 0
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if abs, _ := filepath.Abs(path); abs == own || abs == face || path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		found = append(found, layoutSpellings(fset, f)...)
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 50, "the walk reads the module's files")
	require.Empty(t, found, "asynq's layout outside asynqwire; use or add its functions")
}

// layoutSpellings flags what spells asynq's layout and leaves alone what
// only names asynq.
func TestLayoutSpellings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		flagged   bool
	}{
		{"a queue key", `var k = "asynq:{" + q + "}:pending"`, true},
		{"the set of queues", `var k = "asynq:queues"`, true},
		{"a server key prefix", "var k = `asynq:servers:`", true},
		{"the cancel channel", `var k = "asynq:cancel"`, true},
		{"a Lua script writing a task hash", `var s = "redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[1])"`, true},
		{"a Lua script reading a message", `var s = "return redis.call('HGET', KEYS[1], 'msg')"`, true},
		{"a key built from asynqwire's prefix", `var k = asynqwire.QueueKey(q) + "paused"`, true},
		{"a key built under an alias", `var k = "x" + aw.AllQueues`, true},
		{"a raw read of asynq's key", `func f() { rdb.ZCard(ctx, asynqwire.CompletedKey(q)) }`, true},
		{"a raw write of asynq's set", `func f() { rdb.SAdd(ctx, asynqwire.AllQueues, q) }`, true},
		{"a copy of asynqwire's key", `const allQueues = asynqwire.AllQueues`, true},
		{"a copy under an alias", `var all = aw.AllQueues`, true},
		{"a raw read of the public face's key", `func f() { rdb.LLen(ctx, asynqredis.PendingKey(q)) }`, true},
		{"a key built from the public face's prefix", `var k = asynqredis.QueueKey(q) + "paused"`, true},
		{"a key made for a use", `var key = asynqwire.PendingKey(q)`, false},
		{"asynq's import path", `var p = "github.com/hibiken/asynq"`, false},
		{"a log message naming asynq", `var m = "asynq: server stopped; asynq's queues listed"`, false},
		{"asynqwire's key handed to a script", `var keys = []string{asynqwire.TaskKey(q, id), asynqwire.AllQueues}`, false},
		{"asynqwire's key for a slot", `func f() { cl.MasterOf(asynqwire.QueueKey(q)) }`, false},
		{"a call of asynqwire", `func f() { asynqwire.Finished(ctx, asynqwire.X, qs) }`, false},
		{"our own keys", `var k = "ow:lock:{" + no + "}:seq"`, false},
		{"a queue name", `var q = "order_modify:2"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := "package p\n\nimport (\n\t\"github.com/hibiken/asynq\"\n\t\"" + asynqwirePath + "\"\n\taw \"" + asynqwirePath + "\"\n\t\"" + asynqredisPath + "\"\n)\n\n" + tt.src + "\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
			require.NoError(t, err)
			assert.Equal(t, tt.flagged, len(layoutSpellings(fset, f)) > 0, "%v", layoutSpellings(fset, f))
		})
	}
}
