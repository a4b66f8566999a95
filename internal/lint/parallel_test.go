package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEndToEndTestsRunInParallel checks every top-level test of the
// end-to-end packages (e2e/ and the rate limit service's, e2e/ratelimit/): one of its own statements (not a subtest's) is
// t.Parallel(), or its doc comment has a line "Serial: <why>" or "Alone: <why>" saying why it may not
// (see the Makefile's E2E_SERIAL and E2E_ALONE).
// Nearly all of an end-to-end test's time is waiting (Envoy starting, a
// window passing, a report every few seconds), so run one after another
// they took more than 20 minutes of `make test`; run side by side (go
// test's -parallel, set in the Makefile) they overlap their waits. A test
// that sets the process's environment (t.Setenv panics in a parallel test)
// or measures what others would disturb says so instead.
func TestEndToEndTestsRunInParallel(t *testing.T) {
	var files []string
	for _, dir := range []string{"../../e2e", "../../e2e/ratelimit"} {
		fs, err := filepath.Glob(dir + "/*_test.go")
		if err != nil || len(fs) == 0 {
			t.Fatalf("no test files in %s: %v", dir, err)
		}
		files = append(files, fs...)
	}
	checked := 0
	for _, path := range files {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !isTest(fn) {
				continue
			}
			checked++
			if msg := parallelProblem(fn); msg != "" {
				t.Errorf("%s: %s %s", fset.Position(fn.Pos()), fn.Name.Name, msg)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d tests in e2e/: the walk is broken", checked)
	}
}

// isTest reports whether fn is a top-level test: TestXxx(t *testing.T).
func isTest(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if !strings.HasPrefix(name, "Test") || name == "TestMain" || fn.Type.Params == nil || len(fn.Type.Params.List) != 1 {
		return false
	}
	star, ok := fn.Type.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// parallelProblem is what is wrong with fn's start, or "".
func parallelProblem(fn *ast.FuncDecl) string {
	if hasMark(fn, "Serial") || hasMark(fn, "Alone") {
		return ""
	}
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return "is empty"
	}
	for _, s := range fn.Body.List {
		if isParallelCall(s, fn.Type.Params.List[0].Names) {
			return ""
		}
	}
	return "calls no t.Parallel() and its doc comment has no line \"Serial: <why>\" or \"Alone: <why>\""
}

func isParallelCall(s ast.Stmt, names []*ast.Ident) bool {
	es, ok := s.(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Parallel" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && len(names) == 1 && id.Name == names[0].Name
}
