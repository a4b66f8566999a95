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

// TestMakefileListsAreTheDocs: `make test` runs the e2e tests whose doc
// comment has a line "Serial: <why>" (the part e2e-serial, after the
// others in their lane, beside the unit tests at a lower priority) or
// "Alone: <why>" (e2e-alone, with nothing beside it) apart from the others
// (e2e-parallel); the Makefile reads their names from the doc comments
// (E2E_SERIAL, E2E_ALONE). Each list must be exactly the tests this
// package's rule marks so, and no test may carry both marks, or a test
// would run twice, or never, or beside what it measures.
func TestMakefileListsAreTheDocs(t *testing.T) {
	files, err := filepath.Glob("../../e2e/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in e2e/: %v", err)
	}
	want := map[string][]string{}
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !isTest(fn) {
				continue
			}
			serial, alone := hasMark(fn, "Serial"), hasMark(fn, "Alone")
			if serial && alone {
				t.Errorf("%s: %s is marked both Serial and Alone", path, fn.Name.Name)
			}
			if serial {
				want["Serial"] = append(want["Serial"], fn.Name.Name)
			}
			if alone {
				want["Alone"] = append(want["Alone"], fn.Name.Name)
			}
		}
	}
	for mark, target := range map[string]string{"Serial": "e2e-serial-list", "Alone": "e2e-alone-list"} {
		cmd := exec.Command("make", "--no-print-directory", "-s", target)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make %s: %v", target, err)
		}
		got := strings.Split(strings.TrimSpace(string(out)), "|")
		slices.Sort(got)
		slices.Sort(want[mark])
		if len(want[mark]) == 0 || !slices.Equal(got, want[mark]) {
			t.Errorf("make %s prints %v; the doc comments' %s tests are %v", target, got, mark, want[mark])
		}
	}
}

// hasMark reports whether fn's doc comment has a line "<mark>: <why>".
func hasMark(fn *ast.FuncDecl, mark string) bool {
	if fn.Doc == nil {
		return false
	}
	for _, c := range fn.Doc.List {
		if _, why, ok := strings.Cut(c.Text, mark+": "); ok && strings.TrimSpace(why) != "" {
			return true
		}
	}
	return false
}
