package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/orderworker/orderworker/tasks"
)

// TestSpecConstraintsMatchValidate checks, for every kind of the table,
// that the payload's Validate accepts a body exactly when the kind's
// request schema does, at the limits the schema states. It starts from
// the kind's example (tasks.WithExample), makes a value from the
// schema for each member the sample leaves out, and tries every member,
// nested objects and the first entry of lists included: left out (refused
// when required), and values at and beyond its limits: lengths where the
// spec's verdict on a string changes (minLength, maxLength or pattern) and
// 4096 characters, a pattern's value with a printable character or a
// control before or after it, integers at their minimum and maximum and
// one beyond, lists of minItems and maxItems entries and one beyond, 0 and
// 1000, and an empty object. A refusal must name the field the spec finds
// at fault, when it is a *tasks.FieldError.
//
// So a kind added to the table has its field limits checked with no test
// of its own: a limit the spec states and Validate lacks, or the other
// way round, or a different bound, fails here. Rules the schema cannot
// state (not blank, no control characters, distinct SKUs, a new order
// number unlike the old) are the kind's own tests' (tasks/validate_test.go).
func TestSpecConstraintsMatchValidate(t *testing.T) {
	s := loadSpec(t)
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			root, ok := s.Components.Schemas[requestSchema(k)]
			require.True(t, ok, "schema %s missing", requestSchema(k))
			sample := k.Example()
			require.NotEmpty(t, sample, "%s has no example: give it one with tasks.WithExample", k.Type)
			var doc map[string]any
			require.NoError(t, json.Unmarshal([]byte(sample), &doc))
			c := &constraints{t: t, s: s, k: k, root: root, re: map[string]*regexp.Regexp{}}
			c.check(doc, "the sample")
			c.object(root, nil, doc)
		})
	}
}

// constraints checks one kind's payloads against its request schema. A
// path is a value's place in a body: member names and list indexes.
type constraints struct {
	t    *testing.T
	s    spec
	k    *tasks.Kind
	root schema
	re   map[string]*regexp.Regexp
}

// object tries every member of sc, the schema of the object at path of
// doc, one at a time.
func (c *constraints) object(sc schema, path []any, doc any) {
	for _, name := range slices.Sorted(maps.Keys(sc.Properties)) {
		n := sc.Properties[name]
		c.value(c.node(&n), at(path, name), doc)
	}
}

// value tries the value at path of doc, whose schema is sc, then the
// values inside it. A member the doc leaves out is first given a value
// made from sc.
func (c *constraints) value(sc schema, path []any, doc any) {
	cur, ok := get(doc, path)
	if !ok {
		cur = c.example(sc, path)
		doc = with(doc, path, cur)
		c.check(doc, fieldName(path)+" = "+short(cur)+" (made from the schema)")
	}
	if _, member := path[len(path)-1].(string); member {
		c.try(doc, path, absent)
	}
	for _, v := range c.probes(sc, cur) {
		c.try(doc, path, v)
	}
	switch sc.Type {
	case "object":
		c.object(sc, path, doc)
	case "array":
		if len(cur.([]any)) > 0 {
			c.value(c.node(&sc.Items), at(path, 0), doc)
		}
	}
}

// probes returns the values to try in place of cur, whose schema is sc.
func (c *constraints) probes(sc schema, cur any) []any {
	var out []any
	switch sc.Type {
	case "string":
		s, long := cur.(string), pad(cur.(string), 4096)
		var cuts []int // long[:cuts[n]] is pad(s, n)
		for i := range long {
			cuts = append(cuts, i)
		}
		cuts = append(cuts, len(long))
		lens := []int{0, 4096}
		for n := 1; n <= 4096; n++ {
			if c.ok(sc, long[:cuts[n]]) != c.ok(sc, long[:cuts[n-1]]) {
				lens = append(lens, n-1, n)
			}
		}
		for _, n := range lens {
			out = append(out, long[:cuts[n]])
		}
		if sc.Pattern != "" {
			for _, r := range "\x00\t\n\x7fé" + printableASCII() {
				out = append(out, string(r)+s, s+string(r))
			}
		}
	case "integer":
		out = []any{-1.0 * (1 << 40), -1.0, 0.0, 1.0, 1.0 * (1 << 40)}
		for _, b := range []*float64{sc.Minimum, sc.Maximum} {
			if b != nil {
				out = append(out, *b-1, *b, *b+1)
			}
		}
	case "array":
		lens := []int{0, 1000}
		for _, b := range []*int{sc.MinItems, sc.MaxItems} {
			if b != nil {
				lens = append(lens, *b-1, *b, *b+1)
			}
		}
		for _, n := range lens {
			if a := cur.([]any); n >= 0 && len(a) > 0 {
				out = append(out, copies(a[0], n))
			}
		}
	case "object":
		out = []any{map[string]any{}}
	}
	return out
}

