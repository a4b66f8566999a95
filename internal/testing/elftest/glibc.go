// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package elftest

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// DocumentedGlibcFloor is the x.y of "C library floor: glibc x.y" in
// docs/compatibility.md under the repository root root, the one home of
// the native module's C library floor.
func DocumentedGlibcFloor(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "compatibility.md"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`C library floor: glibc (\d+\.\d+)`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf(`elftest: docs/compatibility.md states no "C library floor: glibc x.y"`)
	}
	return string(m[1]), nil
}

// HighestGlibc returns the highest GLIBC_x.y[.z] version the ELF file at
// path needs from the C library (its version needs, .gnu.version_r), and
// one symbol that needs it.
func HighestGlibc(path string) (version, symbol string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		return "", "", fmt.Errorf("elftest: %s: version needs: %w", path, err)
	}
	for _, n := range needs {
		for _, v := range n.Needs {
			if rest, ok := strings.CutPrefix(v.Dep, "GLIBC_"); ok && isVersion(rest) && CompareVersions(rest, version) > 0 {
				version = rest
			}
		}
	}
	if version == "" {
		return "", "", fmt.Errorf("elftest: %s: needs no GLIBC_ version (not linked against glibc?)", path)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return "", "", fmt.Errorf("elftest: %s: dynamic symbols: %w", path, err)
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

// CompareVersions compares dotted version numbers numerically, a missing
// part counting as 0 ("" is below any version): -1, 0 or 1.
func CompareVersions(a, b string) int {
	if a == "" || b == "" {
		switch {
		case a == b:
			return 0
		case a == "":
			return -1
		}
		return 1
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
