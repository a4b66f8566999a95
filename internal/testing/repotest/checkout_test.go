// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// copyCheckout copies this checkout's files as they are (tracked ones and
// new ones that are not ignored; build/ is) to each of dirs, so that make
// can run there without touching this checkout's build/. It skips the test
// outside a git checkout, unless CI=true.
func copyCheckout(t *testing.T, dirs ...string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("not a git checkout (%v); CI=true makes this a failure", err)
	}
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
		for _, dir := range dirs {
			dst := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// makeIn runs make with args in dir, outside any make that runs this test
// and with none of the variables that name images or times from the
// environment, and returns its output; a failure fails the test.
func makeIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := makeCmd(dir, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// makeCmd is the command makeIn runs.
func makeCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "OCI_REF", "OCI_LIMITD_REF", "SOURCE_DATE_EPOCH", "VERSION", "MANIFESTS":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}
