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
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
)

// TestBuildModule checks the native module's image: linux on the shared
// object's architecture, the installer as entrypoint into /module as the
// non-root user, one layer whose files are /libtokenbucket.so and the
// installer (mode 0755, root, the creation time), written to a layout and
// read back; the same inputs give the same digest, another module another.
func TestBuildModule(t *testing.T) {
	for _, tc := range []struct {
		machine elf.Machine
		arch    string
	}{{elf.EM_X86_64, "amd64"}, {elf.EM_AARCH64, "arm64"}} {
		so := elftest.FakeShared(tc.machine, "module")
		inst := elftest.Fake(tc.machine, false, "installer")
		im, err := oci.BuildModule(so, inst, t0)
		if err != nil {
			t.Fatal(err)
		}
		img := mustV1(t, im)
		if d, err := oci.VerifyModule(img, so, inst); err != nil || d != im.Digests().Image {
			t.Fatalf("%s: VerifyModule = %v, %v; want %v", tc.arch, d, err, im.Digests().Image)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != tc.arch || strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/installmodule" ||
			strings.Join(cf.Config.Cmd, " ") != "/module" || cf.Config.User != "65532:65532" || !cf.Created.Equal(t0) {
			t.Errorf("%s: config %+v", tc.arch, cf)
		}
		var names []string
		for _, en := range layerEntries(t, img) {
			hdr := en.hdr
			if hdr.Typeflag != tar.TypeReg {
				continue
			}
			names = append(names, hdr.Name)
			want := map[string][]byte{"libtokenbucket.so": so, "usr/local/bin/installmodule": inst}[hdr.Name]
			if want == nil || hdr.Mode != 0o755 || hdr.Uid != 0 || !hdr.ModTime.Equal(t0) || !bytes.Equal(en.body, want) {
				t.Errorf("%s: layer entry %+v", tc.arch, hdr)
			}
		}
		if len(names) != 2 {
			t.Errorf("%s: layer holds files %q, want libtokenbucket.so and the installer", tc.arch, names)
		}

		dir := filepath.Join(t.TempDir(), "native-oci")
		if err := oci.WriteLayout(dir, img, "localhost/ratelimit-wasm/tokenbucket-native:dev"); err != nil {
			t.Fatal(err)
		}
		back, err := oci.ReadLayout(dir)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := oci.VerifyModule(back, so, inst); err != nil || d != im.Digests().Image {
			t.Fatalf("%s: layout: %v, %v", tc.arch, d, err)
		}

		again, err := oci.BuildModule(elftest.FakeShared(tc.machine, "module"), elftest.Fake(tc.machine, false, "installer"), t0)
		if err != nil || again.Digests() != im.Digests() {
			t.Errorf("%s: same module, other digests (%v)", tc.arch, err)
		}
		other := elftest.FakeShared(tc.machine, "another")
		if _, err := oci.VerifyModule(img, other, inst); err == nil {
			t.Errorf("%s: VerifyModule accepted another module", tc.arch)
		}
	}
}

// TestBuildModuleRejects: an executable, a non-ELF file and another machine
// are not a native module; a dynamic installer or one for another
// architecture is refused.
func TestBuildModuleRejects(t *testing.T) {
	inst := elftest.Fake(elf.EM_X86_64, false, "i")
	so := elftest.FakeShared(elf.EM_X86_64, "m")
	if _, err := oci.BuildModule(so, elftest.Fake(elf.EM_AARCH64, false, "i"), t0); err == nil || !strings.Contains(err.Error(), "installer for arm64") {
		t.Errorf("an arm64 installer for an amd64 module: %v", err)
	}
	if _, err := oci.BuildModule(so, elftest.Fake(elf.EM_X86_64, true, ""), t0); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("a dynamic installer: %v", err)
	}
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"executable":  {elftest.Fake(elf.EM_X86_64, false, "x"), "not a shared object"},
		"not ELF":     {[]byte("\x00asm\x01\x00\x00\x00"), "not an ELF file"},
		"other CPU":   {elftest.FakeShared(elf.EM_RISCV, "x"), "not supported"},
		"interpreter": {elftest.Fake(elf.EM_X86_64, true, ""), "not a shared object"},
	} {
		if _, err := oci.BuildModule(tc.b, inst, t0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}

// TestRealModule packages build/libtokenbucket.so ($NATIVE_MODULE), when
// built (under CI=true it must be), with a fake installer: an ELF shared
// object of the host's architecture.
func TestRealModule(t *testing.T) {
	p := os.Getenv("NATIVE_MODULE")
	if p == "" {
		p = filepath.Join("..", "..", "..", "build", "libtokenbucket.so")
	}
	so, err := os.ReadFile(p)
	if err != nil {
		ci.Skip(t, "%s: %v (make build-native)", p, err)
	}
	arch, err := oci.SharedObjectArch(so)
	if err != nil {
		t.Fatal(err)
	}
	inst := elftest.Fake(map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch], false, "installer")
	im, err := oci.BuildModule(so, inst, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.VerifyModule(mustV1(t, im), so, inst); err != nil {
		t.Fatal(err)
	}
}
