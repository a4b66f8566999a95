package main

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"sigs.k8s.io/yaml"

	k8smanifest "github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakewasm"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type paths struct{ dir, wasm, layout, archive, summary, rendered string }

func setup(t *testing.T, wasm []byte) paths {
	t.Helper()
	dir := t.TempDir()
	p := paths{
		dir: dir, wasm: filepath.Join(dir, "plugin.wasm"), layout: filepath.Join(dir, "oci"),
		archive: filepath.Join(dir, "plugin-oci.tar"), summary: filepath.Join(dir, "plugin-oci.json"),
		rendered: filepath.Join(dir, "istio"),
	}
	if err := os.WriteFile(p.wasm, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p paths) args(ref string, extra ...string) []string {
	return append([]string{"-wasm", p.wasm, "-layout", p.layout, "-archive", p.archive,
		"-summary", p.summary, "-ref", ref}, extra...)
}

func readSummary(t *testing.T, path string) Summary {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRunPrintsTheDigestsIstioChecks builds an image from a fake module the
// way make oci does and checks that what it prints and records for the
// WasmPlugin's sha256 is the digest of the manifest written to disk (oci://
// urls), and that the other printed digest is sha256(plugin.wasm) (https://
// urls), in the summary, on stdout and in the rendered manifests.
func TestRunPrintsTheDigestsIstioChecks(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	wasm := fakewasm.Module("cmd")
	p := setup(t, wasm)
	const ref = "registry.example/team/ratelimit:1.2.3"
	var out bytes.Buffer
	if err := run(p.args(ref, "-render", "../../examples/istio", "-render-out", p.rendered), &out); err != nil {
		t.Fatal(err)
	}
	s := readSummary(t, p.summary)

	// The manifest the layout's index.json points at, read from disk.
	var idx struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	b, err := os.ReadFile(filepath.Join(p.layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, b)
	}
	hexDigest := strings.TrimPrefix(idx.Manifests[0].Digest, "sha256:")
	manifest, err := os.ReadFile(filepath.Join(p.layout, "blobs", "sha256", hexDigest))
	if err != nil {
		t.Fatal(err)
	}
	if sha(manifest) != hexDigest {
		t.Fatalf("manifest blob %s has sha256 %s", hexDigest, sha(manifest))
	}
	if s.ImageSHA256 != hexDigest || s.ImageDigest != "sha256:"+hexDigest {
		t.Errorf("summary image digest %s / %s, the written manifest's is %s", s.ImageSHA256, s.ImageDigest, hexDigest)
	}
	if s.WasmSHA256 != sha(wasm) || s.WasmSize != int64(len(wasm)) {
		t.Errorf("summary wasm %s (%d bytes), want sha256(plugin.wasm) %s (%d bytes)", s.WasmSHA256, s.WasmSize, sha(wasm), len(wasm))
	}
	text := out.String()
	for _, want := range []string{
		"WasmPlugin with url oci://<repo>:<tag> or oci://<repo>@sha256:" + hexDigest + ":\n  sha256: " + hexDigest + "\n",
		"WasmPlugin with url https://.../plugin.wasm:\n  sha256: " + sha(wasm) + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("stdout lacks %q:\n%s", want, text)
		}
	}

	// The archive holds the same image.
	f, err := os.Open(p.archive)
	if err != nil {
		t.Fatal(err)
	}
	img, err := oci.ReadArchive(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := oci.Verify(img, wasm); err != nil || d.Hex != hexDigest {
		t.Errorf("archive: %s, %v; want %s", d, err, hexDigest)
	}

	// The rendered WasmPlugins point at ref with the image digest.
	if len(s.Manifests) != 2 {
		t.Fatalf("rendered %v, want the two WasmPlugin manifests", s.Manifests)
	}
	for _, m := range s.Manifests {
		y, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(string(y), "\n---\n")
		var wp struct {
			Kind string
			Spec struct{ URL, Sha256 string }
		}
		if err := yaml.Unmarshal([]byte(docs[0]), &wp); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if wp.Kind != "WasmPlugin" || wp.Spec.URL != "oci://"+ref || wp.Spec.Sha256 != hexDigest {
			t.Errorf("%s: kind %s url %s sha256 %s, want WasmPlugin oci://%s %s", m, wp.Kind, wp.Spec.URL, wp.Spec.Sha256, ref, hexDigest)
		}
		// And they are still valid manifests, as make validate-istio checks.
		decoded, err := k8smanifest.DecodeFile(m)
		if err != nil {
			t.Fatalf("rendered %s: %v", m, err)
		}
		if r := k8smanifest.Validate(decoded, k8smanifest.Options{}); len(r.Errors) > 0 || r.Plugins != 1 {
			t.Errorf("rendered %s: %d WasmPlugins, errors %v", m, r.Plugins, r.Errors)
		}
	}
}

func TestRunIsReproducible(t *testing.T) {
	wasm := fakewasm.Module("repro")
	var digests []string
	for _, epoch := range []string{"1700000000", "1700000000", "1700000001"} {
		t.Setenv("SOURCE_DATE_EPOCH", epoch)
		p := setup(t, wasm)
		if err := run(p.args("x/y:z"), io.Discard); err != nil {
			t.Fatal(err)
		}
		digests = append(digests, readSummary(t, p.summary).ImageSHA256)
	}
	if digests[0] != digests[1] || digests[0] == digests[2] {
		t.Errorf("digests %v: want the same for the same SOURCE_DATE_EPOCH, different otherwise", digests)
	}
}

func TestRunPushesToARegistry(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	wasm := fakewasm.Module("push")
	p := setup(t, wasm)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/ratelimit/plugin:e2e"
	if err := run(p.args(ref, "-push"), io.Discard); err != nil {
		t.Fatal(err)
	}
	s := readSummary(t, p.summary)
	if !s.Pushed {
		t.Error("summary says not pushed")
	}
	img, err := oci.Pull(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := oci.Verify(img, wasm); err != nil || d.Hex != s.ImageSHA256 {
		t.Errorf("registry serves %s, %v; make oci printed %s", d, err, s.ImageSHA256)
	}
}

func TestRunRefuses(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	p := setup(t, []byte("not wasm"))
	tests := []struct {
		name    string
		args    []string
		epoch   string
		wantErr string
	}{
		{"not a module", p.args("x/y:z"), "", "not a WebAssembly module"},
		{"bad ref", setup(t, fakewasm.Module("r")).args("UPPER/case:x"), "", "ref"},
		{"bad SOURCE_DATE_EPOCH", setup(t, fakewasm.Module("e")).args("x/y:z"), "yesterday", "SOURCE_DATE_EPOCH"},
		{"stray argument", append(setup(t, fakewasm.Module("s")).args("x/y:z"), "extra"), "", "unexpected arguments"},
		{"render without WasmPlugins", setup(t, fakewasm.Module("n")).args("x/y:z", "-render", t.TempDir()), "", "no WasmPlugin"},
	}
	for _, tt := range tests {
		t.Setenv("SOURCE_DATE_EPOCH", tt.epoch)
		err := run(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestRenderNeedsURLAndSHA256(t *testing.T) {
	src := t.TempDir()
	m := "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nspec:\n  url: oci://a/b:c\n"
	if err := os.WriteFile(filepath.Join(src, "wp.yaml"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := renderManifests(src, t.TempDir(), "x/y:z", strings.Repeat("a", 64))
	if err == nil || !strings.Contains(err.Error(), "0 sha256 line") {
		t.Errorf("render of a WasmPlugin without sha256: %v", err)
	}
}

func TestSourceDateEpoch(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{"", time.Unix(0, 0).UTC(), false},
		{"1700000000", time.Unix(1700000000, 0).UTC(), false},
		{"-1", time.Time{}, true},
		{"1.5", time.Time{}, true},
	}
	for _, tt := range tests {
		got, err := sourceDateEpoch(tt.in)
		if (err != nil) != tt.wantErr || !got.Equal(tt.want) {
			t.Errorf("sourceDateEpoch(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestDocsNameTheSummaryFields keeps the Istio guide (docs/istio.md) and the examples' comments
// in step with the summary: they tell users to copy image_sha256 (oci://) and
// wasm_sha256 (https://) from build/plugin-oci.json.
func TestDocsNameTheSummaryFields(t *testing.T) {
	b, err := json.Marshal(Summary{})
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"image_sha256", "wasm_sha256"} {
		if !bytes.Contains(b, []byte(`"`+field+`"`)) {
			t.Fatalf("Summary has no field %s: %s", field, b)
		}
		for _, doc := range []string{"../../docs/istio.md", "../../examples/istio/wasmplugin-gateway.yaml"} {
			text, err := os.ReadFile(doc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(text, []byte(field)) {
				t.Errorf("%s does not name %s", doc, field)
			}
		}
	}
}

// TestRunExecutable builds a container image of a static executable as make
// oci-limitd does: written as a layout and an archive, both read back and
// verified, the same digest for the same binary, a summary naming the
// non-root user.
func TestRunExecutable(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	var digests []string
	for _, payload := range []string{"a", "a", "b"} {
		dir := t.TempDir()
		exe := filepath.Join(dir, "limitd")
		if err := os.WriteFile(exe, elftest.Fake(elf.EM_X86_64, false, payload), 0o755); err != nil {
			t.Fatal(err)
		}
		layout, archive, summary := filepath.Join(dir, "limitd-oci"), filepath.Join(dir, "limitd-oci.tar"), filepath.Join(dir, "limitd-oci.json")
		var out bytes.Buffer
		err := run([]string{"-exe", exe, "-exe-port", "8429", "-exe-cmd", "--listen=:8429", "-layout", layout,
			"-archive", archive, "-summary", summary, "-ref", "localhost/ratelimit-wasm/limitd:dev"}, &out)
		if err != nil {
			t.Fatal(err)
		}
		s := readSummary(t, summary)
		if s.Executable != "/usr/local/bin/limitd" || s.User != "65532:65532" || s.WasmSHA256 != "" ||
			!strings.Contains(out.String(), s.ImageDigest) {
			t.Errorf("summary %+v\nprinted:\n%s", s, out.String())
		}
		f, err := os.Open(archive)
		if err != nil {
			t.Fatal(err)
		}
		img, err := oci.ReadArchive(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil || strings.Join(cf.Config.Cmd, " ") != "--listen=:8429" {
			t.Errorf("config %+v, %v", cf, err)
		}
		digests = append(digests, s.ImageDigest)
	}
	if digests[0] != digests[1] || digests[0] == digests[2] {
		t.Errorf("digests %v: want the same for the same binary, different otherwise", digests)
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "limitd")
	if err := os.WriteFile(exe, elftest.Fake(elf.EM_X86_64, true, ""), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-exe", exe, "-layout", filepath.Join(dir, "o"), "-archive", ""}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("a dynamic executable: %v, want a refusal", err)
	}
}

// TestRunModule builds the native module's image as make oci-native does:
// written as a layout and an archive, both read back and verified, the same
// digest for the same module, a summary naming the module, and the native
// manifests rendered with every image volume reference and every container
// image named .../tokenbucket-native pinned to <ref>@<image digest> (other
// images kept), each to its own folder.
func TestRunModule(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	src := t.TempDir()
	istio := filepath.Join(src, "native-envoyfilter.yaml")
	gateway := filepath.Join(src, "native.yaml")
	if err := os.WriteFile(istio, []byte("kind: Deployment\nspec:\n  volumes:\n  - image:\n      reference: ghcr.io/x/old:1 # yours\n"+
		"  annotations:\n    a: '{\"m\":{\"image\":{\"reference\":\"ghcr.io/x/old:1\",\"pullPolicy\":\"IfNotPresent\"}}}'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gateway, []byte("initContainers:\n- name: m\n  image: ghcr.io/x/tokenbucket-native:old # yours\n"+
		"- name: other\n  image: registry.example.com/other:1.0\n- image: ghcr.io/x/tokenbucket-native@sha256:0123\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var digests []string
	for _, payload := range []string{"a", "a", "b"} {
		dir := t.TempDir()
		so := filepath.Join(dir, "libtokenbucket.so")
		if err := os.WriteFile(so, elftest.FakeShared(elf.EM_X86_64, payload), 0o755); err != nil {
			t.Fatal(err)
		}
		inst := filepath.Join(dir, "installmodule")
		if err := os.WriteFile(inst, elftest.Fake(elf.EM_X86_64, false, "installer"), 0o755); err != nil {
			t.Fatal(err)
		}
		summary := filepath.Join(dir, "native-oci.json")
		var out bytes.Buffer
		ref := "localhost/ratelimit-wasm/tokenbucket-native:dev"
		err := run([]string{"-module", so, "-module-installer", inst, "-layout", filepath.Join(dir, "native-oci"), "-archive", filepath.Join(dir, "native-oci.tar"),
			"-summary", summary, "-ref", ref, "-render-native", istio + "=" + filepath.Join(dir, "istio") + " " + gateway + "=" + filepath.Join(dir, "eg")}, &out)
		if err != nil {
			t.Fatal(err)
		}
		s := readSummary(t, summary)
		if s.Module != "/libtokenbucket.so" || s.Architecture != "amd64" || s.ModuleSHA256 != sha(elftest.FakeShared(elf.EM_X86_64, payload)) ||
			s.WasmSHA256 != "" || !strings.Contains(out.String(), ref+"@"+s.ImageDigest) {
			t.Errorf("summary %+v\nprinted:\n%s", s, out.String())
		}
		pinned := ref + "@" + s.ImageDigest
		for _, f := range []string{filepath.Join(dir, "istio", "native-envoyfilter.yaml"), filepath.Join(dir, "eg", "native.yaml")} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "old:1") || strings.Contains(string(b), "native:old") || strings.Contains(string(b), "@sha256:0123") ||
				!strings.Contains(string(b), pinned) {
				t.Errorf("%s does not pin the image:\n%s", f, b)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "eg", "native.yaml")); !strings.Contains(string(b), "  image: "+pinned+" # yours\n") ||
			!strings.Contains(string(b), "- image: "+pinned+"\n") || !strings.Contains(string(b), "image: registry.example.com/other:1.0\n") {
			t.Errorf("the init containers' images:\n%s", b)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "istio", "native-envoyfilter.yaml")); !strings.Contains(string(b), "reference: "+pinned) {
			t.Errorf("the image volume's reference:\n%s", b)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "istio", "native-envoyfilter.yaml")); !strings.Contains(string(b), `"reference":"`+pinned+`"`) ||
			!strings.Contains(string(b), "# yours") {
			t.Errorf("the annotation's reference or the comment:\n%s", b)
		}
		digests = append(digests, s.ImageDigest)
	}
	if digests[0] != digests[1] || digests[0] == digests[2] {
		t.Errorf("digests %v: want the same for the same module, different otherwise", digests)
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "libtokenbucket.so")
	if err := os.WriteFile(exe, elftest.Fake(elf.EM_X86_64, false, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	inst := filepath.Join(dir, "installmodule")
	if err := os.WriteFile(inst, elftest.Fake(elf.EM_X86_64, false, "i"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-module", exe, "-module-installer", inst, "-layout", filepath.Join(dir, "o"), "-archive", ""}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "not a shared object") {
		t.Errorf("an executable as -module: %v, want a refusal", err)
	}
	if err := run([]string{"-module", exe, "-exe", exe, "-layout", filepath.Join(dir, "o")}, io.Discard); err == nil {
		t.Error("-module with -exe: accepted")
	}
	if err := os.WriteFile(gateway, []byte("no references here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "lib.so")
	if err := os.WriteFile(so, elftest.FakeShared(elf.EM_X86_64, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-module", so, "-layout", filepath.Join(dir, "o"), "-archive", ""}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "-module-installer") {
		t.Errorf("-module without an installer: %v", err)
	}
	if err := run([]string{"-module", so, "-module-installer", inst, "-layout", filepath.Join(dir, "o"), "-archive", "", "-render-native", gateway,
		"-render-out", filepath.Join(dir, "r")}, io.Discard); err == nil || !strings.Contains(err.Error(), "no reference to the native module's image") {
		t.Errorf("a manifest without a reference: %v", err)
	}
}

// TestRunExecutableAlias: -exe-alias puts a symbolic link to the
// executable in the image (limitd's /bin/ratelimit), which the image read
// back from the archive holds.
func TestRunExecutableAlias(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	dir := t.TempDir()
	exe := filepath.Join(dir, "limitd")
	bin := elftest.Fake(elf.EM_X86_64, false, "a")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	archive, summary := filepath.Join(dir, "limitd-oci.tar"), filepath.Join(dir, "limitd-oci.json")
	var out bytes.Buffer
	if err := run([]string{"-exe", exe, "-exe-alias", "/bin/ratelimit", "-layout", filepath.Join(dir, "limitd-oci"),
		"-archive", archive, "-summary", summary}, &out); err != nil {
		t.Fatal(err)
	}
	if s := readSummary(t, summary); len(s.Aliases) != 1 || s.Aliases[0] != "/bin/ratelimit" ||
		!strings.Contains(out.String(), "/bin/ratelimit -> /usr/local/bin/limitd") {
		t.Errorf("summary %+v\nprinted:\n%s", s, out.String())
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	img, err := oci.ReadArchive(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	e := oci.Executable{Name: "limitd", Binary: bin, Aliases: []string{"/bin/ratelimit"}}
	if _, err := oci.VerifyExecutable(img, e); err != nil {
		t.Errorf("read back: %v", err)
	}
	e.Aliases = nil
	if _, err := oci.VerifyExecutable(img, e); err == nil {
		t.Error("read back: a link not asked for went unnoticed")
	}
}
