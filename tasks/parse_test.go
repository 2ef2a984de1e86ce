package tasks_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

func TestParseModify_Valid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want tasks.ModifyPayload
	}{
		{"address",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Address: new("1 Main St")}}},
		{"everything, any member order, white space around",
			" \n{\"changes\": {\"items\": [{\"qty\": 2, \"sku\": \"A\"}], \"remark\": \"\", \"address\": \"x\"},\n" +
				" \"order_no\": \"SO1\", \"event_id\": \"e1\"}\n\t",
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{
				Address: new("x"), Remark: new(""), Items: []tasks.Item{{SKU: "A", Qty: 2}},
			}}},
		{"null is absent",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":null,"remark":"r","items":null}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}}},
		{"escapes",
			`{"event_id":"e\u0031","order_no":"SO1","changes":{"remark":"\u5907\u6ce8 \"q\" \ud83d\ude00"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new(`备注 "q" 😀`)}}},
		{"surrogate pairs, upper and lower case",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\uD83D\uDE00\ud83d\ude00"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("😀😀")}}},
		{"an escaped backslash before u is text",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\\ud800 \\\u0041"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new(`\ud800 \A`)}}},
		{"U+FFFD itself, raw and escaped",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ufffd�"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("\ufffd\ufffd")}}},
		{"line breaks and tabs where allowed",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St\r\nSpringfield\n","remark":"a\tb\r\n"}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{
				Address: new("1 Main St\r\nSpringfield\n"), Remark: new("a\tb\r\n")}}},
		{"seq",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":1733212345678901}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}, Seq: 1733212345678901}},
		{"null seq is none",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":null}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Remark: new("r")}}},
		{"qty with exponent-free integer",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":10000}]}}`,
			tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1", Changes: tasks.Changes{Items: []tasks.Item{{SKU: "A", Qty: 10000}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tasks.Parse[tasks.ModifyPayload]([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseExchange_Valid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want tasks.ExchangePayload
	}{
		{"items only",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}]}`,
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}}},
		{"everything",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1},{"sku":"B","qty":3}],"new_order_no":"SO2","reason":"size"}`,
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 3}},
				NewOrderNo: "SO2", Reason: "size"}},
		{"null optional fields",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":null,"reason":null}`,
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tasks.Parse[tasks.ExchangePayload]([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// Errors where one field is at fault: they name it.
func TestParseModify_FieldErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		field string
		msg   string
	}{
		{"unknown top-level field",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"priority":1}`,
			"priority", "unknown field"},
		{"unknown nested field",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r","colour":"red"}}`,
			"changes.colour", "unknown field"},
		{"unknown item field",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1},{"sku":"B","qty":1,"price":3}]}}`,
			"changes.items[1].price", "unknown field"},
		{"field names are case-sensitive",
			`{"event_id":"e1","ORDER_NO":"SO1","changes":{"remark":"r"}}`,
			"ORDER_NO", "unknown field"},
		{"odd field name is quoted",
			`{"event_id":"e1","order no":"SO1"}`,
			`"order no"`, "unknown field"},
		{"repeated field",
			`{"event_id":"e1","order_no":"SO1","order_no":"SO2","changes":{"remark":"r"}}`,
			"order_no", "repeated field"},
		{"order no is a number",
			`{"event_id":"e1","order_no":123,"changes":{"remark":"r"}}`,
			"order_no", "must be a string, got number"},
		{"changes is a string",
			`{"event_id":"e1","order_no":"SO1","changes":"address"}`,
			"changes", "must be an object, got string"},
		{"address is an object",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":{}}}`,
			"changes.address", "must be a string, got object"},
		{"items is an object",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":{"sku":"A"}}}`,
			"changes.items", "must be an array, got object"},
		{"item is a string",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":["A"]}}`,
			"changes.items[0]", "must be an object, got string"},
		{"qty is a string",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":"2"}]}}`,
			"changes.items[0].qty", "must be an integer, got string"},
		{"qty is a boolean",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":true}]}}`,
			"changes.items[0].qty", "must be an integer, got boolean"},
		{"qty is a fraction",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1.5}]}}`,
			"changes.items[0].qty", "must be an integer between 1 and 10000, got 1.5"},
		{"qty has an exponent",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1e2}]}}`,
			"changes.items[0].qty", "must be an integer between 1 and 10000, got 1e2"},
		{"qty overflows",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":123456789012345678901234567890}]}}`,
			"changes.items[0].qty", "must be an integer between 1 and 10000, got 123456789012345678901234..."},
		{"qty out of range",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":0}]}}`,
			"changes.items[0].qty", "must be between 1 and 10000, got 0"},
		{"missing qty",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A"}]}}`,
			"changes.items[0].qty", "must be between 1 and 10000, got 0"},
		{"too many items",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[` + strings.Repeat(`{"sku":"A","qty":1},`, 100) + `{"sku":"A","qty":1}]}}`,
			"changes.items", "must have at most 100 entries, got 101"},
		{"empty items",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[]}}`,
			"changes.items", "must have at least 1 entry"},
		{"no changes",
			`{"event_id":"e1","order_no":"SO1","changes":{}}`,
			"changes", "must set at least one of address, remark and items"},
		{"null changes",
			`{"event_id":"e1","order_no":"SO1","changes":null}`,
			"changes", "must set at least one of address, remark and items"},
		{"seq zero",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":0}`,
			"seq", "must be an integer from 1 to 9007199254740991, got 0"},
		{"seq negative",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":-7}`,
			"seq", "must be an integer from 1 to 9007199254740991, got -7"},
		{"seq a fraction",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":1.5}`,
			"seq", "must be an integer from 1 to 9007199254740991, got 1.5"},
		{"seq overflows",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":9223372036854775808}`,
			"seq", "must be an integer from 1 to 9007199254740991, got 9223372036854775808"},
		{"seq past 2^53-1",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":9007199254740993}`,
			"seq", "must be an integer from 1 to 9007199254740991, got 9007199254740993"},
		{"seq a string",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"seq":"1"}`,
			"seq", "must be an integer, got string"},
		{"repeated nested field",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1,"qty":2}]}}`,
			"changes.items[0].qty", "repeated field"},
		{"odd nested field name is quoted",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1,"~p/q":2}]}}`,
			`changes.items[0]."~p/q"`, "unknown field"},
		{"missing event id",
			`{"order_no":"SO1","changes":{"remark":"r"}}`,
			"event_id", "required"},
		{"null event id",
			`{"event_id":null,"order_no":"SO1","changes":{"remark":"r"}}`,
			"event_id", "required"},
		{"empty object",
			`{}`,
			"event_id", "required"},
		// encoding/json would turn a lone surrogate into U+FFFD silently.
		{"lone high surrogate",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ud800"}}`,
			"changes.remark", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"lone low surrogate",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St \udc00"}}`,
			"changes.address", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"high surrogate before a letter",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\uD83Dx"}}`,
			"changes.remark", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"two high surrogates",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ud83d\ud83d\ude00"}}`,
			"changes.remark", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"surrogates in the wrong order",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ude00\ud83d"}}`,
			"changes.remark", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"lone surrogate in a sku",
			`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A\udbff","qty":1}]}}`,
			"changes.items[0].sku", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"lone surrogate in the event id",
			`{"event_id":"e\ud800","order_no":"SO1","changes":{"remark":"r"}}`,
			"event_id", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"escaped NUL",
			`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\u0000"}}`,
			"changes.remark", `must not contain control characters other than line breaks (\n or \r\n) and tabs, got U+0000 at byte 0`},
		{"escaped tab in the address",
			`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St\t"}}`,
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+0009 at byte 9`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tasks.Parse[tasks.ModifyPayload]([]byte(tt.in))
			require.Error(t, err)
			assert.Equal(t, tt.field+": "+tt.msg, err.Error())
			assert.ErrorIs(t, err, tasks.ErrInvalid)
			assert.ErrorIs(t, err, asynq.SkipRetry)
			var fe *tasks.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.field, fe.Field)
		})
	}
}

func TestParseExchange_FieldErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		field string
		msg   string
	}{
		{"unknown field",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"changes":{}}`,
			"changes", "unknown field"},
		{"missing items",
			`{"event_id":"e1","order_no":"SO1"}`,
			"items", "required"},
		{"null items",
			`{"event_id":"e1","order_no":"SO1","items":null}`,
			"items", "required"},
		{"empty items",
			`{"event_id":"e1","order_no":"SO1","items":[]}`,
			"items", "must have at least 1 entry"},
		{"lone surrogate in the reason",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"reason":"\udfff"}`,
			"reason", `must not contain a lone UTF-16 surrogate (\ud800 to \udfff without its pair)`},
		{"reason is a number",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"reason":5}`,
			"reason", "must be a string, got number"},
		{"new order no is an array",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":["SO2"]}`,
			"new_order_no", "must be a string, got array"},
		{"new order no equals order no",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":"SO1"}`,
			"new_order_no", "must differ from order_no"},
		{"qty is negative",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1},{"sku":"B","qty":-3}]}`,
			"items[1].qty", "must be between 1 and 10000, got -3"},
		{"seq zero",
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"seq":0}`,
			"seq", "must be an integer from 1 to 9007199254740991, got 0"},
		{"null item",
			`{"event_id":"e1","order_no":"SO1","items":[null]}`,
			"items[0].sku", "required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tasks.Parse[tasks.ExchangePayload]([]byte(tt.in))
			require.Error(t, err)
			assert.Equal(t, tt.field+": "+tt.msg, err.Error())
			assert.ErrorIs(t, err, tasks.ErrInvalid)
			assert.ErrorIs(t, err, asynq.SkipRetry)
			var fe *tasks.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.field, fe.Field)
		})
	}
}

