package tasks_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// seeds are payloads of both types, valid and not, so that each kind is
// fuzzed from its own shape and from the others'.
var seeds = []string{
	`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":""}}`,
	`{"event_id":"0190f8a2-5b7e-7c3d-9a41-2f6e8b1c0d3e","order_no":"SO_1-a","changes":{"address":"x","remark":"备注","items":[{"sku":"A","qty":1},{"sku":"B","qty":10000}]}}`,
	`{"changes":{"items":[{"qty":2,"sku":"货"}]},"order_no":"SO1","event_id":"crm:7/v3"}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"address":null,"remark":"\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t"}}`,
	` {"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1}]}} ` + "\n",
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}]}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}],"new_order_no":"SO2","reason":"wrong size"}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":null,"reason":null}`,
	`{"event_id":"e1","order_no":"SO1","changes":{}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"items":[]}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1.5}]}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":-0}]}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1e3}]}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"items":[{"sku":"A","qty":1},{"sku":"A","qty":1}]}}`,
	`{"event_id":"e1","order_no":"SO1","order_no":"SO2","changes":{"remark":"r"}}`,
	`{"event_id":"e1","Order_No":"SO1","changes":{"remark":"r"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"x":1}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"}}{}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":"SO1"}`,
	`{"event_id":"e 1","order_no":"SO:1","items":[null,"A",1,true,{}]}`,
	`{"event_id":"e1","order_no":"SO1","changes":"x"}`,
	`[{"event_id":"e1"}]`,
	`null`,
	`{`,
	``,
	"{\"event_id\":\"e1\",\"order_no\":\"SO1\",\"changes\":{\"remark\":\"\xff\"}}",
	// Lone surrogates, which encoding/json would turn into U+FFFD, next to
	// pairs, escaped backslashes and U+FFFD itself.
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ud800"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"address":"x\udc00","remark":"\uD83D\uDE00"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"\ud83d\ud83d\ude00 \\ud800 \ufffd"}}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"\udbff\udfff","qty":1}],"reason":"\ud800x"}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"reason":"\ude00\ud83d"}`,
	// Control characters: line breaks and (outside the address) tabs are
	// text, the rest is refused.
	`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St\r\nSpringfield","remark":"a\tb\nc\r\n"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St\u0000"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St\tSpringfield"}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"a\rb\u001b[2J\u007f\u0085"}}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"reason":"size\r"}`,
	// Event IDs a URL would read as something else.
	`{"event_id":"../pending_tasks:delete_all","order_no":"SO1","changes":{"remark":"r"}}`,
	`{"event_id":"crm:order-7:v3.1","order_no":"SO1","items":[{"sku":"A","qty":1}]}`,
	// Trace contexts: valid, at the field's place before seq or anywhere,
	// and not (an unknown member, a control character, a wrong type).
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"vendor=x"},"seq":1733212345678901}`,
	`{"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}]}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":{"traceparent":"garbage","tracestate":null}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":{"traceparent":"00-x","baggage":"k=v"}}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"trace":{"traceparent":"00\r\nx"}}`,
	`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"trace":{}}`,
	`{"event_id":"e1","order_no":"SO1","changes":{"remark":"r"},"trace":"00-x"}`,
}

// requireNoReplacement fails if an accepted payload's texts hold U+FFFD that
// the input did not: a lone surrogate replaced without a word.
func requireNoReplacement(t *testing.T, b []byte, texts []string) {
	t.Helper()
	if bytes.ContainsRune(b, utf8.RuneError) || bytes.Contains(bytes.ToLower(b), []byte(`\ufffd`)) {
		return
	}
	for _, s := range texts {
		require.NotContains(t, s, string(utf8.RuneError), "U+FFFD that the input did not have: %q", b)
	}
}

// texts returns every string a payload holds, however deep, for
// requireNoReplacement: it goes over the payload's JSON, so that it reads
// every kind the same way.
func texts(t *testing.T, p tasks.Payload) []string {
	t.Helper()
	b, err := json.Marshal(p)
	require.NoError(t, err)
	var v any
	require.NoError(t, json.Unmarshal(b, &v))
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, v)
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// FuzzParse feeds each input to every kind of the table, through the
// generic decoder (tasks.Kind.Parse), so that a kind added to the table is
// fuzzed with no change here.
func FuzzParse(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range tasks.Kinds() {
			p, err := k.Parse(b)
			if err != nil {
				require.ErrorIs(t, err, tasks.ErrInvalid, k.Type)
				require.ErrorIs(t, err, asynq.SkipRetry, k.Type)
				continue
			}
			require.NoError(t, p.Validate())
			require.Same(t, k, p.Kind())
			requireNoReplacement(t, b, texts(t, p))

			// What the strict parser accepts, the standard decoder reads the same.
			std := reflect.New(reflect.TypeOf(p))
			require.NoError(t, json.Unmarshal(b, std.Interface()), k.Type)
			assert.Equal(t, p, std.Elem().Interface(), k.Type)

			// Round trip through the constructor.
			task, err := tasks.NewTask(p)
			require.NoError(t, err)
			require.Equal(t, k.Type, task.Type())
			again, err := k.Parse(task.Payload())
			require.NoError(t, err)
			require.Equal(t, p, again)
			enc, err := tasks.Marshal(again)
			require.NoError(t, err)
			require.Equal(t, task.Payload(), enc, "the encoding is deterministic")
		}
	})
}
