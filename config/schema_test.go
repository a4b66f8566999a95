package config

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/tidwall/gjson"
)

// examplesDir holds the example deployments. Every *.json file under it is a
// plugin configuration, except JSON Web Key Sets named jwks.json or
// *.jwks.json.
const examplesDir = "../examples"

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	sch, err := jsonschema.NewCompiler().Compile("schema.json")
	if err != nil {
		t.Fatalf("compile schema.json: %v", err)
	}
	return sch
}

// validate returns nil when data is JSON that the schema accepts.
func validate(sch *jsonschema.Schema, data []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

func TestSchemaExamples(t *testing.T) {
	sch := compileSchema(t)
	var n int
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := d.Name()
		if d.IsDir() || !strings.HasSuffix(base, ".json") || base == "jwks.json" || strings.HasSuffix(base, ".jwks.json") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		if err := validate(sch, data); err != nil {
			t.Errorf("%s: schema: %v", path, err)
		}
		c, err := Parse(data)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return nil
		}
		roundTrip(t, c)
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	t.Logf("%d example configurations", n)
}

// TestReferenceExamples checks every ```json block of the configuration
// reference against Parse and the schema.
func TestReferenceExamples(t *testing.T) {
	sch := compileSchema(t)
	blocks := referenceExamples()
	for i, b := range blocks {
		if _, err := Parse([]byte(b)); err != nil {
			t.Errorf("example %d: %v\n%s", i, err, b)
		}
		if err := validate(sch, []byte(b)); err != nil {
			t.Errorf("example %d: schema: %v", i, err)
		}
	}
	if len(blocks) < 6 {
		t.Errorf("found %d examples, want at least 6", len(blocks))
	}
}

// referenceExamples returns the ```json blocks of the configuration
// reference (docs/configuration.md) and of README.md.
func referenceExamples() []string {
	var blocks []string
	for _, doc := range []string{"../docs/configuration.md", "../README.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			continue
		}
		for _, b := range strings.Split(string(data), "```json\n")[1:] {
			b, _, _ = strings.Cut(b, "```")
			blocks = append(blocks, b)
		}
	}
	return blocks
}

