package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestOneFakeHost: the engine's tests run on one fake host, the one the
// host contract checks (internal/testing/fakehost): no test file of engine/
// declares a type with the methods of engine.Host or engine.Stream (a
// second fake, which would drift from the first), and none is named
// fake_test.go. A type that embeds fakehost's is no second fake.
func TestOneFakeHost(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ifaces, err := hostInterfaces(filepath.Join(root, "engine", "host.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Host", "Stream"} {
		if len(ifaces[name]) < 5 {
			t.Fatalf("engine.%s: %d methods read from engine/host.go; want its method set", name, len(ifaces[name]))
		}
	}
	for _, msg := range secondFakes(t, filepath.Join(root, "engine"), ifaces) {
		t.Error(msg)
	}
}

// TestOneFakeHostFindsACopy: the check finds a fake written in the
// engine's tests, and a file named fake_test.go.
func TestOneFakeHostFindsACopy(t *testing.T) {
	dir := t.TempDir()
	src := `package engine

type fakeHost struct{}

func (h *fakeHost) Now() int64 { return 0 }
func (h *fakeHost) Log(int, string) {}
`
	if err := os.WriteFile(filepath.Join(dir, "fake_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	ifaces := map[string][]string{"Host": {"Log", "Now"}}
	got := secondFakes(t, dir, ifaces)
	if len(got) != 2 || !strings.Contains(got[0], "fake_test.go") || !strings.Contains(got[1], "fakeHost") {
		t.Fatalf("found %q; want the file's name and the type fakeHost", got)
	}
}

// hostInterfaces reads the method names of the interfaces declared in the
// file at path.
func hostInterfaces(path string) (map[string][]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		if it, ok := ts.Type.(*ast.InterfaceType); ok {
			for _, m := range it.Methods.List {
				for _, id := range m.Names {
					out[ts.Name.Name] = append(out[ts.Name.Name], id.Name)
				}
			}
		}
		return false
	})
	return out, nil
}

// secondFakes lists the test files of dir (and its subdirectories) named
// fake_test.go, and the types they declare methods on whose names hold
// every method of one of ifaces.
func secondFakes(t *testing.T, dir string, ifaces map[string][]string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.Name() == "fake_test.go" {
			out = append(out, rel+": a fake_test.go in the engine: its tests run on internal/testing/fakehost")
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		methods := map[string]map[string]bool{} // receiver type → method names
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
				continue
			}
			typ := fd.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				if methods[id.Name] == nil {
					methods[id.Name] = map[string]bool{}
				}
				methods[id.Name][fd.Name.Name] = true
			}
		}
		var types []string
		for typ := range methods {
			types = append(types, typ)
		}
		sort.Strings(types)
		for _, typ := range types {
			for _, iface := range []string{"Host", "Stream"} {
				if names := ifaces[iface]; len(names) > 0 && hasAll(methods[typ], names) {
					out = append(out, rel+": type "+typ+" implements engine."+iface+": a second fake host; extend internal/testing/fakehost instead")
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hasAll(set map[string]bool, names []string) bool {
	for _, n := range names {
		if !set[n] {
			return false
		}
	}
	return true
}
