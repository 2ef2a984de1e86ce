package tasks_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

func validModify() tasks.ModifyPayload {
	return tasks.ModifyPayload{
		EventID: "evt-1",
		OrderNo: "SO123",
		Changes: tasks.Changes{Address: new("1 Main St")},
	}
}

func validExchange() tasks.ExchangePayload {
	return tasks.ExchangePayload{
		EventID: "evt-2",
		OrderNo: "SO123",
		Items:   []tasks.Item{{SKU: "SKU-1", Qty: 1}},
	}
}

// nItems returns n distinct valid items.
func nItems(n int) []tasks.Item {
	items := make([]tasks.Item, n)
	for i := range items {
		items[i] = tasks.Item{SKU: fmt.Sprintf("SKU-%03d", i), Qty: 1}
	}
	return items
}

func modifyWith(f func(*tasks.ModifyPayload)) tasks.ModifyPayload {
	p := validModify()
	f(&p)
	return p
}

func exchangeWith(f func(*tasks.ExchangePayload)) tasks.ExchangePayload {
	p := validExchange()
	f(&p)
	return p
}

func TestValidOrderNo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"simple", "SO123", true},
		{"all allowed characters", "azAZ09_-", true},
		{"one character", "a", true},
		{"64 characters", strings.Repeat("a", 64), true},
		{"empty", "", false},
		{"65 characters", strings.Repeat("a", 65), false},
		{"space", "SO 1", false},
		{"colon", "SO:1", false},
		{"brace", "SO{1}", false},
		{"non-ASCII letter", "SOé", false},
		{"NUL", "SO\x001", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tasks.ValidOrderNo(tt.in))
		})
	}
}

func TestValidEventID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"uuid", "0190f8a2-5b7e-7c3d-9a41-2f6e8b1c0d3e", true},
		{"ulid", "01ARZ3NDEKTSV4RRFFQ69G5FAV", true},
		{"colons and dots", "crm:order-7:v3.1", true},
		{"underscore", "crm_7", true},
		{"one character", "x", true},
		{"one digit", "7", true},
		{"128 characters", strings.Repeat("e", 128), true},
		{"empty", "", false},
		{"129 characters", strings.Repeat("e", 129), false},
		{"space", "evt 1", false},
		{"tab", "evt\t1", false},
		{"DEL", "evt\x7f", false},
		{"non-ASCII", "évt", false},
		// What a URL would read as something else: asynqmon pastes task
		// IDs into its API paths unescaped.
		{"dot segments", "../pending_tasks:delete_all", false},
		{"slash", "crm/7", false},
		{"query", "evt?x=1", false},
		{"fragment", "evt#1", false},
		{"percent", "evt%2F1", false},
		{"backslash", `evt\1`, false},
		{"other punctuation", `crm{"x"}~!`, false},
		{"leading dot", ".evt", false},
		{"leading hyphen", "-evt", false},
		{"leading underscore", "_evt", false},
		{"leading colon", ":evt", false},
		{"only dots", "..", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tasks.ValidEventID(tt.in))
		})
	}
}

func TestModifyPayloadValidate_Valid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    tasks.ModifyPayload
	}{
		{"address only", validModify()},
		{"remark only", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes = tasks.Changes{Remark: new("call first")}
		})},
		{"empty remark clears it", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes = tasks.Changes{Remark: new("")}
		})},
		{"items only", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes = tasks.Changes{Items: []tasks.Item{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 10000}}}
		})},
		{"everything", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes.Remark = new("备注")
			p.Changes.Items = nItems(3)
		})},
		{"every limit reached", tasks.ModifyPayload{
			EventID: strings.Repeat("e", tasks.MaxEventIDLen),
			OrderNo: strings.Repeat("o", tasks.MaxOrderNoLen),
			Changes: tasks.Changes{
				Address: new(strings.Repeat("a", tasks.MaxAddressLen)),
				Remark:  new(strings.Repeat("r", tasks.MaxRemarkLen)),
				Items: append(nItems(tasks.MaxItems-1),
					tasks.Item{SKU: strings.Repeat("货", tasks.MaxSKULen), Qty: tasks.MaxQty}),
			},
		}},
		{"multi-line address", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes.Address = new("1 Main St\nSpringfield")
		})},
		{"address with CRLF", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes.Address = new("1 Main St\r\nSpringfield\r\n")
		})},
		{"remark with tabs and line breaks", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes.Remark = new("ring twice\n\tthen wait\r\n")
		})},
		{"address with a literal U+FFFD", modifyWith(func(p *tasks.ModifyPayload) {
			p.Changes.Address = new("1 Main St \ufffd")
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, tt.p.Validate())
		})
	}
}

