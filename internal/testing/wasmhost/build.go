package wasmhost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildModule builds the Go package pkg (relative to the repository root
// root) for wasip1 the way the Makefile builds the plugin: the standard
// compiler, -buildmode=c-shared (a WASI reactor). It writes
// root/build/<out> and returns its bytes. The go command's cache makes a
// rebuild cheap, so callers rebuild rather than trust a file that may be
// stale.
func BuildModule(root, pkg, out string) ([]byte, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	out = filepath.Join(root, "build", out)
	run := func(env []string, name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, b)
		}
		return nil
	}
	if err := run([]string{"GOOS=wasip1", "GOARCH=wasm"}, "go", "build",
		"-buildmode=c-shared", "-trimpath", "-o", out, pkg); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}
