// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package oci_test

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/elftest"
	"github.com/ratelimit-wasm/tokenbucket/oci"
)

// TestBuildModule checks the native module's image: linux on the shared
// object's architecture, no entrypoint, one layer whose only file is
// /libtokenbucket.so (mode 0755, root, the creation time), written to a
// layout and an archive and read back; the same module gives the same
// digest, another module another.
func TestBuildModule(t *testing.T) {
	for _, tc := range []struct {
		machine elf.Machine
		arch    string
	}{{elf.EM_X86_64, "amd64"}, {elf.EM_AARCH64, "arm64"}} {
		so := elftest.FakeShared(tc.machine, "module")
		im, err := oci.BuildModule(so, t0)
		if err != nil {
			t.Fatal(err)
		}
		img := mustV1(t, im)
		if d, err := oci.VerifyModule(img, so); err != nil || d != im.Digests().Image {
			t.Fatalf("%s: VerifyModule = %v, %v; want %v", tc.arch, d, err, im.Digests().Image)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != tc.arch || len(cf.Config.Entrypoint) != 0 || !cf.Created.Equal(t0) {
			t.Errorf("%s: config %+v", tc.arch, cf)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, hdr.Name)
			b, _ := io.ReadAll(tr)
			if hdr.Name != "libtokenbucket.so" || hdr.Mode != 0o755 || hdr.Uid != 0 || !hdr.ModTime.Equal(t0) || !bytes.Equal(b, so) {
				t.Errorf("%s: layer entry %+v", tc.arch, hdr)
			}
		}
		rc.Close()
		if len(names) != 1 {
			t.Errorf("%s: layer holds %q, want libtokenbucket.so alone", tc.arch, names)
		}

		dir := filepath.Join(t.TempDir(), "native-oci")
		if err := oci.WriteLayout(dir, img, "localhost/ratelimit-wasm/tokenbucket-native:dev"); err != nil {
			t.Fatal(err)
		}
		back, err := oci.ReadLayout(dir)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := oci.VerifyModule(back, so); err != nil || d != im.Digests().Image {
			t.Fatalf("%s: layout: %v, %v", tc.arch, d, err)
		}

		again, err := oci.BuildModule(elftest.FakeShared(tc.machine, "module"), t0)
		if err != nil || again.Digests() != im.Digests() {
			t.Errorf("%s: same module, other digests (%v)", tc.arch, err)
		}
		other := elftest.FakeShared(tc.machine, "another")
		if _, err := oci.VerifyModule(img, other); err == nil {
			t.Errorf("%s: VerifyModule accepted another module", tc.arch)
		}
	}
}

// TestBuildModuleRejects: an executable, a non-ELF file and another machine
// are not a native module.
func TestBuildModuleRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"executable":  {elftest.Fake(elf.EM_X86_64, false, "x"), "not a shared object"},
		"not ELF":     {[]byte("\x00asm\x01\x00\x00\x00"), "not an ELF file"},
		"other CPU":   {elftest.FakeShared(elf.EM_RISCV, "x"), "not supported"},
		"interpreter": {elftest.Fake(elf.EM_X86_64, true, ""), "not a shared object"},
	} {
		if _, err := oci.BuildModule(tc.b, t0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}

// TestRealModule packages build/libtokenbucket.so ($NATIVE_MODULE), when
// built (under CI=true it must be): an ELF shared object of the host's
// architecture.
func TestRealModule(t *testing.T) {
	p := os.Getenv("NATIVE_MODULE")
	if p == "" {
		p = filepath.Join("..", "build", "libtokenbucket.so")
	}
	so, err := os.ReadFile(p)
	if err != nil {
		ci.Skip(t, "%s: %v (make build-native)", p, err)
	}
	im, err := oci.BuildModule(so, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.VerifyModule(mustV1(t, im), so); err != nil {
		t.Fatal(err)
	}
}
