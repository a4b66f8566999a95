// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command checkconfig checks the plugin's configuration without Envoy
// (`make lint CONFIG=file`): it runs each configuration it finds through
// the plugin's own validation (engine.CheckConfiguration, what OnPluginStart
// runs) natively, and prints, for a configuration the plugin refuses, the
// very line the plugin logs in Envoy ("tokenbucket: invalid configuration,
// refusing to start: config: rules[0]..."). It reads:
//
//   - a .json file (or - for standard input): the configuration itself, the
//     bytes the plugin receives;
//
//   - in a .yaml or .yml file, each Istio WasmPlugin manifest (kind:
//     WasmPlugin): spec.pluginConfig, turned into the JSON the plugin
//     receives as Istio does it (package manifest: protojson of the
//     google.protobuf.Struct);
//
//   - in a .yaml or .yml file, each Envoy Gateway EnvoyExtensionPolicy:
//     the config of each spec.dynamicModule entry whose filterName is the
//     native module's (tokenbucket), as the JSON text Envoy Gateway hands
//     the module;
//
//   - in a .yaml or .yml file, each other document (an Envoy bootstrap or
//     resource, an Istio EnvoyFilter): the configuration of every Wasm
//     plugin in it (an object with vm_config) and of every filter of the
//     native module (a dynamic module filter with filter_name tokenbucket;
//     other modules' filters are not ours to check), a
//     google.protobuf.StringValue (or BytesValue).
//
//     go run ./cmd/checkconfig envoy.yaml examples/istio/wasmplugin-gateway.yaml my.json
//
// It prints one line per configuration found, "ok" or the refusal, and
// exits 1 when the plugin would refuse one (or a file holds none), 2 on a
// usage error or a file that cannot be read or decoded.
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("checkconfig", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: checkconfig file.json|file.yaml|-...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	code := 0
	for _, path := range fs.Args() {
		found, err := read(path, stdin)
		if err != nil {
			fmt.Fprintf(stdout, "FAIL %s: %v\n", path, err)
			code = 2
			continue
		}
		if len(found) == 0 {
			fmt.Fprintf(stdout, "FAIL %s: no plugin configuration (no WasmPlugin, no Wasm filter with vm_config, no dynamic module filter with filter_name %s, no EnvoyExtensionPolicy dynamicModule with filterName %s)\n", path, moduleFilter, moduleFilter)
			code = max(code, 1)
			continue
		}
		for _, c := range found {
			where := path
			if c.where != "" {
				where += " (" + c.where + ")"
			}
			if err := engine.CheckConfiguration(c.data); err != nil {
				fmt.Fprintf(stdout, "FAIL %s: %v\n", where, err)
				code = max(code, 1)
				continue
			}
			fmt.Fprintf(stdout, "ok   %s\n", where)
		}
	}
	return code
}

// found is one plugin configuration, as the plugin receives it, and where
// it was found in its file ("" for a whole .json file).
type found struct {
	where string
	data  []byte
}

// read returns the plugin configurations in the file at path.
func read(path string, stdin io.Reader) ([]found, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return fromYAML(b)
	case ".json", "":
		return []found{{data: b}}, nil
	default:
		return nil, fmt.Errorf("checkconfig: %s: want a .json, .yaml or .yml file", path)
	}
}

// fromYAML returns the plugin configurations of every document of b,
// split as kubectl splits them.
func fromYAML(b []byte) ([]found, error) {
	var out []found
	r := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; i++ {
		y, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSONStrict(y)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var tree any
		if err := json.Unmarshal(j, &tree); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		doc := "document " + strconv.Itoa(i)
		if m, ok := tree.(map[string]any); ok && m["kind"] == "WasmPlugin" {
			f, err := fromWasmPlugin(j)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", doc, err)
			}
			out = append(out, found{where: doc + ", WasmPlugin " + f.where + " spec.pluginConfig", data: f.data})
			continue
		}
		if m, ok := tree.(map[string]any); ok && m["kind"] == "EnvoyExtensionPolicy" {
			fs, err := fromExtensionPolicy(m)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", doc, err)
			}
			for _, f := range fs {
				out = append(out, found{where: doc + ", " + f.where, data: f.data})
			}
			continue
		}
		fs, err := fromEnvoy(tree, "")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", doc, err)
		}
		for _, f := range fs {
			out = append(out, found{where: doc + ", " + f.where, data: f.data})
		}
	}
}

