package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestMakefileSerialListIsTheDocs: `make test` runs the e2e tests with a
// line "Serial: <why>" in their doc comment apart (the part e2e-serial,
// alone) from the others (e2e-parallel, beside the unit tests); the
// Makefile reads their names from the doc comments (E2E_SERIAL). Its list
// must be exactly the tests this package's rule calls Serial, or a test
// would run twice, or never, or beside what it measures.
func TestMakefileSerialListIsTheDocs(t *testing.T) {
	files, err := filepath.Glob("../../e2e/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in e2e/: %v", err)
	}
	var want []string
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if ok && fn.Recv == nil && isTest(fn) && isSerial(fn) {
				want = append(want, fn.Name.Name)
			}
		}
	}
	cmd := exec.Command("make", "--no-print-directory", "-s", "e2e-serial-list")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make e2e-serial-list: %v", err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "|")
	slices.Sort(got)
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("the Makefile's E2E_SERIAL is %v; the doc comments' Serial tests are %v", got, want)
	}
}

// isSerial reports whether fn's doc comment has a line "Serial: <why>".
func isSerial(fn *ast.FuncDecl) bool {
	if fn.Doc == nil {
		return false
	}
	for _, c := range fn.Doc.List {
		if _, why, ok := strings.Cut(c.Text, "Serial: "); ok && strings.TrimSpace(why) != "" {
			return true
		}
	}
	return false
}
