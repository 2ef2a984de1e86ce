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
		"SO1001 is held by order:exchange exchange-1",                  // modifies of SO1001 wait for the exchange
		"woken by the release notice; applied",                         // SO1002's modifies hand over
		"woken by the release notice; task rejected",                   // SO1001's modifies waited for the exchange
		"its replacement is order SO2001",                              // and the rejection names the replacement
		"SO1001  exchanged",                                            // final orders
		"SO2001  active  v2",                                           // the replacement took the last modify
		`SO1002  active  v4  address="9 Mill Lane" remark="gift wrap"`, // all three modifies applied
	} {
		require.Contains(t, got, want)
	}
}
