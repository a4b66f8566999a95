// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
)

// TestRelease runs `make release` in a copy of this checkout made a git
// repository of its own, tagged v9.8.7: the release is named after the tag,
// holds the plugin, its image (layout and archive) with the Istio manifests
// naming it, limitd and its image, and a SHA256SUMS that covers every file
// and matches it; the plugin is the one `make build` makes, and its image
// digest the one `make oci` gives; it holds the native module for linux/amd64
// (make build-native's) and linux/arm64 (cross-compiled), each with its
// image (with the installer of its architecture), the amd64 one named by
// the native manifests, both within the
// documented C library floor. A tree with uncommitted changes is
// refused (so is an untracked file: it could be built in), unless RELEASE_DIRTY=1 (the version then ends in -dirty);
// VERSION names a release without a tag.
func TestRelease(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	dir := t.TempDir()
	copyCheckout(t, dir)
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com",
			"-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "release test")
	git("tag", "v9.8.7")

	const repo = "registry.example.com/acme"
	makeIn(t, dir, "release", "RELEASE_REPO="+repo)
	rel := filepath.Join(dir, "build", "release", "v9.8.7")
	sums := checkSums(t, rel)
	for _, name := range []string{
		"tokenbucket-v9.8.7.wasm", "tokenbucket-v9.8.7-oci.tar", "tokenbucket-v9.8.7-oci.json",
		"tokenbucket-v9.8.7-oci/index.json", "tokenbucket-v9.8.7-oci/oci-layout",
		"istio/wasmplugin-gateway.yaml", "istio/wasmplugin-sidecar.yaml",
		"limitd-v9.8.7-oci.tar", "limitd-v9.8.7-oci.json", "limitd-v9.8.7-oci/index.json",
		"libtokenbucket-v9.8.7-linux-amd64.so", "libtokenbucket-v9.8.7-linux-arm64.so",
		"tokenbucket-native-v9.8.7-linux-amd64-oci.tar", "tokenbucket-native-v9.8.7-linux-amd64-oci.json",
		"tokenbucket-native-v9.8.7-linux-arm64-oci.tar", "tokenbucket-native-v9.8.7-linux-arm64-oci.json",
		"istio/native-envoyfilter.yaml", "envoy-gateway/native.yaml",
	} {
		if _, ok := sums[name]; !ok {
			t.Errorf("release has no %s (SHA256SUMS: %v)", name, sortedNames(sums))
		}
	}
	limitdBins, _ := filepath.Glob(filepath.Join(rel, "limitd-v9.8.7-linux-*"))
	if len(limitdBins) != 1 {
		t.Errorf("release has %d limitd-v9.8.7-linux-* binaries, want 1", len(limitdBins))
	}
	// The release's version is stamped into what it ships (internal/version).
	if bin := filepath.Join(rel, "limitd-v9.8.7-linux-"+runtime.GOARCH); slices.Contains(limitdBins, bin) {
		if out, err := exec.Command(bin, "--version").Output(); err != nil || string(out) != "limitd v9.8.7\n" {
			t.Errorf("%s --version: %q, %v; want %q", filepath.Base(bin), out, err, "limitd v9.8.7\n")
		}
	}

	// The plugin is make build's, its image what make oci would build.
	wasm, err := os.ReadFile(filepath.Join(rel, "tokenbucket-v9.8.7.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := os.ReadFile(filepath.Join(dir, "build", "plugin.wasm"))
	if err != nil || !bytes.Equal(wasm, built) {
		t.Fatalf("tokenbucket-v9.8.7.wasm is not build/plugin.wasm (%v)", err)
	}
	if !bytes.Contains(wasm, []byte("v9.8.7")) {
		t.Error("tokenbucket-v9.8.7.wasm does not hold its version, v9.8.7")
	}
	img, err := oci.Build(wasm, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var summary struct {
		Ref, ImageSHA256, WasmSHA256 string
	}
	b, err := os.ReadFile(filepath.Join(rel, "tokenbucket-v9.8.7-oci.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &struct {
		Ref         *string `json:"ref"`
		ImageSHA256 *string `json:"image_sha256"`
		WasmSHA256  *string `json:"wasm_sha256"`
	}{&summary.Ref, &summary.ImageSHA256, &summary.WasmSHA256}); err != nil {
		t.Fatal(err)
	}
	d := img.Digests()
	if summary.Ref != repo+"/tokenbucket:v9.8.7" || summary.ImageSHA256 != d.Image.Hex || summary.WasmSHA256 != d.Wasm.Hex {
		t.Errorf("summary %+v, want ref %s/tokenbucket:v9.8.7, image %s, wasm %s", summary, repo, d.Image.Hex, d.Wasm.Hex)
	}
	if summary.WasmSHA256 != sums["tokenbucket-v9.8.7.wasm"] {
		t.Errorf("SHA256SUMS gives the plugin %s, its image %s", sums["tokenbucket-v9.8.7.wasm"], summary.WasmSHA256)
	}
	f, err := os.Open(filepath.Join(rel, "tokenbucket-v9.8.7-oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := oci.ReadArchive(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if h, err := fromTar.Digest(); err != nil || h.Hex != d.Image.Hex {
		t.Errorf("tokenbucket-v9.8.7-oci.tar holds image %v (%v), want %s", h, err, d.Image.Hex)
	}
	gw, err := os.ReadFile(filepath.Join(rel, "istio", "wasmplugin-gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(gw, []byte("url: oci://"+repo+"/tokenbucket:v9.8.7\n")) || !bytes.Contains(gw, []byte(`sha256: "`+d.Image.Hex+`"`)) {
		t.Errorf("istio/wasmplugin-gateway.yaml does not name the release's image:\n%s", gw)
	}

	// The native modules: amd64 is make build-native's, arm64 an aarch64
	// shared object; each image is the one oci.BuildModule makes of it, and
	// the manifests pin the amd64 one by digest.
	makeIn(t, dir, "build-native", "BUILD_VERSION=v9.8.7") // the release stamped its version
	native, err := os.ReadFile(filepath.Join(dir, "build", "libtokenbucket.so"))
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		so, err := os.ReadFile(filepath.Join(rel, "libtokenbucket-v9.8.7-linux-"+arch+".so"))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := oci.SharedObjectArch(so); err != nil || got != arch {
			t.Errorf("libtokenbucket-v9.8.7-linux-%s.so: architecture %q (%v)", arch, got, err)
		}
		// The C library floor docs/compatibility.md states holds for both.
		need, sym, err := elftest.HighestGlibc(filepath.Join(rel, "libtokenbucket-v9.8.7-linux-"+arch+".so"))
		if err != nil {
			t.Fatal(err)
		}
		if floor, err := elftest.DocumentedGlibcFloor(dir); err != nil || elftest.CompareVersions(need, floor) > 0 {
			t.Errorf("libtokenbucket-v9.8.7-linux-%s.so needs GLIBC_%s (%s), above the documented floor %s (%v)", arch, need, sym, floor, err)
		}
		if arch == runtime.GOARCH && !bytes.Equal(so, native) {
			t.Errorf("libtokenbucket-v9.8.7-linux-%s.so is not build/libtokenbucket.so", arch)
		}
		installer, err := os.ReadFile(filepath.Join(dir, "build", "installmodule-linux-"+arch))
		if err != nil {
			t.Fatal(err)
		}
		im, err := oci.BuildModule(so, installer, time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		layout, err := oci.ReadLayout(filepath.Join(rel, "tokenbucket-native-v9.8.7-linux-"+arch+"-oci"))
		if err != nil {
			t.Fatal(err)
		}
		if d, err := oci.VerifyModule(layout, so, installer); err != nil || d != im.Digests().Image {
			t.Errorf("tokenbucket-native-v9.8.7-linux-%s-oci: %v (%v), want the image of the module and the installer %v", arch, d, err, im.Digests().Image)
		}
		var ns struct {
			Ref         string `json:"ref"`
			ImageDigest string `json:"image_digest"`
		}
		b, err := os.ReadFile(filepath.Join(rel, "tokenbucket-native-v9.8.7-linux-"+arch+"-oci.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &ns); err != nil {
			t.Fatal(err)
		}
		want := repo + "/tokenbucket-native:v9.8.7-" + arch
		if ns.Ref != want || ns.ImageDigest != im.Digests().Image.String() {
			t.Errorf("native %s summary %+v, want %s at %s", arch, ns, want, im.Digests().Image)
		}
		if arch != "amd64" {
			continue
		}
		for _, m := range []string{"istio/native-envoyfilter.yaml", "envoy-gateway/native.yaml"} {
			b, err := os.ReadFile(filepath.Join(rel, m))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(b, []byte("image: "+want+"@"+ns.ImageDigest)) || bytes.Contains(b, []byte("tokenbucket-native:0.1.0")) {
				t.Errorf("%s does not pin %s@%s", m, want, ns.ImageDigest)
			}
		}
	}

	// Uncommitted changes: refused, or named -dirty when allowed.
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := makeCmd(dir, "release").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "uncommitted changes") {
		t.Errorf("make release in a dirty tree: %v, want a refusal:\n%s", err, out)
	}
	makeIn(t, dir, "release", "RELEASE_DIRTY=1")
	checkSums(t, filepath.Join(dir, "build", "release", "v9.8.7-dirty"))
	git("checkout", "--", "README.md")
	untracked := filepath.Join(dir, "plugin", "extra.go")
	if err := os.WriteFile(untracked, []byte("package plugin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := makeCmd(dir, "release").CombinedOutput(); err == nil {
		t.Errorf("make release with an untracked source file succeeded:\n%s", out)
	}
	if err := os.Remove(untracked); err != nil {
		t.Fatal(err)
	}

	// VERSION names it; a version that is not a file name is refused.
	makeIn(t, dir, "release", "VERSION=1.0.0-rc1")
	checkSums(t, filepath.Join(dir, "build", "release", "1.0.0-rc1"))
	if out, err := makeCmd(dir, "release", "VERSION=../x").CombinedOutput(); err == nil {
		t.Errorf("make release VERSION=../x succeeded:\n%s", out)
	}
}

// checkSums reads dir/SHA256SUMS, checks that it lists every other file of
// dir with its sha256, and returns it by file name.
func checkSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q: want <sha256>  <name>", sc.Text())
		}
		sums[name] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "SHA256SUMS" {
			return err
		}
		files++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		if got := hex.EncodeToString(h[:]); sums[filepath.ToSlash(rel)] != got {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %q", rel, got, sums[filepath.ToSlash(rel)])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files != len(sums) {
		t.Errorf("%s: %d files, SHA256SUMS lists %d", dir, files, len(sums))
	}
	return sums
}

func sortedNames(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
