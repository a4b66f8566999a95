// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall copies a module into a folder: the same bytes, mode 0755, no
// temporary file left; a second run replaces the first copy; a missing
// source or folder fails.
func TestInstall(t *testing.T) {
	src := filepath.Join(t.TempDir(), "libtokenbucket.so")
	dir := t.TempDir()
	for _, content := range []string{"first module", "second module"} {
		if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := run([]string{"-src", src, dir}, &out); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, "libtokenbucket.so")
		b, err := os.ReadFile(dst)
		if err != nil || string(b) != content {
			t.Fatalf("%s: %q (%v), want %q", dst, b, err, content)
		}
		if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %v (%v), want 0755", dst, st.Mode(), err)
		}
		if !strings.Contains(out.String(), "installed "+dst) {
			t.Errorf("printed %q", out.String())
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("%s holds %d entries, want the module alone", dir, len(entries))
		}
	}
	if err := run([]string{"-src", filepath.Join(dir, "missing.so"), dir}, io.Discard); err == nil {
		t.Error("a missing source: no error")
	}
	if err := run([]string{"-src", src, filepath.Join(dir, "no", "such", "dir")}, io.Discard); err == nil {
		t.Error("a missing folder: no error")
	}
	if err := run([]string{"-src", src}, io.Discard); err == nil {
		t.Error("no folder: no error")
	}
}
