package producer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// The fingerprint of a payload with HTML's characters is the SHA-256 of
// encoding/json's default (escaping) encoding, as claims recorded it before
// payloads were stored unescaped.
func TestFingerprintKeepsTheEscapedEncoding(t *testing.T) {
	t.Parallel()
	p := tasks.ModifyPayload{EventID: "e", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("a<b>&c\u2028")}}
	old, err := json.Marshal(p)
	require.NoError(t, err)
	require.Contains(t, string(old), `\u003c`)
	sum := sha256.Sum256(old)
	assert.Equal(t, hex.EncodeToString(sum[:4]), fingerprint(p))
}
