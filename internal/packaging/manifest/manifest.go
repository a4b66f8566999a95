// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package manifest decodes Kubernetes manifests strictly into the Istio
// (istio.io/client-go) and Kubernetes (k8s.io/api) API types, as the API
// server would with field validation Strict: an unknown or misspelt field,
// a duplicate key or a wrong type is an error. Validate then checks what the
// API server cannot: every WasmPlugin's pluginConfig, and every native-module
// configuration an EnvoyFilter carries, passes the plugin's own parser
// (package config) in the form the plugin receives it, the limit-service
// clusters its cluster rules name exist, and the proxies an EnvoyFilter
// selects can load the native module. It is used by `make validate-istio`
// (cmd/validateistio) and by the tests of examples/istio.
package manifest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/golang/protobuf/jsonpb" //nolint:staticcheck // the decoder Istio's own API types use
	protov1 "github.com/golang/protobuf/proto"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	clientnet "istio.io/client-go/pkg/apis/networking/v1"
	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	clientsec "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Doc is one YAML document of a manifest, decoded.
type Doc struct {
	File  string
	Index int // 0-based, among the documents that are not only comments
	// Kind is the object's kind, e.g. WasmPlugin.
	Kind string
	// Raw is the document as JSON (what kubectl sends to the API server).
	Raw []byte
	// Obj is the typed object: *clientext.WasmPlugin, *clientnet.ServiceEntry,
	// *clientnet.DestinationRule, *clientnetv1a3.EnvoyFilter,
	// *clientsec.AuthorizationPolicy,
	// *clientsec.PeerAuthentication,
	// *corev1.Service, *appsv1.Deployment, *corev1.Secret or
	// *corev1.ServiceAccount.
	Obj any
}

func (d Doc) String() string { return fmt.Sprintf("%s#%d", d.File, d.Index) }

// DecodeFile reads and strictly decodes every document of the manifest at
// path. Doc.File is the base name.
func DecodeFile(path string) ([]Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Decode(filepath.Base(path), b)
}

// Decode strictly decodes every document of a manifest named file. The
// documents are split by apimachinery's YAML reader, as kubectl splits them;
// a document that holds only comments is skipped.
func Decode(file string, b []byte) ([]Doc, error) {
	var docs []Doc
	r := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; {
		y, err := r.Read()
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", file, i, err)
		}
		// YAMLToJSONStrict also refuses duplicate keys.
		j, err := yaml.YAMLToJSONStrict(y)
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", file, i, err)
		}
		if string(j) == "null" {
			continue // only comments
		}
		obj, err := DecodeStrict(j)
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", file, i, err)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return nil, fmt.Errorf("%s#%d: %w", file, i, err)
		}
		docs = append(docs, Doc{File: file, Index: i, Kind: tm.Kind, Raw: j, Obj: obj})
		i++
	}
}

// envelope is a Kubernetes object with its spec left raw.
type envelope struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
}

// strictJSON decodes b into v as the API server does with field validation
// Strict (sigs.k8s.io/json): keys match field names case-sensitively, and an
// unknown or duplicate field is an error.
func strictJSON(b []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(b, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// decodeKube decodes j, a whole Kubernetes object, into obj with every field
// known.
func decodeKube[T any](j []byte, obj *T) (*T, error) {
	if err := strictJSON(j, obj); err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	return obj, nil
}

// DecodeStrict decodes one object into the typed istio.io/client-go (or
// k8s.io/api) object of its apiVersion and kind. Every field must be known:
// the envelope and metadata through encoding/json with unknown fields
// disallowed; an Istio spec through the jsonpb decoder Istio's API types use
// (so Istio's spellings, like 100ms durations, work) with unknown fields
// refused, after a check that every name is the camelCase JSON name of a
// field, as the CRD schema demands (jsonpb alone also accepts proto names
// such as plugin_config). google.protobuf.Struct values (a WasmPlugin's
// pluginConfig, an EnvoyFilter's patch value) are free-form by design: the
// plugin's own parser checks the first, NativeFilters and Validate the part
// of the second that configures the native module.
func DecodeStrict(j []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	var kube interface {
		GetName() string
		GetNamespace() string
	}
	var err error
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Service":
		kube, err = decodeKube(j, &corev1.Service{})
	case "apps/v1 Deployment":
		kube, err = decodeKube(j, &appsv1.Deployment{})
	case "v1 Secret":
		kube, err = decodeKube(j, &corev1.Secret{})
	case "v1 ServiceAccount":
		kube, err = decodeKube(j, &corev1.ServiceAccount{})
	}
	if err != nil {
		return nil, err
	}
	if kube != nil {
		if kube.GetName() == "" || kube.GetNamespace() == "" {
			return nil, fmt.Errorf("metadata: name and namespace are required, got %q/%q", kube.GetNamespace(), kube.GetName())
		}
		return kube, nil
	}
	var env envelope
	if err := strictJSON(j, &env); err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	if env.Metadata.Name == "" || env.Metadata.Namespace == "" {
		return nil, fmt.Errorf("metadata: name and namespace are required, got %q/%q", env.Metadata.Namespace, env.Metadata.Name)
	}
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
	case clientnetv1a3.SchemeGroupVersion.String() + " EnvoyFilter":
		o := &clientnetv1a3.EnvoyFilter{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case clientsec.SchemeGroupVersion.String() + " AuthorizationPolicy":
		o := &clientsec.AuthorizationPolicy{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	case clientsec.SchemeGroupVersion.String() + " PeerAuthentication":
		o := &clientsec.PeerAuthentication{TypeMeta: tm, ObjectMeta: env.Metadata}
		obj, spec = o, &o.Spec
	default:
		return nil, fmt.Errorf("apiVersion/kind %q: not an expected type", gvk)
	}
	if len(env.Spec) == 0 {
		return nil, fmt.Errorf("spec: required")
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
