package intake

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		values  []string
		want    string
		present bool
		valid   bool
	}{
		{"absent", nil, "", false, true},
		{"bare", []string{"abc"}, "abc", true, true},
		{"quoted", []string{`"abc"`}, "abc", true, true},
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", true, true},
		{"colons and dots", []string{"crm:order-7:v3.1"}, "crm:order-7:v3.1", true, true},
		{"quoted with escapes", []string{`"a\"b\\c"`}, "", false, false},
		{"a lone quote", []string{`"`}, "", false, false},
		{"dot segments", []string{"../pending_tasks:delete_all"}, "", false, false},
		{"quoted dot segments", []string{`"../pending_tasks:delete_all"`}, "", false, false},
		{"slash", []string{"crm/7"}, "", false, false},
		{"percent", []string{"crm%2F7"}, "", false, false},
		{"empty", []string{""}, "", false, false},
		{"empty quoted", []string{`""`}, "", false, false},
		{"space", []string{"a b"}, "", false, false},
		{"quoted space", []string{`"a b"`}, "", false, false},
		{"bad escape", []string{`"a\b"`}, "", false, false},
		{"escaped closing quote", []string{`"a\"`}, "", false, false},
		{"inner quote", []string{`"a"b"`}, "", false, false},
		{"twice", []string{"a", "a"}, "", false, false},
		{"non-ASCII", []string{"ключ"}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, present, aerr := idempotencyKey(tt.values)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.present, present)
			assert.Equal(t, tt.valid, aerr == nil, "%+v", aerr)
		})
	}
}

