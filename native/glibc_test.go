// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// TestGlibcFloor reads the GLIBC_ symbol versions the built module needs
// (build/libtokenbucket.so or $NATIVE_MODULE, and the arm64 build of make
// release, build/libtokenbucket-linux-arm64.so, when it exists) and fails
// when the highest is above the C library floor docs/compatibility.md
// states: a module that needs a newer glibc than the proxy image has does
// not load there.
func TestGlibcFloor(t *testing.T) {
	floor := documentedGlibcFloor(t)
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
		need, sym, err := highestGlibc(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s needs GLIBC_%s (%s); the documented floor is glibc %s", f, need, sym, floor)
		if compareVersions(need, floor) > 0 {
			t.Errorf("%s needs GLIBC_%s (for %s), above the floor docs/compatibility.md states (glibc %s): build it against an older C library, or raise the floor and check the proxy images again",
				f, need, sym, floor)
		}
	}
}

// documentedGlibcFloor is the x.y of "C library floor: glibc x.y" in
// docs/compatibility.md, the one home of the fact.
func documentedGlibcFloor(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "compatibility.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`C library floor: glibc (\d+\.\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`docs/compatibility.md states no "C library floor: glibc x.y"`)
	}
	return string(m[1])
}

// highestGlibc returns the highest GLIBC_x.y[.z] version the ELF file at
// path needs from the C library (its version needs, .gnu.version_r), and
// one symbol that needs it.
func highestGlibc(path string) (version, symbol string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		return "", "", fmt.Errorf("%s: version needs: %w", path, err)
	}
	for _, n := range needs {
		for _, v := range n.Needs {
			if rest, ok := strings.CutPrefix(v.Dep, "GLIBC_"); ok && isVersion(rest) && compareVersions(rest, version) > 0 {
				version = rest
			}
		}
	}
	if version == "" {
		return "", "", fmt.Errorf("%s: needs no GLIBC_ version (not linked against glibc?)", path)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return "", "", fmt.Errorf("%s: dynamic symbols: %w", path, err)
	}
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF && s.Version == "GLIBC_"+version {
			symbol = s.Name
			break
		}
	}
	return version, symbol, nil
}

func isVersion(s string) bool {
	for _, p := range strings.Split(s, ".") {
		if _, err := strconv.Atoi(p); err != nil {
			return false
		}
	}
	return true
}

// compareVersions compares dotted version numbers ("" is below any).
func compareVersions(a, b string) int {
	if a == "" || b == "" {
		return len(a) - len(b)
	}
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// TestCompareVersions: numeric, not textual, and a missing part is 0.
func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"2.34", "2.34", 0}, {"2.4", "2.34", -1}, {"2.35", "2.34", 1}, {"2.3.2", "2.3", 1}, {"2.3", "2.3.0", 0}, {"", "2.2.5", -1}} {
		if got := compareVersions(tc.a, tc.b); (got > 0) != (tc.want > 0) || (got < 0) != (tc.want < 0) {
			t.Errorf("compareVersions(%q, %q) = %d, want sign of %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
