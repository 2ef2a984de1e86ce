package tasks_test

import (
	"encoding/json"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// seeds are payloads of both types, valid and not, so that each fuzzer starts
// from its own shape and from the other's.
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
}

func FuzzParseModify(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := tasks.ParseModify(b)
		if err != nil {
			require.ErrorIs(t, err, tasks.ErrInvalid)
			require.ErrorIs(t, err, asynq.SkipRetry)
			return
		}
		require.NoError(t, p.Validate())

		// What the strict parser accepts, the standard decoder reads the same.
		var std tasks.ModifyPayload
		require.NoError(t, json.Unmarshal(b, &std))
		assert.Equal(t, p, std)

		// Round trip through the constructor.
		task, err := tasks.NewModifyTask(p)
		require.NoError(t, err)
		again, err := tasks.ParseModify(task.Payload())
		require.NoError(t, err)
		require.Equal(t, p, again)
		enc, err := json.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, task.Payload(), enc, "the encoding is deterministic")
	})
}

func FuzzParseExchange(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := tasks.ParseExchange(b)
		if err != nil {
			require.ErrorIs(t, err, tasks.ErrInvalid)
			require.ErrorIs(t, err, asynq.SkipRetry)
			return
		}
		require.NoError(t, p.Validate())

		var std tasks.ExchangePayload
		require.NoError(t, json.Unmarshal(b, &std))
		assert.Equal(t, p, std)

		task, err := tasks.NewExchangeTask(p)
		require.NoError(t, err)
		again, err := tasks.ParseExchange(task.Payload())
		require.NoError(t, err)
		require.Equal(t, p, again)
		enc, err := json.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, task.Payload(), enc, "the encoding is deterministic")
	})
}
