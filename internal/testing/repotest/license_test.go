// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLicense: LICENSE is the Apache License 2.0, complete, and every Go
// file that carries an SPDX header names that license.
func TestLicense(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	b, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Apache License", "Version 2.0, January 2004",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS",
		"APPENDIX: How to apply the Apache License to your work."} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("LICENSE lacks %q", want)
		}
	}
	files, err := exec.Command("git", "-C", root, "ls-files", "*.go").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	spdx := regexp.MustCompile(`SPDX-License-Identifier: (\S+)`)
	headers := 0
	for _, f := range strings.Fields(string(files)) {
		src, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m := spdx.FindSubmatch(src); m != nil {
			headers++
			if string(m[1]) != "Apache-2.0" {
				t.Errorf("%s: SPDX-License-Identifier %s, LICENSE is Apache-2.0", f, m[1])
			}
		}
	}
	if headers == 0 {
		t.Error("no Go file names its license")
	}
}

// TestChangelog: CHANGELOG.md keeps the Keep a Changelog form: an
// Unreleased section first, sections of the known kinds, entries as list
// items.
func TestChangelog(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{"Added": true, "Changed": true, "Deprecated": true, "Removed": true, "Fixed": true, "Security": true}
	versions := 0
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			v := strings.TrimPrefix(line, "## ")
			if versions == 0 && v != "[Unreleased]" {
				t.Errorf("CHANGELOG.md:%d: the first section is %q, want [Unreleased]", i+1, v)
			}
			versions++
		case strings.HasPrefix(line, "### "):
			if k := strings.TrimPrefix(line, "### "); !kinds[k] {
				t.Errorf("CHANGELOG.md:%d: section %q is none of Added, Changed, Deprecated, Removed, Fixed, Security", i+1, k)
			}
		}
	}
	if versions == 0 {
		t.Error("CHANGELOG.md has no ## [Unreleased] section")
	}
}
