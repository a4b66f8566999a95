// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// examples returns the manifests of examples/istio (the Envoy bootstrap
// template aside).
func examples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../examples/istio/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if filepath.Base(f) != "envoy-istio.yaml" {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		t.Fatal("no manifests in examples/istio")
	}
	return out
}

func runValidate(args ...string) (int, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String() + errOut.String()
}

func TestExamplesAreValid(t *testing.T) {
	code, out := runValidate(append([]string{"-require-clusters"}, examples(t)...)...)
	if code != 0 || !strings.Contains(out, "2 WasmPlugin(s), 2 native-module filter(s) in EnvoyFilters") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// edited writes the gateway example with old replaced by new and returns
// its path.
func edited(t *testing.T, old, new string) string {
	t.Helper()
	b, err := os.ReadFile("../../examples/istio/wasmplugin-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("wasmplugin-gateway.yaml has no %q", old)
	}
	p := filepath.Join(t.TempDir(), "wasmplugin-gateway.yaml")
	if err := os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOwnChoicesAreNotJudged: edits a user may legitimately make to the
// example pass; a Service for the limit service may live elsewhere (a note,
// not a failure, without -require-clusters).
func TestOwnChoicesAreNotJudged(t *testing.T) {
	for _, e := range [][2]string{
		{"failStrategy: FAIL_OPEN", "failStrategy: FAIL_CLOSE"},
		{"phase: AUTHZ", "phase: STATS"},
		{"istio: ingressgateway", "app: my-gateway"},
		{"failure_mode: allow", "failure_mode: deny"},
		{"imagePullPolicy: IfNotPresent", "imagePullPolicy: Always"},
		{`sha256: "0000000000000000000000000000000000000000000000000000000000000000"`, ""},
		{"url: oci://ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", "url: https://example.com/plugin.wasm"},
	} {
		code, out := runValidate(edited(t, e[0], e[1]))
		if code != 0 || !strings.Contains(out, "note ") {
			t.Errorf("%q -> %q: exit %d, want 0 with a note on the cluster:\n%s", e[0], e[1], code, out)
		}
	}
}

// TestInvalidManifestsFail: what Istio's API server or the plugin would
// refuse fails, naming the cause.
func TestInvalidManifestsFail(t *testing.T) {
	for _, e := range []struct{ old, new, want string }{
		{"failStrategy: FAIL_OPEN", "failStrategyy: FAIL_OPEN", "failStrategyy"},
		{"failStrategy: FAIL_OPEN", "failStrategy: FAIL_SOMETIMES", "FAIL_SOMETIMES"},
		{"pluginName: ratelimit-gateway", "plugin_name: ratelimit-gateway", "camelCase"},
		{"max_keys: 100000", "max_key: 100000", "max_key"},
		{"max_keys: 100000", "max_keys: 3", "max_keys"},
		{"timeout_ms: 50", "timeout_ms: 0", "timeout_ms"},
		{"url: oci://ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", "url: ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", "spec.url"},
		{`sha256: "0000000000000000000000000000000000000000000000000000000000000000"`, `sha256: "sha256:00"`, "spec.sha256"},
		{"cluster: outbound|8429||limitd.ratelimit.svc.cluster.local", "cluster: limitd", "not a cluster Istio builds"},
	} {
		code, out := runValidate(edited(t, e.old, e.new))
		if code != 1 || !strings.Contains(out, e.want) {
			t.Errorf("%q -> %q: exit %d, want 1 naming %q:\n%s", e.old, e.new, code, e.want, out)
		}
	}
	// A cluster the given manifests do not create fails with -require-clusters.
	if code, out := runValidate("-require-clusters", edited(t, "phase: AUTHZ", "phase: AUTHZ")); code != 1 ||
		!strings.Contains(out, "no Service or ServiceEntry") {
		t.Errorf("-require-clusters without the Service: exit %d\n%s", code, out)
	}
	if code, _ := runValidate(); code != 2 {
		t.Errorf("no arguments: exit %d, want 2", code)
	}
	if code, out := runValidate(filepath.Join(t.TempDir(), "missing.yaml")); code != 1 || !strings.Contains(out, "FAIL") {
		t.Errorf("missing file: exit %d\n%s", code, out)
	}
}

// TestRenderedManifests validates what `make oci` rendered into build/istio,
// when it exists (make validate-istio runs make oci first).
func TestRenderedManifests(t *testing.T) {
	files, _ := filepath.Glob("../../build/istio/*.yaml")
	if len(files) == 0 {
		t.Skip("no build/istio/*.yaml (make oci renders them)")
	}
	if code, out := runValidate(files...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// TestImage: with -image, every WasmPlugin must name that image (its oci://
// reference and digest); another reference or digest fails, and the
// manifests are only read.
func TestImage(t *testing.T) {
	zero := strings.Repeat("0", 64)
	summary := func(ref, image string) string {
		p := filepath.Join(t.TempDir(), "plugin-oci.json")
		b := `{"ref": "` + ref + `", "image_sha256": "` + image + `", "wasm_sha256": "` + strings.Repeat("1", 64) + `"}`
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	files := examples(t)
	before := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		before[f] = b
	}
	if code, out := runValidate(append([]string{"-image", summary("ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", zero)}, files...)...); code != 0 {
		t.Errorf("the examples' own image: exit %d:\n%s", code, out)
	}
	code, out := runValidate(append([]string{"-image", summary("localhost/ratelimit-wasm/tokenbucket:dev", zero)}, files...)...)
	if code != 1 || !strings.Contains(out, `spec.url "oci://ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", want "oci://localhost/ratelimit-wasm/tokenbucket:dev"`) {
		t.Errorf("another reference: exit %d:\n%s", code, out)
	}
	code, out = runValidate(append([]string{"-image", summary("ghcr.io/ratelimit-wasm/tokenbucket:0.1.0", strings.Repeat("a", 64))}, files...)...)
	if code != 1 || !strings.Contains(out, "spec.sha256 \""+zero+"\", want the image digest") {
		t.Errorf("another digest: exit %d:\n%s", code, out)
	}
	if code, out := runValidate("-image", filepath.Join(t.TempDir(), "missing.json"), files[0]); code != 1 || !strings.Contains(out, "-image") {
		t.Errorf("a missing summary: exit %d:\n%s", code, out)
	}
	for _, f := range files {
		if b, _ := os.ReadFile(f); !bytes.Equal(b, before[f]) {
			t.Errorf("%s changed", f)
		}
	}
}

// TestNativeImage: with -native-image, every image a proxy loads the native
// module from (the init container of each Deployment that writes the
// emptyDir istio-proxy mounts at its search path, or an image volume
// mounted there) must be that image pinned by its digest: the example as
// `make oci-native` renders it passes; another digest, or the example's own
// tag without a digest, fails for each of its two Deployments; the older
// layout, an image volume in the gateway's pod and the sidecar's userVolume
// annotation, is checked the same way.
func TestNativeImage(t *testing.T) {
	src, err := os.ReadFile("../../examples/istio/native-envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const tag = "ghcr.io/ratelimit-wasm/tokenbucket-native:0.1.0"
	if bytes.Count(src, []byte(tag)) != 2 {
		t.Fatalf("the example names %s %d times, want 2 (the init containers of the gateway and of the sidecar's pod)", tag, bytes.Count(src, []byte(tag)))
	}
	digest := "sha256:" + strings.Repeat("a", 64)
	dir := t.TempDir()
	rendered := filepath.Join(dir, "native-envoyfilter.yaml")
	if err := os.WriteFile(rendered, bytes.ReplaceAll(src, []byte(tag), []byte("r.example/tb-native:1@"+digest)), 0o644); err != nil {
		t.Fatal(err)
	}
	summary := func(ref, digest string) string {
		p := filepath.Join(t.TempDir(), "native-oci.json")
		b := `{"ref": "` + ref + `", "image_digest": "` + digest + `", "module": "/libtokenbucket.so"}`
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if code, out := runValidate("-native-image", summary("r.example/tb-native:1", digest), rendered); code != 0 {
		t.Errorf("the rendered example: exit %d:\n%s", code, out)
	}
	code, out := runValidate("-native-image", summary("r.example/tb-native:1", "sha256:"+strings.Repeat("b", 64)), rendered)
	if code != 1 || strings.Count(out, `init container "tokenbucket-module" (writing volume "tokenbucket-module") loads the native module from "r.example/tb-native:1@`+digest+`"`) != 2 {
		t.Errorf("another digest: exit %d:\n%s", code, out)
	}
	// An init container that only reads the volume is not where the module
	// comes from: with none writing it, nothing names an image.
	readOnly := filepath.Join(dir, "readonly.yaml")
	ro := bytes.ReplaceAll(src, []byte("          mountPath: /module\n"), []byte("          mountPath: /module\n          readOnly: true\n"))
	if bytes.Count(ro, []byte("readOnly: true\n")) < 2 {
		t.Fatal("the example's init containers do not mount /module as expected")
	}
	if err := os.WriteFile(readOnly, ro, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := runValidate("-native-image", summary("r.example/tb-native:1", digest), readOnly); code != 1 || !strings.Contains(out, "no Deployment loads the native module") {
		t.Errorf("read-only init containers: exit %d:\n%s", code, out)
	}
	// The image volume layout (where the runtime mounts image volumes
	// executable): the gateway's pod volume and the sidecar's annotation.
	volumes := bytes.ReplaceAll(src, []byte("        emptyDir: {}\n"), []byte("        image: {reference: \"r.example/tb-native:1@"+digest+"\"}\n"))
	volumes = bytes.ReplaceAll(volumes, []byte(tag), []byte("r.example/tb-native:1@"+digest))
	volumes = bytes.ReplaceAll(volumes, []byte("          mountPath: /module\n"), []byte("          mountPath: /module\n          readOnly: true\n"))
	imageVolumes := filepath.Join(dir, "image-volumes.yaml")
	if err := os.WriteFile(imageVolumes, volumes, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := runValidate("-native-image", summary("r.example/tb-native:1", digest), imageVolumes); code != 0 {
		t.Errorf("image volumes of the image: exit %d:\n%s", code, out)
	}
	code, out = runValidate("-native-image", summary("r.example/tb-native:1", "sha256:"+strings.Repeat("b", 64)), imageVolumes)
	if code != 1 || strings.Count(out, `image volume "tokenbucket-module" loads the native module from "r.example/tb-native:1@`+digest+`"`) != 2 {
		t.Errorf("image volumes, another digest: exit %d:\n%s", code, out)
	}
	code, out = runValidate("-native-image", summary("r.example/tb-native:1", digest), "../../examples/istio/native-envoyfilter.yaml")
	if code != 1 || strings.Count(out, `from "`+tag+`"`) != 2 {
		t.Errorf("the example's tag: exit %d:\n%s", code, out)
	}
	code, out = runValidate("-native-image", summary("r.example/tb-native:1", digest), "../../examples/istio/wasmplugin-gateway.yaml")
	if code != 1 || !strings.Contains(out, "no Deployment loads the native module") {
		t.Errorf("no native manifest: exit %d:\n%s", code, out)
	}
	if code, out := runValidate("-native-image", filepath.Join(dir, "missing.json"), rendered); code != 1 || !strings.Contains(out, "-native-image") {
		t.Errorf("a missing summary: exit %d:\n%s", code, out)
	}
}

// exampleREADME is the Istio example's README, whose ```console
// validate-istio block is a session of `make -s validate-istio
// MANIFESTS='...'`, which runs this command on the files given.
const exampleREADME = "examples/istio/README.md"

// TestExampleSession replays the validate-istio session of the Istio
// example's README from the repository's top, as make runs it: each
// command's files through run, its output exactly the lines the README
// shows, exit status 0.
func TestExampleSession(t *testing.T) {
	t.Chdir("../..")
	b, err := os.ReadFile(exampleREADME)
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "```console validate-istio\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatalf("%s: no closed ```console validate-istio block", exampleREADME)
	}
	type command struct {
		files []string
		want  string
	}
	var cmds []command
	for _, line := range strings.SplitAfter(block, "\n") {
		if rest, ok := strings.CutPrefix(line, "$ "); ok {
			m := regexp.MustCompile(`^make -s validate-istio MANIFESTS='([^']+)'\n$`).FindStringSubmatch(rest)
			if m == nil {
				t.Fatalf("%s: %q is not make -s validate-istio MANIFESTS='...'", exampleREADME, rest)
			}
			cmds = append(cmds, command{files: strings.Fields(m[1])})
			continue
		}
		if len(cmds) == 0 {
			t.Fatalf("%s: output before any command: %q", exampleREADME, line)
		}
		cmds[len(cmds)-1].want += line
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: an empty session", exampleREADME)
	}
	for _, c := range cmds {
		code, out := runValidate(c.files...)
		if code != 0 || out != c.want {
			t.Errorf("validateistio %s: exit %d, printed\n%s\nthe README shows\n%s", strings.Join(c.files, " "), code, out, c.want)
		}
	}
}