// try checks doc with v at path (absent: without the member). A value
// the spec refuses that decodes to the same payload as the member left
// out (the zero of an omitempty member, "new_order_no": "") is judged as
// left out: Validate cannot tell them apart, and a spec stricter than the
// server there misleads no client. (One that accepts such a value, a
// required member's zero, is held to it.)
func (c *constraints) try(doc any, path []any, v any) {
	probe := with(doc, path, v)
	if _, member := path[len(path)-1].(string); member && v != absent && !c.ok(c.root, probe) {
		without := with(doc, path, absent)
		p, err := c.k.Decode(c.marshal(probe))
		q, errq := c.k.Decode(c.marshal(without))
		if err == nil && errq == nil && reflect.DeepEqual(p, q) {
			probe = without
		}
	}
	c.check(probe, fieldName(path)+" = "+short(v))
}

// check compares the spec's verdict on the body doc with Validate's.
func (c *constraints) check(doc any, what string) {
	c.t.Helper()
	ok, fault := c.accepts(c.root, nil, doc)
	err := c.validate(doc)
	if ok {
		assert.NoError(c.t, err, "%s: the spec accepts it, Validate refuses it", what)
		return
	}
	if !assert.Error(c.t, err, "%s: the spec refuses it (%s), Validate accepts it", what, fault) {
		return
	}
	var fe *tasks.FieldError
	if errors.As(err, &fe) {
		assert.Equal(c.t, fault, fe.Field, "%s: the field Validate's error names (%v)", what, err)
	}
}

// validate decodes the body doc as the kind's payload and validates it,
// with the event ID and order number the intake takes from the request
// (the Idempotency-Key header, the path) when the body leaves them out.
func (c *constraints) validate(doc any) error {
	p, err := c.k.Decode(c.marshal(doc))
	if err != nil {
		return err
	}
	h := p.Header()
	if _, ok := doc.(map[string]any)["event_id"]; !ok {
		h.EventID = "evt-1"
	}
	if _, ok := doc.(map[string]any)["order_no"]; !ok {
		h.OrderNo = "SO1"
	}
	return p.WithHeader(h).Validate()
}

// accepts reports whether v is valid by sc, the schema of the value at
// path, and where it is not, the path (as a field name) of the value at
// fault: a required member that is missing, or the value whose own
// constraint it breaks.
func (c *constraints) accepts(sc schema, path []any, v any) (bool, string) {
	sc = c.resolve(sc)
	fault := fieldName(path)
	switch v := v.(type) {
	case string:
		ok := within(utf8.RuneCountInString(v), sc.MinLength, sc.MaxLength)
		return ok && (sc.Pattern == "" || c.regexp(sc.Pattern).MatchString(v)), fault
	case float64:
		return within(v, sc.Minimum, sc.Maximum), fault
	case []any:
		if !within(len(v), sc.MinItems, sc.MaxItems) {
			return false, fault
		}
		item := c.node(&sc.Items)
		for i, e := range v {
			if ok, where := c.accepts(item, at(path, i), e); !ok {
				return false, where
			}
		}
	case map[string]any:
		for _, name := range sc.Required {
			if _, ok := v[name]; !ok {
				return false, fieldName(at(path, name))
			}
		}
		if !within(len(v), sc.MinProperties, nil) {
			return false, fault
		}
		for _, name := range slices.Sorted(maps.Keys(v)) {
			n, ok := sc.Properties[name]
			require.True(c.t, ok, "%s: no member %s in the schema", fault, name)
			if ok, where := c.accepts(c.node(&n), at(path, name), v[name]); !ok {
				return false, where
			}
		}
	}
	return true, ""
}

// ok reports whether v is valid by sc.
func (c *constraints) ok(sc schema, v any) bool {
	ok, _ := c.accepts(sc, nil, v)
	return ok
}

// example returns the simplest value that sc, the schema of the value at
// path, accepts.
func (c *constraints) example(sc schema, path []any) any {
	var v any
	switch sc.Type {
	case "string":
		for n := 0; n <= 4096 && v == nil; n++ {
			if s := pad("a", n); c.ok(sc, s) {
				v = s
			}
		}
	case "integer":
		for _, n := range []*float64{new(1.0), sc.Minimum, sc.Maximum} {
			if n != nil && v == nil && c.ok(sc, *n) {
				v = *n
			}
		}
	case "array":
		v = copies(c.example(c.node(&sc.Items), at(path, 0)), max(1, deref(sc.MinItems)))
	case "object":
		m := map[string]any{}
		for _, name := range slices.Sorted(maps.Keys(sc.Properties)) {
			if slices.Contains(sc.Required, name) || len(m) < deref(sc.MinProperties) {
				n := sc.Properties[name]
				m[name] = c.example(c.node(&n), at(path, name))
			}
		}
		v = m
	}
	require.True(c.t, v != nil && c.ok(sc, v),
		"%s: cannot make a value the spec accepts; give the kind's example (tasks.WithExample) one", fieldName(path))
	return v
}