func TestModifyPayloadValidate_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		p     tasks.ModifyPayload
		field string
		msg   string
	}{
		{"no event id",
			modifyWith(func(p *tasks.ModifyPayload) { p.EventID = "" }),
			"event_id", "required"},
		{"event id too long",
			modifyWith(func(p *tasks.ModifyPayload) { p.EventID = strings.Repeat("e", 129) }),
			"event_id", "must be at most 128 characters, got 129"},
		{"event id with space",
			modifyWith(func(p *tasks.ModifyPayload) { p.EventID = "evt 1" }),
			"event_id", `must be ` + tasks.EventIDRule + `, got "evt 1"`},
		{"event id with a path",
			modifyWith(func(p *tasks.ModifyPayload) { p.EventID = "../pending_tasks:delete_all" }),
			"event_id", `must be ` + tasks.EventIDRule + `, got "../pending_tasks:delete_all"`},
		{"no order no",
			modifyWith(func(p *tasks.ModifyPayload) { p.OrderNo = "" }),
			"order_no", "required"},
		{"order no too long",
			modifyWith(func(p *tasks.ModifyPayload) { p.OrderNo = strings.Repeat("o", 65) }),
			"order_no", "must be at most 64 characters, got 65"},
		{"order no with colon",
			modifyWith(func(p *tasks.ModifyPayload) { p.OrderNo = "SO:1" }),
			"order_no", `must contain only A-Z, a-z, 0-9, '_' and '-', got "SO:1"`},
		{"long bad order no is cut short",
			modifyWith(func(p *tasks.ModifyPayload) { p.OrderNo = strings.Repeat("é", 30) }),
			"order_no", `must contain only A-Z, a-z, 0-9, '_' and '-', got "` + strings.Repeat("é", 20) + `"...`},
		{"no changes",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes = tasks.Changes{} }),
			"changes", "must set at least one of address, remark and items"},
		{"empty address",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("") }),
			"changes.address", "must not be blank"},
		{"blank address",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new(" \t\n") }),
			"changes.address", "must not be blank"},
		{"address too long",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new(strings.Repeat("a", 513)) }),
			"changes.address", "must be at most 512 bytes, got 513"},
		{"address not UTF-8",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("Main St \xff") }),
			"changes.address", "must be valid UTF-8"},
		{"address with NUL",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main St\x00") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+0000 at byte 9`},
		{"address with a tab",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main St\tSpringfield") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+0009 at byte 9`},
		{"address with a lone CR",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main St\rSpringfield") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+000D at byte 9`},
		{"address ending in CR",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main St\r") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+000D at byte 9`},
		{"address with a terminal escape",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("\x1b[2J1 Main St") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+001B at byte 0`},
		{"address with DEL",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main\x7f St") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+007F at byte 6`},
		{"address with a C1 control",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Address = new("1 Main\u0085St") }),
			"changes.address", `must not contain control characters other than line breaks (\n or \r\n), got U+0085 at byte 6`},
		{"remark with NUL",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Remark = new("call\x00") }),
			"changes.remark", `must not contain control characters other than line breaks (\n or \r\n) and tabs, got U+0000 at byte 4`},
		{"remark with a lone CR",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Remark = new("call\rfirst") }),
			"changes.remark", `must not contain control characters other than line breaks (\n or \r\n) and tabs, got U+000D at byte 4`},
		{"remark with a bell",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Remark = new("\a") }),
			"changes.remark", `must not contain control characters other than line breaks (\n or \r\n) and tabs, got U+0007 at byte 0`},
		{"remark too long",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Remark = new(strings.Repeat("r", 1025)) }),
			"changes.remark", "must be at most 1024 bytes, got 1025"},
		{"remark not UTF-8",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Remark = new("\xc3") }),
			"changes.remark", "must be valid UTF-8"},
		{"empty items",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{} }),
			"changes.items", "must have at least 1 entry"},
		{"too many items",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = nItems(101) }),
			"changes.items", "must have at most 100 entries, got 101"},
		{"item without sku",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{Qty: 1}} }),
			"changes.items[0].sku", "required"},
		{"blank sku",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{SKU: " ", Qty: 1}} }),
			"changes.items[0].sku", "must not be blank"},
		{"sku too long",
			modifyWith(func(p *tasks.ModifyPayload) {
				p.Changes.Items = []tasks.Item{{SKU: strings.Repeat("货", 65), Qty: 1}}
			}),
			"changes.items[0].sku", "must be at most 64 characters, got 65"},
		{"sku with control character",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{SKU: "A\nB", Qty: 1}} }),
			"changes.items[0].sku", `must not contain control characters, got "A\nB"`},
		{"sku not UTF-8",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{SKU: "\xff", Qty: 1}} }),
			"changes.items[0].sku", "must be valid UTF-8"},
		{"duplicate sku",
			modifyWith(func(p *tasks.ModifyPayload) {
				p.Changes.Items = []tasks.Item{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}, {SKU: "A", Qty: 2}}
			}),
			"changes.items[2].sku", `duplicate of changes.items[0].sku "A"`},
		{"qty zero",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = nItems(3); p.Changes.Items[2].Qty = 0 }),
			"changes.items[2].qty", "must be between 1 and 10000, got 0"},
		{"qty negative",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{SKU: "A", Qty: -1}} }),
			"changes.items[0].qty", "must be between 1 and 10000, got -1"},
		{"qty too large",
			modifyWith(func(p *tasks.ModifyPayload) { p.Changes.Items = []tasks.Item{{SKU: "A", Qty: 10001}} }),
			"changes.items[0].qty", "must be between 1 and 10000, got 10001"},
		{"first problem wins",
			tasks.ModifyPayload{OrderNo: "bad no"},
			"event_id", "required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			require.Error(t, err)
			assert.Equal(t, tt.field+": "+tt.msg, err.Error())
			assert.ErrorIs(t, err, tasks.ErrInvalid)
			assert.ErrorIs(t, err, asynq.SkipRetry)
			var fe *tasks.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.field, fe.Field)
			assert.Equal(t, tt.msg, fe.Msg)
		})
	}
}

