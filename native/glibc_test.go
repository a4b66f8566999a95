// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
)

// TestGlibcFloor reads the GLIBC_ symbol versions the built module needs
// (build/libtokenbucket.so or $NATIVE_MODULE, and the arm64 build,
// build/libtokenbucket-linux-arm64.so, when it exists) and fails when the
// highest is above the C library floor docs/compatibility.md states: a
// module that needs a newer glibc than the proxy image has does not load
// there. (internal/testing/repotest's TestRelease checks the release's two.)
func TestGlibcFloor(t *testing.T) {
	floor, err := elftest.DocumentedGlibcFloor("..")
	if err != nil {
		t.Fatal(err)
	}
	so := os.Getenv("NATIVE_MODULE")
	if so == "" {
		so = filepath.Join("..", "build", "libtokenbucket.so")
	}
	if _, err := os.Stat(so); err != nil {
		ci.Skip(t, "%s: %v (make build-native)", so, err)
	}
	files := []string{so}
	if arm := filepath.Join(filepath.Dir(so), "libtokenbucket-linux-arm64.so"); fileExists(arm) {
		files = append(files, arm)
	}
	for _, f := range files {
		need, sym, err := elftest.HighestGlibc(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s needs GLIBC_%s (%s); the documented floor is glibc %s", f, need, sym, floor)
		if elftest.CompareVersions(need, floor) > 0 {
			t.Errorf("%s needs GLIBC_%s (for %s), above the floor docs/compatibility.md states (glibc %s): build it against an older C library, or raise the floor and check the proxy images again",
				f, need, sym, floor)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
