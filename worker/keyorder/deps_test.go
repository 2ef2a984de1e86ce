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
	require.Equal(t, []string{"internal/asynqwire", "internal/notice", "internal/replwait", "internal/tracing", "worker/keyorder",
		"worker/keyorder/internal/lockhook", "worker/keyorder/internal/runctx"}, ours)
}
