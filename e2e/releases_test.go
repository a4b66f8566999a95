// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// envoyRelease is one Envoy binary of a test run on several releases: the
// version its make target names and the binary's path.
type envoyRelease struct{ version, bin string }

// envoyReleases reads the Envoy binaries from the variable name
// ("1.39.3=path/to/envoy 1.40.0=...", as make target sets it); without it
// the test skips.
func envoyReleases(t *testing.T, name, target string) []envoyRelease {
	t.Helper()
	spec := os.Getenv(name)
	if spec == "" {
		t.Skipf("%s is not set: run `make %s`", name, target)
	}
	var out []envoyRelease
	for _, item := range strings.Fields(spec) {
		version, bin, ok := strings.Cut(item, "=")
		if !ok {
			t.Fatalf("%s item %q: want version=path", name, item)
		}
		out = append(out, envoyRelease{version, bin})
	}
	return out
}

// writeReleaseTable writes a run's table to the file the variable name
// names (def, under ../build, when it is unset) and logs it.
func writeReleaseTable(t *testing.T, name, def, table string) {
	t.Helper()
	out := os.Getenv(name)
	if out == "" {
		out = filepath.Join("..", "build", def)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, table)
}