// Errors in the payload as a whole: no field to name.
func TestParse_PayloadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		msg  string
	}{
		{"empty", ``, "invalid JSON: unexpected end of input"},
		{"white space only", " \n", "invalid JSON: unexpected end of input"},
		{"truncated", `{"event_id":"e1"`, "invalid JSON: unexpected end of input"},
		{"truncated in a string", `{"event_id":"e`, "invalid JSON: unexpected end of input"},
		{"not JSON", `event_id=e1`, "invalid JSON at offset 0: invalid character 'e' at start of value"},
		{"missing comma", `{"event_id":"e1" "order_no":"SO1"}`,
			"invalid JSON at offset 17: invalid character '\"' after object value (expecting ',' or '}')"},
		{"array", `[]`, "payload must be a JSON object, got array"},
		{"string", `"x"`, "payload must be a JSON object, got string"},
		{"null", `null`, "payload must be a JSON object, got null"},
		{"trailing object", `{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"}}{}`,
			"invalid JSON: data after the payload object at offset 59"},
		{"trailing garbage", `{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"}} x`,
			"invalid JSON: data after the payload object at offset 60"},
		{"invalid UTF-8", "{\"event_id\":\"e1\",\"order_no\":\"SO1\",\"changes\":{\"remark\":\"\xff\"}}",
			"payload is not valid UTF-8"},
		{"too large", `{"changes":{"remark":"` + strings.Repeat("r", tasks.MaxPayloadBytes) + `"}}`,
			"payload is larger than 262144 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tasks.Parse[tasks.ModifyPayload]([]byte(tt.in))
			require.Error(t, err)
			assert.Equal(t, tt.msg, err.Error())
			assert.ErrorIs(t, err, tasks.ErrInvalid)
			assert.ErrorIs(t, err, asynq.SkipRetry)
			var fe *tasks.FieldError
			assert.False(t, errors.As(err, &fe), "no field is at fault")

			_, err = tasks.Parse[tasks.ExchangePayload]([]byte(tt.in))
			assert.ErrorIs(t, err, tasks.ErrInvalid)
		})
	}
}

// A payload that decodes but breaks a rule comes back with the error, so the
// caller can log its event_id.
func TestParseModify_ReturnsPayloadWithValidationError(t *testing.T) {
	t.Parallel()
	p, err := tasks.Parse[tasks.ModifyPayload]([]byte(`{"event_id":"e1","order_no":"SO 1","changes":{"remark":"r"}}`))
	require.ErrorIs(t, err, tasks.ErrInvalid)
	assert.Equal(t, "e1", p.EventID)

	p, err = tasks.Parse[tasks.ModifyPayload]([]byte(`{"event_id":"e1","order_no":7}`))
	require.ErrorIs(t, err, tasks.ErrInvalid)
	assert.Zero(t, p, "a JSON error gives the zero value")
}
