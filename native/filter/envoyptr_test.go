package filter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// TestSDKHandleLayout fails when the SDK in go.mod no longer keeps the
// Envoy pointers where envoyPtr reads them: the first field of its
// dymConfigHandle, named hostConfigPtr, and of its dymHttpFilterHandle,
// named hostPluginPtr, C pointers. It reads the SDK's source (no Envoy can
// be had here to build a real handle).
func TestSDKHandleLayout(t *testing.T) {
	sdkHandleLayout(t, sdkConfigHandleType, sdkConfigHandleField, "envoy_dynamic_module_type_http_filter_config_envoy_ptr")
	sdkHandleLayout(t, sdkFilterHandleType, sdkFilterHandleField, "envoy_dynamic_module_type_http_filter_envoy_ptr")
}

func sdkHandleLayout(t *testing.T, typeName, field, cType string) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", sdkABIPackage).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", sdkABIPackage, err)
	}
	dir := strings.TrimSpace(string(out))
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	found := false
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != typeName {
				return true
			}
			found = true
			st, ok := ts.Type.(*ast.StructType)
			if !ok || len(st.Fields.List) == 0 || len(st.Fields.List[0].Names) == 0 {
				t.Fatalf("%s.%s is not a struct with a named first field", sdkABIPackage, typeName)
			}
			first := st.Fields.List[0]
			sel, ok := first.Type.(*ast.SelectorExpr)
			if first.Names[0].Name != field || !ok || sel.Sel.Name != cType {
				t.Fatalf("%s.%s's first field is %s, want %s C.%s", sdkABIPackage, typeName, first.Names[0].Name, field, cType)
			}
			return false
		})
	}
	if !found {
		t.Fatalf("%s has no type %s", sdkABIPackage, typeName)
	}
}

// dymConfigHandle has the shape envoyPtr expects, in this package.
type dymConfigHandle struct {
	hostConfigPtr unsafe.Pointer
	other         int
}

// TestEnvoyPtr: envoyPtr reads the first field of the expected type only,
// and names what differs otherwise (Create logs it and refuses).
func TestEnvoyPtr(t *testing.T) {
	var envoyObject int
	h := &dymConfigHandle{hostConfigPtr: unsafe.Pointer(&envoyObject), other: 1}
	const here = "github.com/ratelimit-wasm/tokenbucket/native/filter"
	if p, err := envoyPtr(h, here, sdkConfigHandleType, sdkConfigHandleField); err != nil || p != unsafe.Pointer(&envoyObject) {
		t.Fatalf("envoyPtr = %v, %v; want the first field", p, err)
	}
	for _, c := range []struct {
		handle any
		pkg    string
		field  string
		want   string
	}{
		{h, sdkABIPackage, sdkConfigHandleField, "want *" + sdkABIPackage + ".dymConfigHandle"},
		{h, here, "hostPtr", "first field is hostConfigPtr unsafe.Pointer, want hostPtr"},
		{&configHandle{}, sdkABIPackage, sdkConfigHandleField, "the SDK's handle is *filter.configHandle"},
		{&dymConfigHandle{}, here, sdkConfigHandleField, "hostConfigPtr is nil"},
		{nil, sdkABIPackage, sdkConfigHandleField, "the SDK's handle is nil"},
	} {
		if _, err := envoyPtr(c.handle, c.pkg, sdkConfigHandleType, c.field); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("envoyPtr(%T, %s, %s) = %v, want an error with %q", c.handle, c.pkg, c.field, err, c.want)
		}
	}
	// The factory Envoy runs refuses a handle of another type.
	t.Setenv("GODEBUG", "cgocheck=0")
	ch := &configHandle{}
	if _, err := (ConfigFactory{}).Create(ch, []byte(demoConfig)); err == nil || !strings.Contains(ch.log(), "want *"+sdkABIPackage+".dymConfigHandle") {
		t.Fatalf("Create with a handle of another type: %v\n%s", err, ch.log())
	}
}

// dymHttpFilterHandle has the shape of the SDK's filter handle, in this
// package.
type dymHttpFilterHandle struct {
	hostPluginPtr unsafe.Pointer
	shared.HttpFilterHandle
}

// TestFilterPtr: once a handle's type is checked, filterPtr reads the
// pointer of handles of that type without reflection; a handle of another
// type is checked (and refused) again, and threadKey then falls back on the
// thread id, kept apart from worker indexes by its sign.
func TestFilterPtr(t *testing.T) {
	before := filterHandleType.Load()
	t.Cleanup(func() { filterHandleType.Store(before) })
	var envoyFilter int
	h := &dymHttpFilterHandle{hostPluginPtr: unsafe.Pointer(&envoyFilter)}
	ht := reflect.TypeOf(shared.HttpFilterHandle(h))
	filterHandleType.Store(&ht) // as if envoyPtr had checked it (its package is this one)
	if p, ok := filterPtr(h); !ok || p != unsafe.Pointer(&envoyFilter) {
		t.Fatalf("filterPtr = %v, %v; want the first field", p, ok)
	}
	if _, ok := filterPtr(&dymHttpFilterHandle{}); ok {
		t.Fatal("filterPtr read a nil pointer")
	}
	other := &filterHandle{}
	if _, ok := filterPtr(other); ok {
		t.Fatal("filterPtr read a handle of another type")
	}
	if k := threadKey(other); k >= 0 {
		t.Fatalf("threadKey of a handle it cannot read = %d, want minus the thread id", k)
	}
}