// node decodes a schema node and follows its $ref.
func (c *constraints) node(n *yaml.Node) schema {
	require.NotZero(c.t, n.Kind, "a schema is missing")
	var sc schema
	require.NoError(c.t, n.Decode(&sc))
	return c.resolve(sc)
}

// resolve follows sc's $ref to the component schema. Only descriptions
// may stand beside a $ref: this test would not read a constraint there.
func (c *constraints) resolve(sc schema) schema {
	for sc.Ref != "" {
		name, _ := strings.CutPrefix(sc.Ref, "#/components/schemas/")
		target, ok := c.s.Components.Schemas[name]
		require.True(c.t, ok, "no schema %s", sc.Ref)
		beside := sc
		beside.Ref = ""
		require.True(c.t, reflect.ValueOf(beside).IsZero(), "%s: a constraint beside $ref", sc.Ref)
		sc = target
	}
	return sc
}

func (c *constraints) regexp(p string) *regexp.Regexp {
	if re, ok := c.re[p]; ok {
		return re
	}
	re, err := regexp.Compile(p)
	require.NoError(c.t, err)
	c.re[p] = re
	return re
}

func (c *constraints) marshal(doc any) []byte {
	b, err := json.Marshal(doc)
	require.NoError(c.t, err)
	return b
}

// absent, set at a member's path, leaves the member out.
var absent any = &struct{ absent bool }{}

// get returns the value at path of doc, and whether there is one.
func get(doc any, path []any) (any, bool) {
	for _, p := range path {
		switch d := doc.(type) {
		case map[string]any:
			v, ok := d[p.(string)]
			if !ok {
				return nil, false
			}
			doc = v
		case []any:
			doc = d[p.(int)]
		}
	}
	return doc, true
}

// with returns a copy of doc with v at path (or, for absent, without the
// member at path). doc is not changed.
func with(doc any, path []any, v any) any {
	if len(path) == 0 {
		return v
	}
	switch d := doc.(type) {
	case map[string]any:
		out, name := maps.Clone(d), path[0].(string)
		if len(path) == 1 && v == absent {
			delete(out, name)
		} else {
			out[name] = with(d[name], path[1:], v)
		}
		return out
	case []any:
		out, i := slices.Clone(d), path[0].(int)
		out[i] = with(d[i], path[1:], v)
		return out
	}
	panic(fmt.Sprintf("no object or list at %v", path))
}

// at returns path with p appended, sharing nothing with path.
func at(path []any, p any) []any { return append(slices.Clip(path), p) }

// fieldName is the name Validate's errors give the value at path:
// "changes.items[0].qty".
func fieldName(path []any) string {
	var b strings.Builder
	for _, p := range path {
		switch p := p.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(p)
		case int:
			b.WriteString("[" + strconv.Itoa(p) + "]")
		}
	}
	return b.String()
}

// pad returns s cut or lengthened to n characters, lengthened with its
// last character if that is ASCII and 'a' otherwise: ASCII, so that the
// spec's lengths (in characters) are Validate's (some in bytes).
func pad(s string, n int) string {
	r := []rune(s)
	if n <= len(r) {
		return string(r[:n])
	}
	fill := "a"
	if len(r) > 0 && r[len(r)-1] < utf8.RuneSelf {
		fill = string(r[len(r)-1])
	}
	return s + strings.Repeat(fill, n-len(r))
}

// copies returns n copies of e, each of its strings suffixed with the
// copy's index, so that no two are equal (a list may want distinct
// entries).
func copies(e any, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = suffixed(e, strconv.Itoa(i))
	}
	return out
}

func suffixed(v any, sfx string) any {
	switch v := v.(type) {
	case string:
		return v + sfx
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = suffixed(e, sfx)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = suffixed(e, sfx)
		}
		return a
	}
	return v
}

func printableASCII() string {
	var b strings.Builder
	for c := byte(0x20); c < 0x7f; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

// short describes a value tried, briefly.
func short(v any) string {
	if v == absent {
		return "left out"
	}
	if s, ok := v.(string); ok && utf8.RuneCountInString(s) > 20 {
		return fmt.Sprintf("%q... (%d characters)", string([]rune(s)[:12]), utf8.RuneCountInString(s))
	}
	if a, ok := v.([]any); ok && len(a) > 1 {
		return fmt.Sprintf("%d entries", len(a))
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// within reports whether lo <= n <= hi, a nil bound being none.
func within[N int | float64](n N, lo, hi *N) bool {
	return (lo == nil || n >= *lo) && (hi == nil || n <= *hi)
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