// checkDecoded checks the invariants of a decoder's outcome: an error is a
// well-formed 400; a payload is valid, for the path's order, with the
// header's event ID when one is given, and survives a round trip.
func checkDecoded(t *testing.T, k *tasks.Kind, orderNo string, keys []string, p tasks.Payload, aerr *apiError) {
	t.Helper()
	if aerr != nil {
		require.Equal(t, http.StatusBadRequest, aerr.status)
		require.True(t, slices.Contains([]string{codeMalformedBody, codeInvalidField, codeInvalidParameter, codeKeyRequired, codeKeyMismatch}, aerr.code), aerr.code)
		require.NotEmpty(t, aerr.message)
		if aerr.code != codeMalformedBody {
			require.NotEmpty(t, aerr.field, aerr.message)
		}
		return
	}
	require.NoError(t, p.Validate())
	require.Equal(t, k, p.Kind())
	h := p.Header()
	require.Equal(t, orderNo, h.OrderNo)
	require.Zero(t, h.Seq)
	if len(keys) == 1 {
		key, _, kerr := idempotencyKey(keys)
		require.Nil(t, kerr)
		require.Equal(t, key, h.EventID)
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	back, err := k.Parse(b)
	require.NoError(t, err)
	require.Equal(t, p, back)
}

// keysOf turns a fuzzed header into its values: absent when empty.
func keysOf(key string, twice bool) []string {
	switch {
	case key == "" && !twice:
		return nil
	case twice:
		return []string{key, key}
	}
	return []string{key}
}

func FuzzDecodeModifyRequest(f *testing.F) {
	f.Add("SO1", "evt-1", false, []byte(modifyBody))
	f.Add("SO1", "", false, []byte(`{"event_id":"e","order_no":"SO1","changes":{"remark":""}}`))
	f.Add("SO1", `"e\"1"`, false, []byte(`{"event_id":"e\"1","changes":{"items":[{"sku":"Ä","qty":10000}]}}`))
	f.Add("SO-1_a", "k", true, []byte(`{"changes":{"address":null,"remark":"x"}}`))
	f.Add("SO1", "evt", false, []byte(`{"changes":{"items":[{"sku":"A","qty":1e2}]}}`))
	f.Add("S O", "e", false, []byte(`{"changes":{"remark":"x"}} x`))
	f.Add("SO1", "e", false, []byte("{\"changes\":{\"remark\":\"\xff\"}}"))
	f.Fuzz(func(t *testing.T, orderNo, key string, twice bool, body []byte) {
		keys := keysOf(key, twice)
		p, aerr := decodePayload(tasks.Modify, orderNo, keys, body)
		checkDecoded(t, tasks.Modify, orderNo, keys, p, aerr)
	})
}

func FuzzDecodeExchangeRequest(f *testing.F) {
	f.Add("SO1", "evt-1", false, []byte(exchangeBody))
	f.Add("SO1", "", false, []byte(`{"event_id":"e","items":[{"sku":"A","qty":1}]}`))
	f.Add("SO1", "e", false, []byte(`{"items":[{"sku":"A","qty":1}],"new_order_no":"SO1"}`))
	f.Add("SO1", "e", false, []byte(`{"items":[],"reason":null}`))
	f.Add("SO1", "e", true, []byte(`{"order_no":"SO1","items":[{"sku":"A","qty":1},{"sku":"A","qty":2}]}`))
	f.Fuzz(func(t *testing.T, orderNo, key string, twice bool, body []byte) {
		keys := keysOf(key, twice)
		p, aerr := decodePayload(tasks.Exchange, orderNo, keys, body)
		checkDecoded(t, tasks.Exchange, orderNo, keys, p, aerr)
	})
}

// TestDecodeRequest checks the decoder's choices one by one.
func TestDecodeRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		orderNo string
		keys    []string
		body    string
		wantID  string
		code    string
		field   string
	}{
		{"header key", "SO1", []string{"h"}, `{"changes":{"remark":"x"}}`, "h", "", ""},
		{"body key", "SO1", nil, `{"event_id":"b","changes":{"remark":"x"}}`, "b", "", ""},
		{"both, equal", "SO1", []string{`"b"`}, `{"event_id":"b","changes":{"remark":"x"}}`, "b", "", ""},
		{"both, different", "SO1", []string{"h"}, `{"event_id":"b","changes":{"remark":"x"}}`, "", codeKeyMismatch, "event_id"},
		{"neither", "SO1", nil, `{"changes":{"remark":"x"}}`, "", codeKeyRequired, HeaderIdempotencyKey},
		{"null body key", "SO1", nil, `{"event_id":null,"changes":{"remark":"x"}}`, "", codeKeyRequired, HeaderIdempotencyKey},
		{"body order_no equal", "SO1", []string{"h"}, `{"order_no":"SO1","changes":{"remark":"x"}}`, "h", "", ""},
		{"body order_no differs", "SO1", []string{"h"}, `{"order_no":"SO2","changes":{"remark":"x"}}`, "", codeInvalidField, "order_no"},
		{"bad path order", "SO/1", []string{"h"}, `{"changes":{"remark":"x"}}`, "", codeInvalidParameter, "order_no"},
		{"empty object", "SO1", []string{"h"}, `{}`, "", codeInvalidField, "changes"},
		{"wrong type of event_id", "SO1", []string{"h"}, `{"event_id":1,"changes":{"remark":"x"}}`, "", codeInvalidField, "event_id"},
		{"null", "SO1", []string{"h"}, `null`, "", codeMalformedBody, ""},
		{"not UTF-8", "SO1", []string{"h"}, "{\"changes\":{\"remark\":\"\xff\"}}", "", codeMalformedBody, ""},
		{"a position", "SO1", []string{"h"}, `{"changes":{"remark":"x"},"seq":7}`, "", codeInvalidField, "seq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, aerr := decodePayload(tasks.Modify, tt.orderNo, tt.keys, []byte(tt.body))
			code, field := aerr.codeAndField()
			assert.Equal(t, tt.code, code, "%+v", aerr)
			assert.Equal(t, tt.field, field)
			if tt.wantID != "" {
				assert.Equal(t, tt.wantID, p.Header().EventID)
			}
		})
	}
}

// codeAndField returns e's code and field, empty for nil.
func (e *apiError) codeAndField() (string, string) {
	if e == nil {
		return "", ""
	}
	return e.code, e.field
}
