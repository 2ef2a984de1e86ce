package kindsample_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/kindsample"
	"github.com/orderworker/orderworker/tasks"
)

// The samples are the kinds' examples.
func TestSamplesAreTheKindsExamples(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		s, ok := kindsample.JSON(k)
		require.True(t, ok)
		require.Equal(t, k.Example(), s)
		p, err := kindsample.Payload(k, "ev-1", "SO1")
		require.NoError(t, err)
		require.Same(t, k, p.Kind())
		require.Equal(t, tasks.Header{EventID: "ev-1", OrderNo: "SO1"}, p.Header())
	}
	none := tasks.NewKind[tasks.ModifyPayload]("test:none", "test-none", "test_none", 1)
	_, ok := kindsample.JSON(none)
	require.False(t, ok, "a kind made without an example has no sample")
	_, err := kindsample.Payload(none, "ev-1", "SO1")
	require.ErrorIs(t, err, tasks.ErrNoExample)
}
