// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/oci"
)

// TestPluginWasmIsReproducible runs `make build` in this checkout and in a
// copy of its files at another path (longer, under the temporary
// directory), then demands byte-identical plugin.wasm files, neither of
// which names its checkout's path, and so identical image digests.
func TestPluginWasmIsReproducible(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// The files of the checkout as they are: tracked ones and new ones
	// that are not ignored (build/ is).
	list, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("not a git checkout (%v); CI=true makes this a failure", err)
	}
	copyDir := filepath.Join(t.TempDir(), "another", "checkout", "of-this-repository")
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, name))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(copyDir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}

	wasm := map[string][]byte{}
	for _, dir := range []string{root, copyDir} {
		start := time.Now()
		makeBuild(t, dir)
		b, err := os.ReadFile(filepath.Join(dir, "build", "plugin.wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(dir)) {
			t.Errorf("%s/build/plugin.wasm contains its checkout path %s", dir, dir)
		}
		wasm[dir] = b
		t.Logf("make build in %s: %v", dir, time.Since(start).Round(time.Millisecond))
	}
	a, b := wasm[root], wasm[copyDir]
	if !bytes.Equal(a, b) {
		t.Fatalf("plugin.wasm differs between %s (%d bytes) and %s (%d bytes)", root, len(a), copyDir, len(b))
	}
	ia, err := oci.Build(a, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := oci.Build(b, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ia.Digests() != ib.Digests() {
		t.Fatalf("image digests differ: %v, %v", ia.Digests().Image, ib.Digests().Image)
	}
	t.Logf("identical: plugin.wasm sha256:%s, image %s", ia.Digests().Wasm.Hex, ia.Digests().Image)
}

// makeBuild runs `make build` in dir, outside any make that runs this test.
func makeBuild(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "build")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build in %s: %v\n%s", dir, err, out)
	}
}
