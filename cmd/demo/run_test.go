package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestScenario runs the quick start's demo and checks that its timeline
// shows what the README promises.
func TestScenario(t *testing.T) {
	var out strings.Builder
	err := run(t.Context(), []string{"-hold", "600ms", "-work", "50ms"}, func(string) string { return "" }, &out)
	require.NoError(t, err)
	got := out.String()
	t.Log(got)
	for _, want := range []string{
		"exchange-1             waits for its turn on SO1001, after order:modify modify-1",  // the earlier modify goes first
		"modify-3               waits for its turn on SO2001, after the creation of SO2001", // the replacement's modify waits for it
		"modify-5               waits for its turn on SO1002, after order:modify modify-4",  // back to back, in order
		"woken by the notice of the change before it; applied",
		"rejected: modify SO1001: orders: order SO1001 is exchanged; its replacement is order SO2001",
		`SO1001  exchanged  v3  address="3 Quay Rd"`,                     // modify-1 applied before the exchange
		`SO2001  active  v2  address="3 Quay Rd" remark="leave at door"`, // copied, then modify-3 applied
		`SO1002  active  v4  address="9 Mill Lane" remark="gift wrap"`,   // the last address wins
	} {
		require.Contains(t, got, want)
	}
}
