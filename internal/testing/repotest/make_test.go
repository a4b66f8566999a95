// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestValidateIstioKeepsTheReference: `make validate-istio` after `make oci
// OCI_REF=...` (and `make oci-native OCI_NATIVE_REF=...`) validates the
// manifests rendered for that reference and leaves them as they are. (It used to rebuild them with the default
// reference, so the manifests applied next named an image nobody pushed:
// the pull failed and FAIL_OPEN let every request through.)
func TestValidateIstioKeepsTheReference(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	dir := t.TempDir()
	copyCheckout(t, dir)
	const ref = "registry.example.com/acme/tokenbucket:1.2.3"
	makeIn(t, dir, "oci", "OCI_REF="+ref)
	before := readManifests(t, dir)
	if len(before) == 0 {
		t.Fatal("make oci rendered no build/istio/*.yaml")
	}
	out := makeIn(t, dir, "validate-istio")
	t.Logf("make validate-istio:\n%s", out)
	after := readManifests(t, dir)
	for name, b := range before {
		if after[name] != b {
			t.Errorf("make validate-istio rewrote %s", name)
		}
		if !strings.Contains(after[name], "url: oci://"+ref+"\n") {
			t.Errorf("%s does not carry url: oci://%s:\n%s", name, ref, after[name])
		}
	}

	// Manifests that no longer match the image built (the plugin rebuilt
	// after rendering) are refused, not silently re-rendered.
	summary := filepath.Join(dir, "build", "plugin-oci.json")
	b, err := os.ReadFile(summary)
	if err != nil {
		t.Fatal(err)
	}
	var hex string
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && k == `"image_sha256"` {
			hex = strings.Trim(strings.TrimSpace(v), `",`)
		}
	}
	if len(hex) != 64 {
		t.Fatalf("%s: no image_sha256", summary)
	}
	stale := strings.ReplaceAll(string(b), hex, strings.Repeat("0", 64))
	if err := os.WriteFile(summary, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := makeCmd(dir, "validate-istio")
	o, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(o), "sha256") {
		t.Errorf("make validate-istio against another image: err %v, want a failure naming sha256:\n%s", err, o)
	}
	if got := readManifests(t, dir); !maps.Equal(got, before) {
		t.Errorf("make validate-istio rewrote the manifests after a failure")
	}

	// The native module's image: make oci-native renders the native
	// manifests for its reference pinned by digest, validate-istio checks
	// them against build/native-oci.json and leaves them alone, and refuses
	// them once the summary names another image.
	if err := os.WriteFile(summary, b, 0o644); err != nil {
		t.Fatal(err)
	}
	const nativeRef = "registry.example.com/acme/tokenbucket-native:1.2.3"
	makeIn(t, dir, "oci-native", "OCI_NATIVE_REF="+nativeRef)
	native := filepath.Join(dir, "build", "istio", "native-envoyfilter.yaml")
	rendered, err := os.ReadFile(native)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rendered), "image: "+nativeRef+"@sha256:") || strings.Contains(string(rendered), "tokenbucket-native:0.1.0") {
		t.Fatalf("%s does not pin %s:\n%s", native, nativeRef, rendered)
	}
	out = makeIn(t, dir, "validate-istio")
	if !strings.Contains(out, "native-envoyfilter.yaml") {
		t.Errorf("make validate-istio did not validate the native manifests:\n%s", out)
	}
	if again, _ := os.ReadFile(native); string(again) != string(rendered) {
		t.Errorf("make validate-istio rewrote %s", native)
	}
	nativeSummary := filepath.Join(dir, "build", "native-oci.json")
	ns, err := os.ReadFile(nativeSummary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nativeSummary, []byte(strings.Replace(string(ns), nativeRef, "registry.example.com/other:1", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := makeCmd(dir, "validate-istio").CombinedOutput(); err == nil || !strings.Contains(string(o), "loads the native module from") {
		t.Errorf("make validate-istio against another native image: err %v, want a failure:\n%s", err, o)
	}
	if err := os.Remove(nativeSummary); err != nil {
		t.Fatal(err)
	}
	if o, err := makeCmd(dir, "validate-istio").CombinedOutput(); err == nil || !strings.Contains(string(o), "make oci-native") {
		t.Errorf("make validate-istio with native manifests and no native-oci.json: err %v, want a failure naming make oci-native:\n%s", err, o)
	}

	// make oci-native alone, the native module's path in
	// examples/istio/README.md and docs/istio.md: validate-istio validates
	// what was built, the native manifests, without asking for the
	// plugin's image. (Its error asked for the Wasm image.)
	if err := os.Remove(summary); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "build", "istio")); err != nil {
		t.Fatal(err)
	}
	makeIn(t, dir, "oci-native", "OCI_NATIVE_REF="+nativeRef)
	out = makeIn(t, dir, "validate-istio")
	if !strings.Contains(out, "native-envoyfilter.yaml") {
		t.Errorf("make validate-istio after make oci-native alone did not validate the native manifests:\n%s", out)
	}
	if got := readManifests(t, dir); len(got) != 1 || got["native-envoyfilter.yaml"] != string(rendered) {
		t.Errorf("make oci-native alone rendered %d manifests, or validate-istio rewrote them", len(got))
	}

	// Nothing rendered: a failure that says what to run, not a render.
	if err := os.RemoveAll(filepath.Join(dir, "build", "istio")); err != nil {
		t.Fatal(err)
	}
	o, err = makeCmd(dir, "validate-istio").CombinedOutput()
	if err == nil || !strings.Contains(string(o), "make oci OCI_REF=") {
		t.Errorf("make validate-istio with no manifests: err %v, want a failure naming make oci OCI_REF=:\n%s", err, o)
	}
	if _, err := os.Stat(filepath.Join(dir, "build", "istio")); err == nil {
		t.Errorf("make validate-istio with no manifests rendered some")
	}
}

