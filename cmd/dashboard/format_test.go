package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestFormatPayload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		taskType string
		payload  string
		want     string
	}{
		{
			name:     "modify",
			taskType: "order:modify",
			payload:  `{"event_id":"evt-1","order_no":"SO1","changes":{"remark":"hi"}}`,
			want:     "order:modify  order_no=SO1\nevent_id=evt-1\n{\n  \"event_id\": \"evt-1\",\n  \"order_no\": \"SO1\",\n  \"changes\": {\n    \"remark\": \"hi\"\n  }\n}",
		},
		{
			name:     "exchange keeps key order",
			taskType: "order:exchange",
			payload:  `{"order_no":"SO2","items":[{"sku":"A","qty":1}],"event_id":"e2"}`,
			want:     "order:exchange  order_no=SO2\nevent_id=e2\n{\n  \"order_no\": \"SO2\",\n  \"items\": [\n    {\n      \"sku\": \"A\",\n      \"qty\": 1\n    }\n  ],\n  \"event_id\": \"e2\"\n}",
		},
		{
			name:     "order task missing fields",
			taskType: "order:modify",
			payload:  `{"changes":{}}`,
			want:     "order:modify  order_no=(missing)\nevent_id=(missing)\n{\n  \"changes\": {}\n}",
		},
		{
			name:     "odd field values are quoted",
			taskType: "order:modify",
			payload:  `{"order_no":"SO 1\n<b>","event_id":42}`,
			want:     "order:modify  order_no=\"SO 1\\n<b>\"\nevent_id=42\n{\n  \"order_no\": \"SO 1\\n<b>\",\n  \"event_id\": 42\n}",
		},
		{
			name:     "other task type without order fields",
			taskType: "email:send",
			payload:  `{"to":"a@b"}`,
			want:     "email:send\n{\n  \"to\": \"a@b\"\n}",
		},
		{
			name:     "json that is not an object",
			taskType: "order:modify",
			payload:  `[1,2]`,
			want:     "order:modify\n[\n  1,\n  2\n]",
		},
		{
			name:     "text",
			taskType: "order:modify",
			payload:  "order SO1\tplease\x00",
			want:     "order:modify\n(not JSON, 17 bytes)\n\"order SO1\\tplease\\x00\"",
		},
		{
			name:     "binary",
			taskType: "order:modify",
			payload:  "\xff\xfe\x00A",
			want:     "order:modify\n(binary, 4 bytes)\n00000000  ff fe 00 41                                       |...A|\n",
		},
		{
			name:     "empty",
			taskType: "order:modify",
			payload:  "",
			want:     "order:modify\n(empty)",
		},
		{
			name:     "odd task type",
			taskType: "order:modify\n<script>",
			payload:  `{}`,
			want:     "\"order:modify\\n<script>\"  order_no=(missing)\nevent_id=(missing)\n{}",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, formatPayload(tt.taskType, []byte(tt.payload)))
		})
	}
}

func TestFormatLimits(t *testing.T) {
	t.Parallel()
	big := `{"event_id":"e","order_no":"SO1","remark":"` + strings.Repeat("é", 20000) + `"}`
	got := formatPayload("order:modify", []byte(big))
	assert.LessOrEqual(t, len(got), maxShown+200)
	assert.True(t, utf8.ValidString(got))
	assert.True(t, strings.HasSuffix(got, "(cut short: the whole value is 40045 bytes)"), got[len(got)-80:])

	bin := formatBytes([]byte(strings.Repeat("\xff", 1000)))
	assert.True(t, strings.HasSuffix(bin, "… 744 more bytes"))

	long := formatPayload("order:modify", []byte(`{"order_no":"`+strings.Repeat("x ", 100)+`"}`))
	header, _, _ := strings.Cut(long, "\n")
	assert.Less(t, len(header), 250)
}

func TestFormatResult(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "{\n  \"version\": 3\n}", formatResult("order:modify", []byte(`{"version":3}`)))
	assert.Equal(t, "(empty)", formatResult("order:modify", nil))
}

// FuzzFormatPayload checks that any payload is shown as valid UTF-8 of
// bounded size whose first line starts with the task type, which the
// payload cannot break.
func FuzzFormatPayload(f *testing.F) {
	for _, seed := range []string{`{"event_id":"e","order_no":"SO1"}`, `[]`, `"x"`, "\xff", "", `{"order_no":{"a":1}}`, `{"order_no":"\u2028"}`} {
		f.Add("order:modify", []byte(seed))
	}
	f.Fuzz(func(t *testing.T, taskType string, payload []byte) {
		got := formatPayload(taskType, payload)
		if !utf8.ValidString(got) {
			t.Fatalf("not UTF-8: %q", got)
		}
		if len(got) > maxShown+4*maxBinary+8*maxField+200 {
			t.Fatalf("%d bytes shown", len(got))
		}
		header, _, ok := strings.Cut(got, "\n")
		if !ok || !strings.HasPrefix(header, safeField(taskType)) {
			t.Fatalf("header %q does not start with the type", header)
		}
	})
}
