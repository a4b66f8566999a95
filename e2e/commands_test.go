// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// startCmdRE is the command an example's README gives to start it from the
// repository's top: the Envoy `make setup` installs, on the example's
// envoy.yaml.
var startCmdRE = regexp.MustCompile(`(?m)^(build/venv/bin/envoy) -c (\S+)$`)

// TestExampleStartCommands runs the command each example's README gives to
// start it, as written from the repository's top, in Envoy's validate mode
// (`--mode validate` added: Envoy loads the configuration and the plugin from
// the path written in it, starts the plugin, which parses its
// configuration, and exits instead of serving on the README's fixed ports).
// TestExamples boots the same files with free ports and the plugin's path
// replaced; this checks what it replaces: the binary's path, the file's path
// and the plugin's path as a user runs them. It needs `make setup build`,
// as the READMEs say.
//
// Wasm only: the examples' start commands load the Wasm filter.
func TestExampleStartCommands(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	matches, err := filepath.Glob(filepath.Join(root, "examples", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	type command struct{ example, bin, config string }
	var cmds []command
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range startCmdRE.FindAllStringSubmatch(string(b), -1) {
			cmds = append(cmds, command{filepath.Base(filepath.Dir(m)), c[1], c[2]})
		}
	}
	if len(cmds) < 5 {
		t.Fatalf("%d example READMEs give a build/venv/bin/envoy -c command, want at least 5", len(cmds))
	}
	for _, need := range []struct{ path, make string }{{"build/venv/bin/envoy", "make setup"}, {"build/plugin.wasm", "make build"}} {
		if _, err := os.Stat(filepath.Join(root, need.path)); err != nil {
			ci.Skip(t, "no %s (run `%s`)", need.path, need.make)
		}
	}
	for _, c := range cmds {
		t.Run(c.example, func(t *testing.T) {
			if want := "examples/" + c.example + "/envoy.yaml"; c.config != want {
				t.Errorf("the README starts %s, want its own %s", c.config, want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, c.bin, "--mode", "validate", "-c", c.config, "--log-level", "warn")
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "' OK") {
				t.Fatalf("%s --mode validate -c %s: %v, want OK:\n%s", c.bin, c.config, err, out)
			}
		})
	}
}