func TestExchangePayloadValidate_Valid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    tasks.ExchangePayload
	}{
		{"items only", validExchange()},
		{"new order no and reason", exchangeWith(func(p *tasks.ExchangePayload) {
			p.NewOrderNo = "SO123-X1"
			p.Reason = "wrong size"
		})},
		{"reason with tabs and line breaks", exchangeWith(func(p *tasks.ExchangePayload) {
			p.Reason = "wrong size:\n\tM, not L\r\n"
		})},
		{"every limit reached", tasks.ExchangePayload{
			EventID:    strings.Repeat("e", tasks.MaxEventIDLen),
			OrderNo:    strings.Repeat("o", tasks.MaxOrderNoLen),
			Items:      nItems(tasks.MaxItems),
			NewOrderNo: strings.Repeat("n", tasks.MaxOrderNoLen),
			Reason:     strings.Repeat("r", tasks.MaxReasonLen),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, tt.p.Validate())
		})
	}
}

func TestExchangePayloadValidate_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		p     tasks.ExchangePayload
		field string
		msg   string
	}{
		{"no event id",
			exchangeWith(func(p *tasks.ExchangePayload) { p.EventID = "" }),
			"event_id", "required"},
		{"bad order no",
			exchangeWith(func(p *tasks.ExchangePayload) { p.OrderNo = "SO 1" }),
			"order_no", `must contain only A-Z, a-z, 0-9, '_' and '-', got "SO 1"`},
		{"no items",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items = nil }),
			"items", "required"},
		{"empty items",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items = []tasks.Item{} }),
			"items", "must have at least 1 entry"},
		{"too many items",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items = nItems(101) }),
			"items", "must have at most 100 entries, got 101"},
		{"item without sku",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items = append(nItems(1), tasks.Item{Qty: 1}) }),
			"items[1].sku", "required"},
		{"qty zero",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items[0].Qty = 0 }),
			"items[0].qty", "must be between 1 and 10000, got 0"},
		{"duplicate sku",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Items = append(p.Items, p.Items[0]) }),
			"items[1].sku", `duplicate of items[0].sku "SKU-1"`},
		{"bad new order no",
			exchangeWith(func(p *tasks.ExchangePayload) { p.NewOrderNo = "SO/2" }),
			"new_order_no", `must contain only A-Z, a-z, 0-9, '_' and '-', got "SO/2"`},
		{"new order no too long",
			exchangeWith(func(p *tasks.ExchangePayload) { p.NewOrderNo = strings.Repeat("n", 65) }),
			"new_order_no", "must be at most 64 characters, got 65"},
		{"new order no same as order no",
			exchangeWith(func(p *tasks.ExchangePayload) { p.NewOrderNo = p.OrderNo }),
			"new_order_no", "must differ from order_no"},
		{"reason too long",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Reason = strings.Repeat("r", 257) }),
			"reason", "must be at most 256 bytes, got 257"},
		{"reason with NUL",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Reason = "size\x00" }),
			"reason", `must not contain control characters other than line breaks (\n or \r\n) and tabs, got U+0000 at byte 4`},
		{"reason not UTF-8",
			exchangeWith(func(p *tasks.ExchangePayload) { p.Reason = "\xed\xa0\x80" }),
			"reason", "must be valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			require.Error(t, err)
			assert.Equal(t, tt.field+": "+tt.msg, err.Error())
			assert.ErrorIs(t, err, tasks.ErrInvalid)
			assert.ErrorIs(t, err, asynq.SkipRetry)
			var fe *tasks.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.field, fe.Field)
			assert.Equal(t, tt.msg, fe.Msg)
		})
	}
}

