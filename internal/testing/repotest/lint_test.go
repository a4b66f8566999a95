// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// lintSection is the README section that tells a user to check a
// configuration with `make lint`.
const lintSection = "## Using the plugin in your own Envoy"

// lintCmdRE finds a `make lint ...` command written in a code span.
var lintCmdRE = regexp.MustCompile("`(make lint [^`]*)`")

// TestReadmeLint replays every `make lint` command of README.md's section
// for your own Envoy, exactly as written, in a copy of the checkout: on the
// file it names as the repository has it, then on that section's bootstrap
// saved under that name (what a reader of the section does), which must
// pass, and on the bootstrap with a burst the plugin refuses, which must
// fail with the line the plugin logs in Envoy.
func TestReadmeLint(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), lintSection)
	if !ok {
		t.Fatalf("README.md has no section %q", lintSection)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, rest, ok := strings.Cut(section, "```yaml\n")
	bootstrap, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no yaml block")
	}
	const good, refused = `"tokens_per_second": 10, "burst": 50`, `"tokens_per_second": 10, "burst": 5`
	if !strings.Contains(bootstrap, good) {
		t.Fatalf("the bootstrap has no %s to make refusable:\n%s", good, bootstrap)
	}
	cmds := lintCmdRE.FindAllStringSubmatch(section, -1)
	if len(cmds) == 0 {
		t.Fatal("the section gives no `make lint ...` command")
	}

	dir := t.TempDir()
	copyCheckout(t, dir)
	for _, c := range cmds {
		cmd := c[1]
		if strings.ContainsAny(cmd, `'"\$`) {
			t.Fatalf("%q: quoting or expansion this test does not replay", cmd)
		}
		args := strings.Fields(cmd)[1:] // after "make"
		var config string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "CONFIG="); ok {
				config = v
			}
		}
		if config == "" || strings.Contains(config, " ") {
			t.Fatalf("%q: want one file in CONFIG=", cmd)
		}
		path := filepath.Join(dir, filepath.FromSlash(config))

		if _, err := os.Stat(path); err == nil {
			out := makeIn(t, dir, args...)
			checkLintOK(t, cmd+" (the repository's "+config+")", config, out)
		}

		if err := os.WriteFile(path, []byte(bootstrap), 0o644); err != nil {
			t.Fatal(err)
		}
		out := makeIn(t, dir, args...)
		checkLintOK(t, cmd+" (the README's bootstrap)", config, out)

		if err := os.WriteFile(path, []byte(strings.Replace(bootstrap, good, refused, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		o, err := makeCmd(dir, args...).CombinedOutput()
		const line = "tokenbucket: invalid configuration, refusing to start: config: rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5"
		if err == nil || !strings.Contains(string(o), "FAIL "+config) || !strings.Contains(string(o), line) {
			t.Errorf("%s on a bootstrap the plugin refuses: %v, want a failure printing FAIL %s and %q:\n%s", cmd, err, config, line, o)
		}
	}
}

// checkLintOK fails t unless out, what cmd printed, says the plugin's
// configuration in config passed and nothing failed.
func checkLintOK(t *testing.T, cmd, config, out string) {
	t.Helper()
	if !strings.Contains(out, "ok   "+config+" ") || strings.Contains(out, "FAIL") {
		t.Errorf("%s printed no ok line for %s, or a FAIL:\n%s", cmd, config, out)
	}
}