func readManifests(t *testing.T, dir string) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "build", "istio", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m[filepath.Base(p)] = string(b)
	}
	return m
}

// TestLimitdRebuildsOnEverySource: build/limitd is out of date when any
// file compiled or embedded into cmd/limitd changes (every Go package of
// this module it imports, and every //go:embed file such as the Lua
// scripts), as `go list -deps` names them. (The rule listed service/ and
// cmd/limitd and one of the four Lua scripts, so an edited script left a
// stale binary.)
func TestLimitdRebuildsOnEverySource(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .EmbedFiles}}{{$d}}/{{.}} {{end}}{{end}}{{end}}`,
		"./cmd/limitd")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// One Go file per package and every embedded file.
	var sources []string
	seenDir := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(rel, ".go") {
			if seenDir[filepath.Dir(rel)] {
				continue
			}
			seenDir[filepath.Dir(rel)] = true
		}
		sources = append(sources, rel)
	}
	var lua int
	for _, s := range sources {
		if strings.HasSuffix(s, ".lua") {
			lua++
		}
	}
	if lua < 4 {
		t.Fatalf("go list names %d Lua files of cmd/limitd, want the 4 scripts: %v", lua, sources)
	}

	// An up-to-date binary in a build directory of its own: make -q
	// answers 0 while nothing is newer, 1 when -W makes a source newer.
	build := t.TempDir()
	bin := filepath.Join(build, "limitd")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(bin, future, future); err != nil {
		t.Fatal(err)
	}
	if err := makeCmd(root, "-q", "BUILD="+build, bin).Run(); err != nil {
		t.Fatalf("make -q %s with a fresh binary: %v, want up to date", bin, err)
	}
	for _, src := range sources {
		err := makeCmd(root, "-q", "BUILD="+build, "-W", src, bin).Run()
		if err == nil {
			t.Errorf("%s changed, but make -q says %s is up to date: the rule misses it", src, bin)
		}
	}
}
