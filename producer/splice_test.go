package producer_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// TestSeqSpliceMatchesTheEncoding pins the acceptance script's splice of
// the position into the payload (it appends `,"seq":<pos>` to the JSON of
// the payload without one): for every kind, that is exactly the JSON of the
// payload with the position, which needs seq to be the last field the
// payload encodes. Moving Seq up in a payload struct fails this test.
func TestSeqSpliceMatchesTheEncoding(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		p, err := k.Decode([]byte(`{"event_id":"ev-1","order_no":"SO1"}`))
		require.NoError(t, err, k.Type)
		without, err := json.Marshal(p)
		require.NoError(t, err)
		const pos = 1796334105052270
		h := p.Header()
		h.Seq = pos
		with, err := json.Marshal(p.WithHeader(h))
		require.NoError(t, err)
		spliced := string(without[:len(without)-1]) + `,"seq":` + strconv.Itoa(pos) + `}`
		require.Equal(t, string(with), spliced, "%s: seq must be the payload's last field", k.Type)
	}
}
