// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package oci_test

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
)

func limitdExe(payload string) oci.Executable {
	return oci.Executable{Name: "limitd", Binary: elftest.Fake(elf.EM_X86_64, false, payload), Cmd: []string{"--listen=:8429"}, Ports: []int{8429}}
}

// TestBuildExecutable checks the image of a static executable: platform,
// non-root user, entrypoint, ports, and a layer holding the binary owned by
// root beside /etc/passwd naming the user; and that it is reproducible.
func TestBuildExecutable(t *testing.T) {
	e := limitdExe("v1")
	im, err := oci.BuildExecutable(e, t0)
	if err != nil {
		t.Fatal(err)
	}
	img := mustV1(t, im)
	if d, err := oci.VerifyExecutable(img, e); err != nil || d != im.Digests().Image {
		t.Fatalf("VerifyExecutable = %v, %v; want %v", d, err, im.Digests().Image)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.User != "65532:65532" ||
		cf.Config.Entrypoint[0] != "/usr/local/bin/limitd" || !cf.Created.Equal(t0) {
		t.Errorf("config: %+v", cf)
	}
	if _, ok := cf.Config.ExposedPorts["8429/tcp"]; !ok {
		t.Errorf("ExposedPorts %v lack 8429/tcp", cf.Config.ExposedPorts)
	}
	seen := map[string]*tar.Header{}
	for _, en := range layerEntries(t, img) {
		seen[en.hdr.Name] = en.hdr
		if en.hdr.Name == "etc/passwd" && !strings.Contains(string(en.body), "nonroot:x:65532:65532:") {
			t.Errorf("/etc/passwd: %q", en.body)
		}
	}
	for name, want := range map[string]struct {
		mode int64
		uid  int
	}{"usr/local/bin/limitd": {0o755, 0}, "home/nonroot/": {0o700, 65532}, "tmp/": {0o1777, 0}, "etc/group": {0o644, 0}} {
		h := seen[name]
		if h == nil || h.Mode != want.mode || h.Uid != want.uid || !h.ModTime.Equal(t0) {
			t.Errorf("%s: %+v, want mode %o uid %d", name, h, want.mode, want.uid)
		}
	}

	again, err := oci.BuildExecutable(limitdExe("v1"), t0)
	if err != nil || again.Digests() != im.Digests() {
		t.Errorf("same executable, other digests: %+v vs %+v (%v)", again.Digests(), im.Digests(), err)
	}
	other, err := oci.BuildExecutable(limitdExe("v2"), t0)
	if err != nil || other.Digests().Image == im.Digests().Image {
		t.Errorf("another executable, the same digest (%v)", err)
	}
	if _, err := oci.VerifyExecutable(img, limitdExe("v2")); err == nil {
		t.Error("VerifyExecutable accepted another executable")
	}
}

// TestExecutableLayoutAndArchive writes the image as make oci-limitd does and
// reads both forms back.
func TestExecutableLayoutAndArchive(t *testing.T) {
	e := limitdExe("x")
	im, err := oci.BuildExecutable(e, t0)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "limitd-oci")
	if err := oci.WriteLayout(dir, mustV1(t, im), "localhost/ratelimit-wasm/limitd:dev"); err != nil {
		t.Fatal(err)
	}
	back, err := oci.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := oci.VerifyExecutable(back, e); err != nil || d != im.Digests().Image {
		t.Fatalf("layout: %v, %v", d, err)
	}
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, dir, t0); err != nil {
		t.Fatal(err)
	}
	fromTar, err := oci.ReadArchive(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := oci.VerifyExecutable(fromTar, e); err != nil || d != im.Digests().Image {
		t.Fatalf("archive: %v, %v", d, err)
	}
}

func TestBuildExecutableRejects(t *testing.T) {
	for want, e := range map[string]oci.Executable{
		"not an ELF file":    {Name: "limitd", Binary: []byte("#!/bin/sh\n")},
		"dynamically linked": {Name: "limitd", Binary: elftest.Fake(elf.EM_X86_64, true, "")},
		"is not supported":   {Name: "limitd", Binary: elftest.Fake(elf.EM_386, false, "")},
		`name ""`:            {Binary: elftest.Fake(elf.EM_X86_64, false, "")},
		`name "../limitd"`:   {Name: "../limitd", Binary: elftest.Fake(elf.EM_X86_64, false, "")},
		"port 70000":         {Name: "limitd", Binary: elftest.Fake(elf.EM_X86_64, false, ""), Ports: []int{70000}},
	} {
		if _, err := oci.BuildExecutable(e, t0); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
	if arch, err := oci.StaticELFArch(elftest.Fake(elf.EM_AARCH64, false, "")); err != nil || arch != "arm64" {
		t.Errorf("arm64: %q, %v", arch, err)
	}
}

// TestRealLimitd packages build/limitd (make build-service) when it exists.
func TestRealLimitd(t *testing.T) {
	bin, err := os.ReadFile(filepath.Join("..", "..", "..", "build", "limitd"))
	if err != nil {
		t.Skipf("no build/limitd (make build-service): %v", err)
	}
	e := oci.Executable{Name: "limitd", Binary: bin, Ports: []int{8429}}
	im, err := oci.BuildExecutable(e, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.VerifyExecutable(mustV1(t, im), e); err != nil {
		t.Fatal(err)
	}
}

// TestBuildExecutableAliases: an alias is a symbolic link in the image to
// the executable (/bin/ratelimit, the command Envoy Gateway runs, starts
// limitd under the name that configures it as envoyproxy/ratelimit), read
// back by VerifyExecutable; an image without it fails verification.
func TestBuildExecutableAliases(t *testing.T) {
	e := limitdExe("v1")
	e.Aliases = []string{"/bin/ratelimit"}
	im, err := oci.BuildExecutable(e, t0)
	if err != nil {
		t.Fatal(err)
	}
	img := mustV1(t, im)
	if _, err := oci.VerifyExecutable(img, e); err != nil {
		t.Fatalf("VerifyExecutable: %v", err)
	}
	var link *tar.Header
	for _, en := range layerEntries(t, img) {
		if en.hdr.Name == "bin/ratelimit" {
			link = en.hdr
		}
	}
	if link == nil || link.Typeflag != tar.TypeSymlink || link.Linkname != "/usr/local/bin/limitd" {
		t.Fatalf("bin/ratelimit: %+v, want a link to /usr/local/bin/limitd", link)
	}
	plain, err := oci.BuildExecutable(limitdExe("v1"), t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.VerifyExecutable(mustV1(t, plain), e); err == nil || !strings.Contains(err.Error(), "/bin/ratelimit") {
		t.Errorf("an image without the alias: %v, want it named", err)
	}
	for _, bad := range []string{"bin/ratelimit", "/usr/local/bin/limitd", "/", "/bin/../etc/passwd"} {
		e.Aliases = []string{bad}
		if _, err := oci.BuildExecutable(e, t0); err == nil {
			t.Errorf("alias %q accepted", bad)
		}
	}
}