func TestSchemaAcceptsGoodCases(t *testing.T) {
	sch := compileSchema(t)
	for _, tc := range goodCases {
		if err := validate(sch, []byte(tc.in)); err != nil {
			t.Errorf("%s: schema refuses it: %v", tc.name, err)
		}
		c, err := Parse([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		out, _ := c.MarshalJSON()
		if err := validate(sch, out); err != nil {
			t.Errorf("%s: schema refuses the canonical form %s: %v", tc.name, out, err)
		}
	}
}

// TestSchemaAgreesWithParse checks that the schema refuses every bad case it
// can express, and accepts the ones listed as gaps, so that the list of what
// only Parse checks stays true.
func TestSchemaAgreesWithParse(t *testing.T) {
	sch := compileSchema(t)
	for _, tc := range badCases {
		err := validate(sch, []byte(tc.in))
		switch {
		case tc.gap == "" && err == nil:
			t.Errorf("%s: schema accepts %s; Parse says %s", tc.name, tc.in, tc.want)
		case tc.gap != "" && err != nil:
			t.Errorf("%s: schema now refuses it (%v); clear its gap %q", tc.name, err, tc.gap)
		}
		// Where both refuse, they must blame the same place: the schema
		// reports a location at or above the path in Parse's error.
		var ve *jsonschema.ValidationError
		var pe *Error
		if !errors.As(err, &ve) {
			continue // not JSON, or accepted
		}
		if _, perr := Parse([]byte(tc.in)); !errors.As(perr, &pe) {
			t.Fatalf("%s: Parse error %v is not an *Error", tc.name, perr)
		}
		want := pathTokens(pe.Path)
		var locs [][]string
		leafLocations(ve, &locs)
		if !slices.ContainsFunc(locs, func(loc []string) bool {
			return len(loc) <= len(want) && slices.Equal(loc, want[:len(loc)])
		}) {
			t.Errorf("%s: schema blames %q, Parse blames %q", tc.name, locs, want)
		}
	}
}

// pathTokens splits a path from an *Error, such as
// rules[0].match["header:x"].in[1], into rules 0 match header:x in 1: the
// tokens of a JSON pointer.
func pathTokens(path string) []string {
	var out []string
	for path != "" {
		switch {
		case path[0] == '.':
			path = path[1:]
		case strings.HasPrefix(path, `["`):
			q, err := strconv.QuotedPrefix(path[1:])
			if err != nil {
				return append(out, path)
			}
			name, _ := strconv.Unquote(q)
			out = append(out, name)
			path = path[1+len(q)+1:]
		case path[0] == '[':
			i := strings.IndexByte(path, ']')
			if i < 0 {
				return append(out, path)
			}
			out = append(out, path[1:i])
			path = path[i+1:]
		default:
			i := strings.IndexAny(path, ".[")
			if i < 0 {
				i = len(path)
			}
			out = append(out, path[:i])
			path = path[i:]
		}
	}
	return out
}

// leafLocations collects the instance locations of the innermost errors.
func leafLocations(e *jsonschema.ValidationError, out *[][]string) {
	if len(e.Causes) == 0 {
		*out = append(*out, e.InstanceLocation)
	}
	for _, c := range e.Causes {
		leafLocations(c, out)
	}
}

// TestSchemaBounds checks that the schema states Parse's defaults and bounds.
func TestSchemaBounds(t *testing.T) {
	data, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]any{
		"properties.xff_num_trusted_hops.maximum":                     MaxXFFNumTrustedHops,
		"properties.jwt_metadata_namespace.default":                   DefaultJWTMetadataNamespace,
		"properties.jwt_payload_key.default":                          DefaultJWTPayloadKey,
		"properties.max_keys.default":                                 DefaultMaxKeys,
		"properties.max_keys.minimum":                                 MinMaxKeys,
		"properties.max_keys.maximum":                                 MaxMaxKeys,
		"properties.headers.default":                                  HeadersBoth.String(),
		"$defs.rule.properties.status.default":                        DefaultStatus,
		"$defs.algorithm_config.properties.tokens_per_second.maximum": MaxTokensPerSecond,
		"$defs.algorithm_config.properties.rps.maximum":               MaxTokensPerSecond,
		"$defs.algorithm_config.properties.burst.maximum":             MaxBurst,
		"$defs.algorithm_config.properties.fixed_cost.maximum":        MaxBurst,
		"$defs.algorithm_config.properties.default_cost.maximum":      MaxBurst,
		"$defs.algorithm_config.properties.truncated_cost.maximum":    MaxBurst,
		"$defs.algorithm_config.properties.max_body_bytes.default":    DefaultMaxBodyBytes,
		"$defs.algorithm_config.properties.max_body_bytes.maximum":    MaxMaxBodyBytes,
		"$defs.service.properties.path.default":                       DefaultServicePath,
		"$defs.service.properties.timeout_ms.default":                 DefaultTimeoutMS,
		"$defs.service.properties.timeout_ms.maximum":                 MaxTimeoutMS,
	} {
		v := gjson.GetBytes(data, strings.ReplaceAll(path, "$", `\$`))
		var got any
		switch want.(type) {
		case string:
			got = v.String()
		case int:
			got = int(v.Int())
		case float64:
			got = v.Float()
		}
		if !v.Exists() || got != want {
			t.Errorf("schema %s = %s, want %v", path, v.Raw, want)
		}
	}
}

func TestPathTokens(t *testing.T) {
	got := pathTokens(`rules[10].match["header:x.y"].in[1]`)
	if want := []string{"rules", "10", "match", "header:x.y", "in", "1"}; !slices.Equal(got, want) {
		t.Errorf("pathTokens = %q, want %q", got, want)
	}
	if got := pathTokens(""); len(got) != 0 {
		t.Errorf("pathTokens(\"\") = %q", got)
	}
}
