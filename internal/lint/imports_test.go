package lint

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/ratelimit-wasm/tokenbucket"

// class orders import groups: the standard library, third party, this
// module.
func class(path string) int {
	switch first, _, _ := strings.Cut(path, "/"); {
	case path == module || strings.HasPrefix(path, module+"/"):
		return 2
	case strings.Contains(first, "."):
		return 1
	}
	return 0
}

var classNames = []string{"standard library", "third party", "this module"}

// TestImportGroups checks every Go file of the repository (build/ and
// testdata aside): each block of imports holds one class, and the blocks
// come in the order standard library, third party, this module, each at
// most once (cgo's import "C" aside).
func TestImportGroups(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "build" || name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if msg := checkFile(path); msg != "" {
			t.Errorf("%s: %s", rel, msg)
		}
		checked++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: wrong root %s?", checked, root)
	}
}

func checkFile(path string) string {
	src, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly)
	if err != nil {
		return err.Error()
	}
	last, lastLine, lastClass := -1, -1, -1
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if p == "C" {
			// cgo's pseudo-package stands alone after its preamble: the
			// blocks are counted from the next import.
			lastLine, lastClass = -1, -1
			continue
		}
		c := class(p)
		line := fset.Position(imp.Pos()).Line
		newBlock := lastLine >= 0 && line > lastLine+1
		switch {
		case lastLine < 0:
		case !newBlock && c != lastClass:
			return p + " (" + classNames[c] + ") shares a block with " + classNames[lastClass] + " imports"
		case newBlock && c <= last:
			return p + " starts a block of " + classNames[c] + " imports after " + classNames[last] + " ones (want standard library, third party, this module)"
		}
		if newBlock || lastLine < 0 {
			last = c
		}
		lastLine, lastClass = line, c
	}
	return ""
}

// TestImportGroupsCgo: import "C" is no block of its own; the groups after
// it are checked as in any file.
func TestImportGroupsCgo(t *testing.T) {
	dir := t.TempDir()
	for src, want := range map[string]string{
		"package p\n\n// int f();\nimport \"C\"\n\nimport (\n\t\"unsafe\"\n\n\t\"example.com/x\"\n)\n": "",
		"package p\n\nimport \"C\"\n\nimport (\n\t\"example.com/x\"\n\n\t\"unsafe\"\n)\n":              "unsafe starts a block",
	} {
		path := filepath.Join(dir, "f.go")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := checkFile(path); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkFile(%q) = %q, want %q", src, got, want)
		}
	}
}
