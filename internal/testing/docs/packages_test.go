package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRationalePackages: docs/RATIONALE.md's table of packages names every
// package of the module (go list ./...; the root package as `main.go`), and
// names no package that does not exist (the lab's, a module of its own,
// aside).
func TestRationalePackages(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	b, err := os.ReadFile(filepath.Join(root, "docs", "RATIONALE.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n| package | what it is | imports |")
	if start < 0 {
		t.Fatal("docs/RATIONALE.md: no table of packages")
	}
	named := map[string]bool{}
	name := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(text[start+1:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		first := strings.Split(line, "|")[1]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			named[m[1]] = true
		}
	}
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/ratelimit-wasm/tokenbucket"
	exists := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		if rel == "" {
			rel = "main.go"
		}
		exists[rel] = true
		if !named[rel] {
			t.Errorf("docs/RATIONALE.md's table of packages does not name %s", rel)
		}
	}
	for n := range named {
		// The lab (bench/) is a module of its own, named as such.
		if !exists[n] && !strings.HasPrefix(n, "bench/") && !strings.Contains(n, "…") {
			t.Errorf("docs/RATIONALE.md's table of packages names %s, which is not a package of the module", n)
		}
	}
}
