package benchkit

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// TestOrderNosOnEveryMaster puts an order on each master of a Cluster: a
// SCAN through the cluster client would see one master's only.
func TestOrderNosOnEveryMaster(t *testing.T) {
	t.Parallel()
	db := redistest.NewCluster(t)
	nos := db.Cluster.OnEachMaster(func(i int) string { return fmt.Sprintf("SO%d", i) })
	for _, no := range nos {
		require.NoError(t, db.Client.HSet(t.Context(), db.Prefix+"order:{"+no+"}", "no", no).Err())
		require.NoError(t, db.Client.Set(t.Context(), db.Prefix+"order:{"+no+"}:history", "x", 0).Err())
	}
	got, err := OrderNos(t.Context(), db.Client, db.Prefix)
	require.NoError(t, err)
	require.Equal(t, slices.Sorted(slices.Values(nos)), got)

	keys, err := ScanKeys(t.Context(), db.Client, db.Prefix+"order:{*}:history")
	require.NoError(t, err)
	require.Len(t, keys, len(nos))
}

func TestOrderNosOnOneNode(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	for _, no := range []string{"SO2", "SO1"} {
		require.NoError(t, db.Client.HSet(t.Context(), db.Prefix+"order:{"+no+"}", "no", no).Err())
	}
	got, err := OrderNos(t.Context(), db.Client, db.Prefix)
	require.NoError(t, err)
	require.Equal(t, []string{"SO1", "SO2"}, got)
}
