// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoBuiltBinaries: no tracked file is a native executable or shared
// object (ELF): built programs go to build/ (ignored), never into the tree.
// The small hand-written WebAssembly modules of the benchmarks are sources
// (their text is committed beside them).
func TestNoBuiltBinaries(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fh, err := os.Open(filepath.Join(root, f))
		if err != nil {
			continue // deleted in the work tree
		}
		var magic [4]byte
		n, _ := fh.Read(magic[:])
		fh.Close()
		if n == 4 && bytes.Equal(magic[:], []byte("\x7fELF")) {
			t.Errorf("%s is a built binary (ELF): build it into build/ instead", f)
		}
	}
}
