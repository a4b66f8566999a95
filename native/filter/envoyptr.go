package filter

import (
	"errors"
	"reflect"
	"sync/atomic"
	"unsafe"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// Envoy 1.40 exports calls that the SDK snapshot the module is built on
// does not wrap (config-level metrics: envoyabi.go). They take the Envoy
// object a handle stands for, which the SDK keeps as the first field of its
// unexported handle types and does not expose. envoyPtr reads it, after
// checking that the handle is the type this module was written against: a
// different SDK (another pseudo-version in go.mod) makes Create refuse every
// configuration with a line saying so, and TestSDKHandleLayout fails.

// sdkABIPackage is the SDK package whose handle types envoyPtr reads.
const sdkABIPackage = "github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/abi"

// The SDK's handle types and their first field, as envoyPtr expects them.
const (
	sdkConfigHandleType  = "dymConfigHandle"
	sdkConfigHandleField = "hostConfigPtr"
	sdkFilterHandleType  = "dymHttpFilterHandle"
	sdkFilterHandleField = "hostPluginPtr"
)

// envoyPtr returns the Envoy pointer that handle (a pointer to the SDK's
// struct typeName of package pkg) holds in its first field, named field,
// or an error naming what differs.
func envoyPtr(handle any, pkg, typeName, field string) (unsafe.Pointer, error) {
	v := reflect.ValueOf(handle)
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, errors.New(Name + ": the SDK's handle is " + describe(reflect.TypeOf(handle)) + ", want *" + pkg + "." + typeName)
	}
	st := v.Elem().Type()
	if st.PkgPath() != pkg || st.Name() != typeName {
		return nil, errors.New(Name + ": the SDK's handle is " + describe(v.Type()) + ", want *" + pkg + "." + typeName)
	}
	if st.NumField() == 0 {
		return nil, errors.New(Name + ": " + typeName + " has no fields, want " + field + " first")
	}
	f := st.Field(0)
	if f.Name != field || f.Offset != 0 || f.Type.Kind() != reflect.UnsafePointer {
		return nil, errors.New(Name + ": " + typeName + "'s first field is " + f.Name + " " + f.Type.String() + ", want " + field + " (a C pointer)")
	}
	p := *(*unsafe.Pointer)(v.UnsafePointer())
	if p == nil {
		return nil, errors.New(Name + ": " + typeName + "." + field + " is nil")
	}
	return p, nil
}

func describe(t reflect.Type) string {
	if t == nil {
		return "nil"
	}
	return t.String()
}

// filterHandleType is the dynamic type of the SDK's filter handles, once
// envoyPtr has checked one; nil before, or if the check failed.
var filterHandleType atomic.Pointer[reflect.Type]

// filterPtr is the Envoy pointer of a filter handle, read without
// reflection once the handle's type has been checked (a filter is created
// per request: this is on the request path).
func filterPtr(handle shared.HttpFilterHandle) (unsafe.Pointer, bool) {
	if t := filterHandleType.Load(); t != nil && reflect.TypeOf(handle) == *t {
		// An interface holding a pointer keeps it as its data word.
		data := (*[2]unsafe.Pointer)(unsafe.Pointer(&handle))[1]
		if p := *(*unsafe.Pointer)(data); p != nil {
			return p, true
		}
		return nil, false
	}
	p, err := envoyPtr(handle, sdkABIPackage, sdkFilterHandleType, sdkFilterHandleField)
	if err != nil {
		return nil, false
	}
	t := reflect.TypeOf(handle)
	filterHandleType.Store(&t)
	return p, true
}
