package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openapiDoc loads api/openapi.yaml with kin-openapi, once per test binary:
// the document a generator reads, with its $refs resolved.
var openapiDoc = sync.OnceValues(func() (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", specPath, err)
	}
	return doc, nil
})

func loadOpenAPI(tb testing.TB) *openapi3.T {
	tb.Helper()
	doc, err := openapiDoc()
	require.NoError(tb, err)
	return doc
}

// TestSpecValidates runs kin-openapi's strict validation of the document,
// as a generator's loader would: every $ref resolves, every schema is
// well-formed, every default and example agrees with its schema, every
// pattern compiles, and no schema names a format kin-openapi does not
// know.
func TestSpecValidates(t *testing.T) {
	doc := loadOpenAPI(t)
	err := doc.Validate(context.Background(),
		openapi3.EnableExamplesValidation(),
		openapi3.EnableSchemaDefaultsValidation(),
		openapi3.EnableSchemaPatternValidation(),
		openapi3.EnableSchemaFormatValidation(),
		openapi3.ProhibitExtensionsWithRef(),
		openapi3.EnableMultiError(),
	)
	require.NoError(t, err, "kin-openapi's doc.Validate of %s", specPath)
}

// specSchema is a schema met while walking the document, with where.
type specSchema struct {
	where  string
	schema *openapi3.Schema
}

// walkSchemas calls fn for every schema of the document, component or
// inline, nested ones included, once each, where it is written: a $ref is
// not followed, as what it names is walked from components.schemas.
func walkSchemas(doc *openapi3.T, fn func(specSchema)) {
	seen := make(map[*openapi3.Schema]bool)
	var walk func(where string, ref *openapi3.SchemaRef)
	walk = func(where string, ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || ref.Ref != "" {
			return
		}
		s := ref.Value
		if seen[s] {
			return
		}
		seen[s] = true
		fn(specSchema{where, s})
		for _, name := range sortedKeys(s.Properties) {
			walk(where+".properties."+name, s.Properties[name])
		}
		walk(where+".items", s.Items)
		walk(where+".additionalProperties", s.AdditionalProperties.Schema)
		for i, sub := range slices.Concat(s.AllOf, s.OneOf, s.AnyOf) {
			walk(fmt.Sprintf("%s.of[%d]", where, i), sub)
		}
		walk(where+".not", s.Not)
	}
	// A component's own definition first, so that a $ref to it elsewhere
	// is not walked again.
	for _, name := range sortedKeys(doc.Components.Schemas) {
		ref := doc.Components.Schemas[name]
		walk("components.schemas."+name, &openapi3.SchemaRef{Value: ref.Value})
	}
	params := func(where string, ps openapi3.Parameters) {
		for _, p := range ps {
			if p.Value != nil && p.Ref == "" {
				walk(where+".parameters."+p.Value.Name, p.Value.Schema)
			}
		}
	}
	content := func(where string, c openapi3.Content) {
		for _, mt := range sortedKeys(c) {
			walk(where+".content."+mt+".schema", c[mt].Schema)
		}
	}
	headers := func(where string, hs openapi3.Headers) {
		for _, name := range sortedKeys(hs) {
			if h := hs[name]; h.Value != nil && h.Ref == "" {
				walk(where+".headers."+name, h.Value.Schema)
			}
		}
	}
	for _, name := range sortedKeys(doc.Components.Parameters) {
		walk("components.parameters."+name, doc.Components.Parameters[name].Value.Schema)
	}
	headers("components", doc.Components.Headers)
	for _, name := range sortedKeys(doc.Components.Responses) {
		r := doc.Components.Responses[name].Value
		headers("components.responses."+name, r.Headers)
		content("components.responses."+name, r.Content)
	}
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		params("paths."+path, item.Parameters)
		for _, method := range sortedKeys(item.Operations()) {
			op := item.Operations()[method]
			where := "paths." + path + "." + strings.ToLower(method)
			params(where, op.Parameters)
			if op.RequestBody != nil && op.RequestBody.Ref == "" {
				content(where+".requestBody", op.RequestBody.Value.Content)
			}
			for code, r := range op.Responses.Map() {
				if r.Ref == "" {
					headers(where+".responses."+code, r.Value.Headers)
					content(where+".responses."+code, r.Value.Content)
				}
			}
		}
	}
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// int64Names are the members that carry fences, positions, versions,
// counts and times in ms or µs: values that pass 2^31 in a long-lived
// deployment (a fence is about 1.8e15), whatever bounds the schema states.
var int64Names = regexp.MustCompile(`(^|\.)(fence|seq|version|done|last|more|waiting|total|history_total|ghosts|candidates|[a-z_]+_ms|[a-z_]+_us)$`)