// A handler that wraps a validation error keeps asynq from retrying the task.
func TestFieldErrorWrapped(t *testing.T) {
	t.Parallel()
	p := validExchange()
	p.Items = nil
	wrapped := fmt.Errorf("handle %s: %w", tasks.TypeExchange, p.Validate())
	assert.ErrorIs(t, wrapped, asynq.SkipRetry)
	assert.ErrorIs(t, wrapped, tasks.ErrInvalid)
	assert.NotErrorIs(t, tasks.ErrInvalid, asynq.SkipRetry, "the sentinel itself stays plain")
}

// TestEventIDRuleStatesTheLimit keeps the rule's words in step with the
// constant.
func TestEventIDRuleStatesTheLimit(t *testing.T) {
	t.Parallel()
	assert.Contains(t, tasks.EventIDRule, "1 to "+strconv.Itoa(tasks.MaxEventIDLen)+" characters")
}

// TestSeqBound: a seq is an integer from 1 to MaxSeq (2^53-1, exact in
// Redis's Lua), whether the payload is built in Go or read from JSON, and
// the error states the bound.
func TestSeqBound(t *testing.T) {
	t.Parallel()
	for _, seq := range []int64{1, tasks.MaxSeq} {
		p := validModify()
		p.Seq = seq
		require.NoError(t, p.Validate(), "seq %d", seq)
	}
	for _, seq := range []int64{-1, tasks.MaxSeq + 1, 1<<63 - 1} {
		p := validModify()
		p.Seq = seq
		err := p.Validate()
		require.ErrorIs(t, err, asynq.SkipRetry, "seq %d", seq)
		assert.ErrorContains(t, err, "from 1 to "+strconv.FormatInt(tasks.MaxSeq, 10))
		x := validExchange()
		x.Seq = seq
		require.ErrorIs(t, x.Validate(), asynq.SkipRetry, "exchange seq %d", seq)
	}
}
