package asynqwire

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// FuzzDecodeTaskMessage feeds arbitrary bytes, and well-formed messages,
// to the two readers of asynq's TaskMessage and to rewrite: none panics,
// both read the same type and payload, and a rewritten message keeps them
// and reads back the fields it set.
func FuzzDecodeTaskMessage(f *testing.F) {
	msg := func(typ string, payload []byte, retry, retried uint64) []byte {
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, typ)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, payload)
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, retry)
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, retried)
		b = protowire.AppendTag(b, 10, protowire.Fixed64Type) // a field of another wire type
		return protowire.AppendFixed64(b, 7)
	}
	f.Add(msg("order:modify", []byte(`{"event_id":"e"}`), 3, 1))
	f.Add(msg("", nil, 0, 0))
	f.Add([]byte{0x0a, 0xff}) // a truncated length
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := decodeClaimed(b)
		var s SetTask
		decodeMessage(b, &s)
		if c.Type != s.Type || !bytes.Equal(c.Payload, s.Payload) {
			t.Fatalf("the readers disagree: %q %q / %q %q", c.Type, c.Payload, s.Type, s.Payload)
		}
		if c.Retried != s.Retried || c.MaxRetry != s.Retry {
			t.Fatalf("the readers disagree on the retries: %d/%d %d/%d", c.Retried, c.MaxRetry, s.Retried, s.Retry)
		}
		if !wellFormed(b) {
			return // rewrite keeps a malformed tail as it is: nothing after it reads
		}
		out := rewrite(b, map[protowire.Number]any{6: int64(5), 7: "boom"})
		r := decodeClaimed(out)
		var rs SetTask
		decodeMessage(out, &rs)
		if r.Retried != 5 || rs.ErrorMsg != "boom" {
			t.Fatalf("rewrite: retried %d, error %q", r.Retried, rs.ErrorMsg)
		}
		if r.Type != c.Type || !bytes.Equal(r.Payload, c.Payload) {
			t.Fatalf("rewrite lost the type or payload: %q %q -> %q %q", c.Type, c.Payload, r.Type, r.Payload)
		}
	})
}

// wellFormed reports whether b is a sequence of well-formed fields.
func wellFormed(b []byte) bool {
	for len(b) > 0 {
		_, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}
