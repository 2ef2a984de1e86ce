package producer_test

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/tasks"
)

// TestSeqSpliceMatchesTheEncoding pins the acceptance script's splice of
// the position into the payload (it appends `,"seq":<pos>` to the JSON of
// the payload without one, as tasks.Marshal writes it): for every kind,
// that is exactly tasks.Marshal of the payload with the position, which
// needs seq to be the last field the payload encodes. Every field of the
// payload is set (filled), so that an optional field added after Seq (one
// left out when empty, like a trace context) fails this test as a field
// always written does. The package doc of keyorder's asynq layout
// (worker/keyorder/internal/asynqwire) lists this among the contract an
// upgrade checks.
func TestSeqSpliceMatchesTheEncoding(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		p, err := k.Decode([]byte(`{"event_id":"ev-1","order_no":"SO1"}`))
		require.NoError(t, err, k.Type)
		p = filled(t, p)
		require.NotNil(t, p.Header().Trace, "%s: the trace context is filled too", k.Type)
		without, err := tasks.Marshal(p)
		require.NoError(t, err)
		require.Contains(t, string(without), `,"trace":{"traceparent":"x","tracestate":"x"}}`, k.Type)
		const pos = 1796334105052270
		h := p.Header()
		h.Seq = pos
		with, err := tasks.Marshal(p.WithHeader(h))
		require.NoError(t, err)
		spliced := string(without[:len(without)-1]) + `,"seq":` + strconv.Itoa(pos) + `}`
		require.Equal(t, string(with), spliced, "%s: seq must be the payload's last field", k.Type)
	}
}

// filled returns a copy of p with every zero field but Seq set to a
// non-zero value (strings "x", numbers 1, one-element slices, pointers to
// filled values), so that a field left out when empty is written.
func filled(t *testing.T, p tasks.Payload) tasks.Payload {
	t.Helper()
	v := reflect.New(reflect.TypeOf(p)).Elem()
	v.Set(reflect.ValueOf(p))
	fill(t, v)
	out, ok := v.Interface().(tasks.Payload)
	require.True(t, ok)
	require.Zero(t, out.Header().Seq)
	return out
}

func fill(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() && f.Name != "Seq" {
				fill(t, v.Field(i))
			}
		}
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(t, v.Elem())
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
		}
		for i := range v.Len() {
			fill(t, v.Index(i))
		}
	case reflect.String:
		if v.String() == "" {
			v.SetString("x")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() == 0 {
			v.SetInt(1)
		}
	case reflect.Bool:
		v.SetBool(true)
	default:
		t.Fatalf("fill: a payload field of kind %s: teach fill to set it", v.Kind())
	}
}
