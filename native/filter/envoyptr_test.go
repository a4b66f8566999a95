package filter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// TestSDKHandleLayout fails when the SDK in go.mod no longer keeps the
// configuration's Envoy pointer where envoyPtr reads it: the first field of
// its dymConfigHandle, named hostConfigPtr, a C pointer. It reads the SDK's
// source (no Envoy can be had here to build a real handle).
func TestSDKHandleLayout(t *testing.T) {
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
			if !ok || ts.Name.Name != sdkConfigHandleType {
				return true
			}
			found = true
			st, ok := ts.Type.(*ast.StructType)
			if !ok || len(st.Fields.List) == 0 || len(st.Fields.List[0].Names) == 0 {
				t.Fatalf("%s.%s is not a struct with a named first field", sdkABIPackage, sdkConfigHandleType)
			}
			first := st.Fields.List[0]
			sel, ok := first.Type.(*ast.SelectorExpr)
			if first.Names[0].Name != sdkConfigHandleField || !ok || sel.Sel.Name != "envoy_dynamic_module_type_http_filter_config_envoy_ptr" {
				t.Fatalf("%s.%s's first field is %s, want %s C.envoy_dynamic_module_type_http_filter_config_envoy_ptr",
					sdkABIPackage, sdkConfigHandleType, first.Names[0].Name, sdkConfigHandleField)
			}
			return false
		})
	}
	if !found {
		t.Fatalf("%s has no type %s", sdkABIPackage, sdkConfigHandleType)
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
