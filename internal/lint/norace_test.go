// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package lint

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoRaceListStartsNoGoroutine: `make unit` runs the packages of the
// Makefile's UNIT_NORACE without -race. The race detector finds races
// between goroutines, and there are none to find where neither a package's
// code nor its tests, nor any package of this module they import, has a go
// statement; it made their CPU-bound tests 5 to 60 times as slow (the
// image of limitd took 162 s to build). A package of the list that starts
// a goroutine, or imports one of ours that does, fails here and goes back
// to the race run.
func TestNoRaceListStartsNoGoroutine(t *testing.T) {
	cmd := exec.Command("make", "--no-print-directory", "-s", "unit-norace-list")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make unit-norace-list: %v", err)
	}
	list := strings.Fields(string(out))
	if len(list) == 0 {
		t.Fatal("UNIT_NORACE is empty")
	}
	const module = "github.com/ratelimit-wasm/tokenbucket"
	seen, checked := map[string]bool{}, 0
	for _, rel := range list {
		pkg := module + "/" + rel
		// The package with its tests, and every package they import.
		cmd := exec.Command("go", "list", "-deps", "-test", "-json=ImportPath,Dir,GoFiles,TestGoFiles,XTestGoFiles", pkg)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for dec.More() {
			var p struct {
				ImportPath, Dir                    string
				GoFiles, TestGoFiles, XTestGoFiles []string
			}
			if err := dec.Decode(&p); err != nil {
				t.Fatal(err)
			}
			// "p [p.test]" is p built with its tests; "p.test" the
			// generated main, in the build cache.
			path, _, _ := strings.Cut(p.ImportPath, " ")
			if !strings.HasPrefix(path, module+"/") || strings.HasSuffix(path, ".test") {
				continue
			}
			files := p.GoFiles
			if path == pkg {
				files = append(append(files, p.TestGoFiles...), p.XTestGoFiles...)
			}
			for _, name := range files {
				file := filepath.Join(p.Dir, name)
				if seen[file] {
					continue
				}
				seen[file] = true
				if at := goStatement(t, file); at != "" {
					t.Errorf("UNIT_NORACE has %s, but %s starts a goroutine at %s: take it out of the list", rel, path, at)
				}
				checked++
			}
		}
	}
	t.Logf("%d files of %v and what they import from this module: no go statement", checked, list)
}

// goStatement is the position of the first go statement in the file at
// path, or "".
func goStatement(t *testing.T, path string) string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := ""
	ast.Inspect(f, func(n ast.Node) bool {
		if g, ok := n.(*ast.GoStmt); ok && at == "" {
			at = fset.Position(g.Pos()).String()
		}
		return at == ""
	})
	return at
}
