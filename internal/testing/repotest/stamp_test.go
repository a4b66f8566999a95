// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bufio"
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionedRulesDependOnTheStamp: every rule whose recipe stamps the
// version into what it builds (REPRO_FLAGS or VERSION_LDFLAG: the linker's
// flags, which change the binary's build ID even where no package reads
// the version) lists the version stamp among its prerequisites, so that a
// build for another version never reuses it. (The native image's installer
// did not: `make release` after `make oci-native` packed an installer built
// for another version, and its image digest, both native manifests and
// four SHA256SUMS lines differed from another checkout's.) The rules are
// read from make's own database (make -p), so a rule added later is held
// to it too.
func TestVersionedRulesDependOnTheStamp(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	build := t.TempDir()
	stamp := filepath.Join(build, "version")
	// -p prints the database (recipes unexpanded), -q runs nothing; its exit
	// status says only whether the default goal is up to date.
	out, _ := makeCmd(root, "-pq", "BUILD="+build).Output()
	if !bytes.Contains(out, []byte("# Make data base")) {
		t.Fatalf("make -pq printed no database:\n%.2000s", out)
	}
	rules := versionedRules(string(out))
	if len(rules) < 5 {
		t.Fatalf("found %d rules that stamp the version, want the plugin's, the module's, limitd's and the cross builds': %v", len(rules), rules)
	}
	for target, prereqs := range rules {
		if !strings.HasPrefix(target, build+"/") {
			continue // a phony target whose recipe calls make again
		}
		if !strings.Contains(" "+prereqs+" ", " "+stamp+" ") {
			t.Errorf("%s: its recipe stamps the version, but its prerequisites (%s) do not name %s", strings.TrimPrefix(target, build+"/"), prereqs, stamp)
		}
	}
}

// versionedRules reads make's database and returns, for each rule whose
// recipe names REPRO_FLAGS or VERSION_LDFLAG, its prerequisites.
func versionedRules(db string) map[string]string {
	rules := map[string]string{}
	var target, prereqs string
	sc := bufio.NewScanner(strings.NewReader(db))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "\t"):
			if target != "" && (strings.Contains(line, "REPRO_FLAGS") || strings.Contains(line, "VERSION_LDFLAG")) {
				rules[target] = prereqs
			}
		case line == "":
			target = ""
		case strings.HasPrefix(line, "#"): // make's notes on the rule
		default:
			t, p, ok := strings.Cut(line, ":")
			if !ok || strings.ContainsAny(t, "=\t") || strings.HasPrefix(p, "=") {
				target = ""
				continue
			}
			target, prereqs = t, strings.TrimSpace(strings.TrimPrefix(p, ":"))
		}
	}
	return rules
}
