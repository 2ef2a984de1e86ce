package asynqwire_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOnlyThisPackageSpellsAsynqKeys keeps asynq's private Redis layout in
// one package: no string literal of the module's production code outside
// internal/asynqwire names an asynq key ("asynq:..."). Two bugs came from
// copies of the layout elsewhere; an asynq upgrade checks this package
// only.
// asynqKey matches an asynq key or key prefix: "asynq:{...", "asynq:queues".
var asynqKey = regexp.MustCompile(`asynq:[{a-z]`)

func TestOnlyThisPackageSpellsAsynqKeys(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	own, err := filepath.Abs(".")
	require.NoError(t, err)
	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if abs, _ := filepath.Abs(path); abs == own || strings.HasPrefix(d.Name(), ".") && path != root {
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
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && asynqKey.MatchString(v) {
					found = append(found, fset.Position(lit.Pos()).String()+": "+lit.Value)
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "asynq's keys spelt outside internal/asynqwire; use its functions")
}
