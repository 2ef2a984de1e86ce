package worker_test

import (
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The public packages that programs of other modules import: their
// exported API may name no type of an internal package, so that every
// exported function can be called, and every exported type used, from
// outside the module.
var publicPackages = []string{
	"github.com/orderworker/orderworker/worker",
	"github.com/orderworker/orderworker/worker/orders",
	"github.com/orderworker/orderworker/worker/orders/storetest",
	"github.com/orderworker/orderworker/worker/workertest",
	"github.com/orderworker/orderworker/tasks",
}

func TestPublicAPINamesNoInternalType(t *testing.T) {
	t.Parallel()
	for _, path := range publicPackages {
		t.Run(path[strings.LastIndex(path, "orderworker/")+len("orderworker/"):], func(t *testing.T) {
			t.Parallel()
			pkg := exported(t, path)
			var leaks []string
			w := apiWalker{seen: map[types.Type]bool{}, leak: func(where string, n *types.TypeName) {
				leaks = append(leaks, where+": "+n.Pkg().Path()+"."+n.Name())
			}}
			for _, name := range pkg.Scope().Names() {
				obj := pkg.Scope().Lookup(name)
				if !obj.Exported() {
					continue
				}
				if tn, ok := obj.(*types.TypeName); ok && tn.IsAlias() {
					w.typ(name+" (alias)", types.Unalias(tn.Type()))
					continue
				}
				w.typ(name, obj.Type())
			}
			require.Empty(t, leaks, "exported API of %s names internal types", path)
		})
	}
}

// cmd/worker builds on worker's API: it imports neither the lock nor the
// producer.
func TestCmdWorkerBuildsOnWorker(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "github.com/orderworker/orderworker/cmd/worker").Output()
	require.NoError(t, err)
	imports := strings.Fields(string(out))
	require.Contains(t, imports, "github.com/orderworker/orderworker/worker")
	for _, banned := range []string{"github.com/orderworker/orderworker/worker/keyorder", "github.com/orderworker/orderworker/producer"} {
		require.NotContains(t, imports, banned)
	}
}

// exported returns the type information of package path, from the
// compiler's export data (go list -export: the build cache).
func exported(t *testing.T, path string) *types.Package {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", path).Output()
	require.NoError(t, err, "go list -export %s", path)
	files := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		p, f, _ := strings.Cut(line, "\t")
		files[p] = f
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(p string) (io.ReadCloser, error) { return os.Open(files[p]) })
	pkg, err := imp.Import(path)
	require.NoError(t, err)
	return pkg
}

// apiWalker visits the types an exported object shows: its type, and for
// the package's own named types, their exported fields and methods.
type apiWalker struct {
	seen map[types.Type]bool
	leak func(where string, n *types.TypeName)
}

func (w apiWalker) typ(where string, t types.Type) {
	if t == nil || w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		w.typ(where, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() == nil {
			return // error, comparable
		}
		if strings.Contains(obj.Pkg().Path(), "/internal/") || strings.HasSuffix(obj.Pkg().Path(), "/internal") {
			w.leak(where, obj)
			return
		}
		for i := range t.TypeArgs().Len() {
			w.typ(where, t.TypeArgs().At(i))
		}
		if !strings.HasPrefix(obj.Pkg().Path(), "github.com/orderworker/orderworker") {
			return // another module's type: its API is its own
		}
		for m := range t.Methods() {
			if m.Exported() {
				w.typ(where+"."+m.Name(), m.Type())
			}
		}
		w.typ(where, t.Underlying())
	case *types.Pointer:
		w.typ(where, t.Elem())
	case *types.Slice:
		w.typ(where, t.Elem())
	case *types.Array:
		w.typ(where, t.Elem())
	case *types.Map:
		w.typ(where, t.Key())
		w.typ(where, t.Elem())
	case *types.Chan:
		w.typ(where, t.Elem())
	case *types.Signature:
		for i := range t.TypeParams().Len() {
			w.typ(where, t.TypeParams().At(i).Constraint())
		}
		for v := range t.Params().Variables() {
			w.typ(where, v.Type())
		}
		for v := range t.Results().Variables() {
			w.typ(where, v.Type())
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				w.typ(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				w.typ(where+"."+m.Name(), m.Type())
			}
		}
		for e := range t.EmbeddedTypes() {
			w.typ(where, e)
		}
	case *types.TypeParam:
		w.typ(where, t.Constraint())
	}
}
