package istio_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/golang/protobuf/jsonpb" //nolint:staticcheck // the decoder Istio's own API types use
	protov1 "github.com/golang/protobuf/proto"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	clientnet "istio.io/client-go/pkg/apis/networking/v1"
	clientsec "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// doc is one YAML document of a manifest, decoded.
type doc struct {
	file  string
	index int
	// raw is the document as JSON (what kubectl sends to the API server).
	raw []byte
	// obj is the typed object: *clientext.WasmPlugin, *clientnet.ServiceEntry,
	// *clientnet.DestinationRule, *clientsec.AuthorizationPolicy or
	// *corev1.Service.
	obj any
}

func (d doc) String() string { return fmt.Sprintf("%s#%d", d.file, d.index) }

// splitYAML splits a multi-document YAML file at its "---" lines, dropping
// documents that hold only comments.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if hasContent(cur.Bytes()) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if strings.TrimRight(string(line), " \r\n") == "---" {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

func hasContent(b []byte) bool {
	for _, line := range strings.Split(string(b), "\n") {
		if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
			return true
		}
	}
	return false
}

// loadManifest reads and strictly decodes every document of a manifest.
func loadManifest(t *testing.T, path string) []doc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	for i, y := range splitYAML(b) {
		// YAMLToJSONStrict also refuses duplicate keys.
		j, err := yaml.YAMLToJSONStrict(y)
		if err != nil {
			t.Fatalf("%s#%d: %v", filepath.Base(path), i, err)
		}
		obj, err := decodeStrict(j)
		if err != nil {
			t.Fatalf("%s#%d: %v", filepath.Base(path), i, err)
		}
		docs = append(docs, doc{file: filepath.Base(path), index: i, raw: j, obj: obj})
	}
	return docs
}

// envelope is a Kubernetes object with its spec left raw.
type envelope struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// decodeStrict decodes one object into the typed istio.io/client-go (or
// k8s.io/api) object of its apiVersion and kind. Every field must be known:
// the envelope and metadata through encoding/json with unknown fields
// disallowed; an Istio spec through the jsonpb decoder Istio's API types use
// (so Istio's spellings, like 100ms durations, work) with unknown fields
// refused, after a check that every name is the camelCase JSON name of a
// field, as the CRD schema demands (jsonpb alone also accepts proto names
// such as plugin_config). google.protobuf.Struct values (pluginConfig) are
// free-form by design; the plugin's own parser checks them.
func decodeStrict(j []byte) (any, error) {
	var env envelope
	if err := strictJSON(j, &env); err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	if env.Metadata.Name == "" || env.Metadata.Namespace == "" {
		return nil, fmt.Errorf("metadata: name and namespace are required, got %q/%q", env.Metadata.Namespace, env.Metadata.Name)
	}
	if len(env.Spec) == 0 {
		return nil, fmt.Errorf("spec: required")
	}
	tm := metav1.TypeMeta{APIVersion: env.APIVersion, Kind: env.Kind}
	var spec proto.Message
	var obj any
	switch gvk := env.APIVersion + " " + env.Kind; gvk {
	case clientext.SchemeGroupVersion.String() + " WasmPlugin":
		o := &clientext.WasmPlugin{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case clientnet.SchemeGroupVersion.String() + " ServiceEntry":
		o := &clientnet.ServiceEntry{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case clientnet.SchemeGroupVersion.String() + " DestinationRule":
		o := &clientnet.DestinationRule{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case clientsec.SchemeGroupVersion.String() + " AuthorizationPolicy":
		o := &clientsec.AuthorizationPolicy{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case "v1 Service":
		o := &corev1.Service{TypeMeta: tm, ObjectMeta: env.Metadata}
		if err := strictJSON(env.Spec, &o.Spec); err != nil {
			return nil, fmt.Errorf("spec: %w", err)
		}
		return o, nil
	default:
		return nil, fmt.Errorf("apiVersion/kind %q: not an expected type", gvk)
	}
	var tree any
	if err := json.Unmarshal(env.Spec, &tree); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if err := checkJSONNames(spec.ProtoReflect().Descriptor(), tree, "spec"); err != nil {
		return nil, err
	}
	u := jsonpb.Unmarshaler{AllowUnknownFields: false}
	if err := u.Unmarshal(bytes.NewReader(env.Spec), protov1.MessageV1(spec)); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return obj, nil
}

// freeForm are the well-known types whose JSON is not an object of fields.
var freeForm = map[protoreflect.FullName]bool{
	"google.protobuf.Struct": true, "google.protobuf.Value": true, "google.protobuf.ListValue": true,
	"google.protobuf.Any": true, "google.protobuf.Duration": true, "google.protobuf.Timestamp": true,
	"google.protobuf.FieldMask": true, "google.protobuf.BoolValue": true, "google.protobuf.StringValue": true,
	"google.protobuf.BytesValue": true, "google.protobuf.Int32Value": true, "google.protobuf.Int64Value": true,
	"google.protobuf.UInt32Value": true, "google.protobuf.UInt64Value": true, "google.protobuf.FloatValue": true,
	"google.protobuf.DoubleValue": true, "google.protobuf.Empty": true,
}

// checkJSONNames walks v, the JSON of a message md, and fails on any object
// key that is not the JSON (camelCase) name of a field.
func checkJSONNames(md protoreflect.MessageDescriptor, v any, path string) error {
	if freeForm[md.FullName()] {
		return nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil // not an object: jsonpb reports the type error
	}
	fields := md.Fields()
	for k, val := range obj {
		p := path + "." + k
		fd := fields.ByJSONName(k)
		if fd == nil {
			if fields.ByName(protoreflect.Name(k)) != nil {
				return fmt.Errorf("%s: unknown field: the CRD schema knows only the camelCase name %q", p, fields.ByName(protoreflect.Name(k)).JSONName())
			}
			return fmt.Errorf("%s: unknown field in %s", p, md.FullName())
		}
		switch {
		case fd.IsMap():
			if m, ok := val.(map[string]any); ok && fd.MapValue().Message() != nil {
				for mk, mv := range m {
					if err := checkJSONNames(fd.MapValue().Message(), mv, p+"["+mk+"]"); err != nil {
						return err
					}
				}
			}
		case fd.Message() != nil && fd.IsList():
			if list, ok := val.([]any); ok {
				for i, e := range list {
					if err := checkJSONNames(fd.Message(), e, fmt.Sprintf("%s[%d]", p, i)); err != nil {
						return err
					}
				}
			}
		case fd.Message() != nil:
			if err := checkJSONNames(fd.Message(), val, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadExamples decodes every manifest of this directory (the Envoy bootstrap
// template aside).
func loadExamples(t *testing.T) []doc {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	for _, f := range files {
		if f == envoyTemplate {
			continue
		}
		docs = append(docs, loadManifest(t, f)...)
	}
	if len(docs) == 0 {
		t.Fatal("no manifests found")
	}
	return docs
}

var sha256Pattern = regexp.MustCompile(`^[a-f0-9]{64}$`)
