// Package ratelimitsrc finds envoyproxy/ratelimit's source in the Go module
// cache, where `go mod download` in a module that requires it (e2e/ratelimit)
// or `make build-ratelimit` puts it, and lists the example and test
// configurations it ships, which limitd's tests feed its configuration
// parser. Nothing of that source is copied into this repository.
package ratelimitsrc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// Version is the version of envoyproxy/ratelimit the project checks
// against (mk/ratelimit.mk's RATELIMIT_VERSION).
const Version = "v1.4.1-0.20260122083618-3fb702589d36"

// Module is envoyproxy/ratelimit's module path.
const Module = "github.com/envoyproxy/ratelimit"

// Dir returns the folder of version's source in the module cache, or an
// error when it is not there.
func Dir(version string) (string, error) {
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("ratelimitsrc: go env GOMODCACHE: %w", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	dir := filepath.Join(cache, Module+"@"+version)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("ratelimitsrc: %s@%s is not in the module cache (%s): run go -C e2e/ratelimit mod download, or make build-ratelimit", Module, version, dir)
	}
	return dir, nil
}

// Require returns Dir(Version), skipping t when the source is missing, or
// failing it under CI=true.
func Require(t testing.TB) string {
	t.Helper()
	dir, err := Dir(Version)
	if err != nil {
		ci.Skip(t, "%v", err)
	}
	return dir
}

// configGlobs are where the source keeps rate limit configurations: its
// example, its unit tests' and its integration tests' files.
var configGlobs = []string{
	"examples/ratelimit/config/*.yaml",
	"test/config/*.yaml",
	"test/integration/runtime/current/ratelimit/*.yaml",
	"test/integration/runtime/current/ratelimit/config/*.yaml",
}

// ConfigFiles lists the configuration files of the source at dir, as paths
// relative to dir ("test/config/basic_config.yaml"), sorted.
func ConfigFiles(dir string) ([]string, error) {
	var out []string
	for _, g := range configGlobs {
		m, err := filepath.Glob(filepath.Join(dir, g))
		if err != nil {
			return nil, err
		}
		for _, p := range m {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return nil, err
			}
			out = append(out, filepath.ToSlash(rel))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("ratelimitsrc: no configuration files under " + dir)
	}
	slices.Sort(out)
	return out, nil
}
