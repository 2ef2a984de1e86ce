package kindsample_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/kindsample"
	"github.com/orderworker/orderworker/tasks"
)

// Every kind of the table has a valid sample, of its own kind.
func TestEveryKindHasASample(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		p, err := kindsample.Payload(k, "ev-1", "SO1")
		require.NoError(t, err)
		require.Same(t, k, p.Kind())
		require.Equal(t, tasks.Header{EventID: "ev-1", OrderNo: "SO1"}, p.Header())
	}
	_, ok := kindsample.JSON(tasks.NewKind[tasks.ModifyPayload]("test:none", "test-none", "test_none", 1))
	require.False(t, ok, "a kind outside the contract has no sample")
}
