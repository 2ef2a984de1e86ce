package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hibiken/asynqmon"
)

// The formatters decode payloads generically on purpose: the dashboard must
// show any task, including ones written by a newer or buggy producer, so it
// does not import the tasks package and never rejects a payload.

const (
	// maxShown caps the text shown for one payload or result; asynqmon puts
	// a page of them in one API response.
	maxShown = 16 << 10
	// maxBinary caps the bytes shown in a hex dump.
	maxBinary = 256
	// maxField caps the length of a header field such as order_no.
	maxField = 80
)

var (
	_ asynqmon.PayloadFormatter = asynqmon.PayloadFormatterFunc(formatPayload)
	_ asynqmon.ResultFormatter  = asynqmon.ResultFormatterFunc(formatResult)
)

// formatPayload shows a task's payload in the dashboard. A JSON object is
// shown indented, under a header with the task type and, when present
// (always for order:* tasks), its order_no and event_id:
//
//	order:modify  order_no=SO1001
//	event_id=evt-1
//	{
//	  "event_id": "evt-1",
//	  ...
//
// Anything else is shown without being interpreted: other JSON indented,
// text quoted with Go escapes, and binary as a hex dump, each cut short
// when long. The header also keeps asynqmon's UI from re-indenting the
// JSON (it re-indents only text that parses as JSON as a whole).
func formatPayload(taskType string, payload []byte) string {
	var b strings.Builder
	b.WriteString(safeField(taskType))
	if obj := jsonObject(payload); obj != nil && utf8.Valid(payload) {
		order := strings.HasPrefix(taskType, "order:")
		// event_id goes on a line of its own: a UUID would not fit beside
		// the rest in the UI's 400-pixel payload column.
		for _, f := range []struct{ sep, key string }{{"  ", "order_no"}, {"\n", "event_id"}} {
			raw, ok := obj[f.key]
			if !ok && !order {
				continue
			}
			b.WriteString(f.sep + f.key + "=")
			if !ok {
				b.WriteString("(missing)")
				continue
			}
			b.WriteString(fieldValue(raw))
		}
	}
	b.WriteString("\n")
	b.WriteString(formatBytes(payload))
	return b.String()
}

// formatResult shows the result a task wrote: JSON indented, anything else
// as formatPayload shows it.
func formatResult(_ string, result []byte) string { return formatBytes(result) }

// formatBytes shows data: JSON indented, valid UTF-8 quoted, anything else
// as a hex dump, each truncated.
func formatBytes(data []byte) string {
	switch {
	case len(data) == 0:
		return "(empty)"
	case !utf8.Valid(data):
		// Binary, or JSON with bytes that are not UTF-8, which JSON forbids.
	case json.Valid(data):
		var buf bytes.Buffer
		if err := json.Indent(&buf, data, "", "  "); err == nil {
			return truncate(buf.String(), len(data))
		}
	default:
		return fmt.Sprintf("(not JSON, %d bytes)\n%s", len(data), truncate(strconv.Quote(string(data)), len(data)))
	}
	n := min(len(data), maxBinary)
	s := fmt.Sprintf("(binary, %d bytes)\n%s", len(data), hex.Dump(data[:n]))
	if n < len(data) {
		s += fmt.Sprintf("… %d more bytes", len(data)-n)
	}
	return s
}

// jsonObject returns the top-level members of a JSON object, or nil when
// data is not one.
func jsonObject(data []byte) map[string]json.RawMessage {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil
	}
	return obj
}

var plainField = regexp.MustCompile(`^[A-Za-z0-9_.:@/-]{1,80}$`)

// fieldValue shows a header field: a plain string bare, any other string
// quoted, and another JSON value as its compact text, all cut to maxField.
func fieldValue(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var buf bytes.Buffer
		if json.Compact(&buf, raw) != nil {
			return "(invalid)"
		}
		return safeField(buf.String())
	}
	return safeField(s)
}

// safeField returns s bare when it is short plain text, and otherwise
// quoted with Go escapes (so it cannot break the header line) and cut to
// maxField characters.
func safeField(s string) string {
	if plainField.MatchString(s) {
		return s
	}
	r := []rune(s)
	if len(r) > maxField {
		return strconv.Quote(string(r[:maxField])) + "…"
	}
	return strconv.Quote(s)
}

// truncate cuts s to maxShown bytes on a rune boundary, noting how much of
// the total bytes was left out.
func truncate(s string, total int) string {
	if len(s) <= maxShown {
		return s
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("\n… (cut short: the whole value is %d bytes)", total)
}