// TestSpecIntegerFormats checks that every integer of the spec has a
// format, so that a generator (openapi-generator's Java client reads it to
// pick Integer or Long) types it right: int64 unless the schema's own
// bounds keep it within 32 bits, and always int64 for the members of
// int64Names.
func TestSpecIntegerFormats(t *testing.T) {
	doc := loadOpenAPI(t)
	n := 0
	walkSchemas(doc, func(s specSchema) {
		if s.schema.Type == nil || !s.schema.Type.Is("integer") {
			return
		}
		n++
		bounded := s.schema.Min != nil && *s.schema.Min >= math.MinInt32 && s.schema.Max != nil && *s.schema.Max <= math.MaxInt32
		switch {
		case int64Names.MatchString(s.where):
			assert.Equal(t, "int64", s.schema.Format, "%s: a fence, position, version, count or time in ms passes 2^31", s.where)
		case bounded:
			assert.Contains(t, []string{"int32", "int64"}, s.schema.Format, "%s: every integer has a format", s.where)
		default:
			assert.Equal(t, "int64", s.schema.Format, "%s: an integer without bounds within 32 bits is int64", s.where)
		}
	})
	assert.Greater(t, n, 30, "integers found: the walk reaches the schemas")
}

// TestSpecExamples checks every example of the spec against its schema,
// with kin-openapi's validation of JSON values: media types' example and
// examples, parameters' and headers', and schemas' own example and
// examples. It also checks that every answer with a body has an example,
// so that a generator's user sees each answer as it is. doc.Validate
// checks most of them too, but only while its options say so.
func TestSpecExamples(t *testing.T) {
	doc := loadOpenAPI(t)
	n := 0
	check := func(where string, schema *openapi3.SchemaRef, value any) {
		t.Helper()
		n++
		if !assert.NotNil(t, schema, "%s: an example without a schema", where) || schema.Value == nil {
			return
		}
		// A round trip through JSON, as a client would see the example.
		b, err := json.Marshal(value)
		require.NoError(t, err, where)
		var v any
		require.NoError(t, json.Unmarshal(b, &v), where)
		assert.NoError(t, schema.Value.VisitJSON(v, openapi3.EnableFormatValidation()), "%s: the example does not match its schema: %s", where, b)
	}
	media := func(where string, mt *openapi3.MediaType) {
		if mt.Example != nil {
			check(where+".example", mt.Schema, mt.Example)
		}
		for _, name := range sortedKeys(mt.Examples) {
			if ex := mt.Examples[name]; ex.Value != nil {
				check(where+".examples."+name, mt.Schema, ex.Value.Value)
			}
		}
	}
	walkSchemas(doc, func(s specSchema) {
		if s.schema.Example != nil {
			check(s.where+".example", &openapi3.SchemaRef{Value: s.schema}, s.schema.Example)
		}
		for i, ex := range s.schema.Examples {
			check(fmt.Sprintf("%s.examples[%d]", s.where, i), &openapi3.SchemaRef{Value: s.schema}, ex)
		}
	})
	for _, name := range sortedKeys(doc.Components.Parameters) {
		p := doc.Components.Parameters[name].Value
		if p.Example != nil {
			check("components.parameters."+name+".example", p.Schema, p.Example)
		}
	}
	var missing []string
	responses := func(where string, r *openapi3.Response) {
		for _, ct := range sortedKeys(r.Content) {
			mt := r.Content[ct]
			media(where+".content."+ct, mt)
			hasSchemaExample := mt.Schema != nil && mt.Schema.Value != nil && (mt.Schema.Value.Example != nil || len(mt.Schema.Value.Examples) > 0)
			if mt.Example == nil && len(mt.Examples) == 0 && !hasSchemaExample {
				missing = append(missing, where)
			}
		}
	}
	for _, name := range sortedKeys(doc.Components.Responses) {
		responses("components.responses."+name, doc.Components.Responses[name].Value)
	}
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		for _, method := range sortedKeys(item.Operations()) {
			op := item.Operations()[method]
			where := "paths." + path + "." + strings.ToLower(method)
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				for _, ct := range sortedKeys(op.RequestBody.Value.Content) {
					media(where+".requestBody.content."+ct, op.RequestBody.Value.Content[ct])
				}
			}
			for _, code := range sortedKeys(op.Responses.Map()) {
				if r := op.Responses.Value(code); r.Ref == "" {
					responses(where+".responses."+code, r.Value)
				}
			}
		}
	}
	assert.Empty(t, missing, "answers without an example")
	assert.Greater(t, n, 20, "examples checked")
}
