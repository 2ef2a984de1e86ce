package tasks_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// The bytes on the wire are part of the contract: pin them.
func TestNewTask_ModifyWire(t *testing.T) {
	t.Parallel()
	p := tasks.ModifyPayload{
		EventID: "e1",
		OrderNo: "SO1",
		Changes: tasks.Changes{Address: new("1 Main St"), Remark: new(""), Items: []tasks.Item{{SKU: "A", Qty: 2}}},
	}
	task, err := tasks.NewTask(p)
	require.NoError(t, err)
	assert.Equal(t, "order:modify", task.Type())
	assert.JSONEq(t, `{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St","remark":"","items":[{"sku":"A","qty":2}]}}`,
		string(task.Payload()))
	assert.Equal(t, `{"event_id":"e1","order_no":"SO1","changes":{"address":"1 Main St","remark":"","items":[{"sku":"A","qty":2}]}}`,
		string(task.Payload()), "the encoding is compact and in field order")

	got, err := tasks.Parse[tasks.ModifyPayload](task.Payload())
	require.NoError(t, err)
	assert.Equal(t, p, got)
}

func TestNewTask_ExchangeWire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    tasks.ExchangePayload
		want string
	}{
		{"minimal",
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}},
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}]}`},
		{"full",
			tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1", Items: []tasks.Item{{SKU: "A", Qty: 1}}, NewOrderNo: "SO2", Reason: "<size> & fit"},
			`{"event_id":"e1","order_no":"SO1","items":[{"sku":"A","qty":1}],"new_order_no":"SO2","reason":"<size> & fit"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task, err := tasks.NewTask(tt.p)
			require.NoError(t, err)
			assert.Equal(t, "order:exchange", task.Type())
			assert.Equal(t, tt.want, string(task.Payload()))
			got, err := tasks.Parse[tasks.ExchangePayload](task.Payload())
			require.NoError(t, err)
			assert.Equal(t, tt.p, got)
		})
	}
}

func TestNewTask_Invalid(t *testing.T) {
	t.Parallel()
	task, err := tasks.NewTask(tasks.ModifyPayload{EventID: "e1", OrderNo: "SO1"})
	assert.Nil(t, task)
	assert.EqualError(t, err, "changes: must set at least one of address, remark and items")
	assert.ErrorIs(t, err, tasks.ErrInvalid)

	task, err = tasks.NewTask(tasks.ExchangePayload{EventID: "e1", OrderNo: "SO1"})
	assert.Nil(t, task)
	assert.EqualError(t, err, "items: required")
	assert.ErrorIs(t, err, tasks.ErrInvalid)
}

func TestNewTask_PassesOptions(t *testing.T) {
	t.Parallel()
	// Options given to the constructor travel with the task into Enqueue;
	// asynq keeps them unexported, so only check they are accepted.
	task, err := tasks.NewTask(validModify(), asynq.Queue(tasks.QueueModify), asynq.Timeout(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, tasks.TypeModify, task.Type())
}

func TestContractNames(t *testing.T) {
	t.Parallel()
	// Non-Go systems enqueue by these names; changing one breaks them.
	assert.Equal(t, "order:modify", tasks.TypeModify)
	assert.Equal(t, "order:exchange", tasks.TypeExchange)
	assert.Equal(t, "order_modify", tasks.QueueModify)
	assert.Equal(t, "order_exchange", tasks.QueueExchange)
}

func TestReplacementOrderNo(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	tests := []struct {
		name    string
		orderNo string
		prefix  string
	}{
		{"short", "SO1", "SO1-X"},
		{"fits exactly", strings.Repeat("a", 54), strings.Repeat("a", 54) + "-X"},
		{"cut to 54", strings.Repeat("b", 64), strings.Repeat("b", 54) + "-X"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tasks.ReplacementOrderNo(tt.orderNo, "evt-1")
			assert.Regexp(t, valid, got)
			assert.True(t, strings.HasPrefix(got, tt.prefix), got)
			assert.Len(t, got, len(tt.prefix)+8)
			assert.Equal(t, got, tasks.ReplacementOrderNo(tt.orderNo, "evt-1"), "deterministic")
			assert.NotEqual(t, got, tasks.ReplacementOrderNo(tt.orderNo, "evt-2"), "depends on the event")
			assert.NotEqual(t, got, tasks.ReplacementOrderNo(tt.orderNo+"_", "evt-1"), "depends on the whole order number")
		})
	}
}
