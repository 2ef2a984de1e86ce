package keyorder_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The engine knows keys, not orders: of this module, it builds on the
// packages below it only (asynq's layout, the notice fan-out, tracing,
// the replicas' WAIT, the context key it shares with keyordertest),
// never on the order domain above it (tasks, producer, worker, the stores).
func TestTheEngineImportsNothingOfTheOrderDomain(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/orderworker/orderworker/worker/keyorder").Output()
	require.NoError(t, err)
	const module = "github.com/orderworker/orderworker/"
	var ours []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, module) {
			ours = append(ours, strings.TrimPrefix(p, module))
		}
	}
	slices.Sort(ours)
	require.Equal(t, []string{"internal/notice", "internal/replwait", "internal/tracing", "worker/keyorder",
		"worker/keyorder/internal/asynqwire", "worker/keyorder/internal/lockhook", "worker/keyorder/internal/runctx"}, ours)
}

// The engine owns asynq's private layout: of the module's packages, tests
// included, only the engine's own tree imports it (Go's internal rule
// says so at build time; this names the rule). Everything else reads
// asynq's data through the engine's API, its public face
// worker/keyorder/asynqredis included.
func TestOnlyTheEngineImportsAsynqsLayout(t *testing.T) {
	t.Parallel()
	const module = "github.com/orderworker/orderworker/"
	const layout = module + "worker/keyorder/internal/asynqwire"
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}",
		module+"...").Output()
	require.NoError(t, err)
	var importers []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 && slices.Contains(f[1:], layout) {
			importers = append(importers, strings.TrimPrefix(f[0], module))
		}
	}
	require.NotEmpty(t, importers, "the engine imports its layout")
	for _, p := range importers {
		require.True(t, p == "worker/keyorder" || strings.HasPrefix(p, "worker/keyorder/"), "%s imports asynq's layout", p)
	}
}