// fromWasmPlugin decodes a WasmPlugin strictly (package manifest) and
// returns its pluginConfig as Istio hands it to the plugin; where is the
// namespace/name.
func fromWasmPlugin(j []byte) (found, error) {
	obj, err := manifest.DecodeStrict(j)
	if err != nil {
		return found{}, err
	}
	wp, ok := obj.(*clientext.WasmPlugin)
	if !ok {
		return found{}, fmt.Errorf("kind WasmPlugin decoded as %T", obj)
	}
	data, err := manifest.PluginConfig(wp)
	if err != nil {
		return found{}, err
	}
	return found{where: wp.Namespace + "/" + wp.Name, data: data}, nil
}

// moduleFilter is the native module's filter_name (Envoy Gateway's
// filterName).
const moduleFilter = "tokenbucket"

// fromExtensionPolicy returns the native module's configurations of an
// Envoy Gateway EnvoyExtensionPolicy: each spec.dynamicModule entry with
// filterName tokenbucket, its config as the JSON text Envoy Gateway hands
// the module (an object; a string would reach the module quoted).
func fromExtensionPolicy(m map[string]any) ([]found, error) {
	spec, _ := m["spec"].(map[string]any)
	mods, ok := spec["dynamicModule"].([]any)
	if !ok {
		return nil, nil
	}
	name := ""
	if meta, ok := m["metadata"].(map[string]any); ok {
		ns, _ := meta["namespace"].(string)
		n, _ := meta["name"].(string)
		name = ns + "/" + n
	}
	var out []found
	for i, e := range mods {
		mod, _ := e.(map[string]any)
		if mod["filterName"] != moduleFilter {
			continue
		}
		var data []byte
		if cfg, ok := mod["config"]; ok {
			b, err := json.Marshal(cfg)
			if err != nil {
				return nil, fmt.Errorf("spec.dynamicModule[%d].config: %w", i, err)
			}
			data = b
		}
		out = append(out, found{where: fmt.Sprintf("EnvoyExtensionPolicy %s spec.dynamicModule[%d].config", name, i), data: data})
	}
	return out, nil
}

const (
	stringValue = "type.googleapis.com/google.protobuf.StringValue"
	bytesValue  = "type.googleapis.com/google.protobuf.BytesValue"
)

// fromEnvoy walks the JSON tree v of an Envoy bootstrap or resource, at
// path, and returns the configuration of every Wasm plugin (an object with
// vm_config: envoy.extensions.wasm.v3.PluginConfig) in document order.
func fromEnvoy(v any, path string) ([]found, error) {
	var out []found
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["vm_config"]; ok {
			data, err := pluginConfiguration(v["configuration"])
			if err != nil {
				return nil, fmt.Errorf("%s.configuration: %w", path, err)
			}
			where := strings.TrimPrefix(path, ".")
			if name, ok := v["name"].(string); ok && name != "" {
				where = "Wasm plugin " + strconv.Quote(name) + " at " + where
			}
			return []found{{where: where, data: data}}, nil
		}
		if _, ok := v["dynamic_module_config"]; ok {
			if v["filter_name"] != moduleFilter {
				return nil, nil // another module's filter
			}
			data, err := pluginConfiguration(v["filter_config"])
			if err != nil {
				return nil, fmt.Errorf("%s.filter_config: %w", path, err)
			}
			return []found{{where: "native module filter at " + strings.TrimPrefix(path, "."), data: data}}, nil
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys) // JSON objects carry no order: a stable one
		for _, k := range keys {
			f, err := fromEnvoy(v[k], path+"."+k)
			if err != nil {
				return nil, err
			}
			out = append(out, f...)
		}
	case []any:
		for i, e := range v {
			f, err := fromEnvoy(e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			out = append(out, f...)
		}
	}
	return out, nil
}

// pluginConfiguration returns the bytes Envoy hands the plugin for a
// PluginConfig's configuration (a google.protobuf.Any): a StringValue's
// string, a BytesValue's bytes, nothing when it is absent.
func pluginConfiguration(v any) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("not an object (a google.protobuf.Any)")
	}
	typ, _ := m["@type"].(string)
	value, hasValue := m["value"]
	s, isString := value.(string)
	if hasValue && !isString {
		return nil, fmt.Errorf("value: not a string")
	}
	switch typ {
	case stringValue:
		return []byte(s), nil
	case bytesValue:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("value: %w", err)
		}
		return b, nil
	default:
		return nil, fmt.Errorf("@type %q: the plugin reads its JSON from a %s (or BytesValue)", typ, stringValue)
	}
}
