package oci_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakewasm"
)

// FuzzReadArchive feeds arbitrary bytes to the archive reader and the
// extraction behind it: they must fail cleanly, never panic or hang, and an
// image they accept must hand back a module that verifies.
func FuzzReadArchive(f *testing.F) {
	im, err := oci.Build(fakewasm.Module("fuzz"), t0)
	if err != nil {
		f.Fatal(err)
	}
	img, err := im.V1()
	if err != nil {
		f.Fatal(err)
	}
	dir := filepath.Join(f.TempDir(), "oci")
	if err := oci.WriteLayout(dir, img, "x/y:z"); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, dir, t0); err != nil {
		f.Fatal(err)
	}
	valid := buf.Bytes()
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte{})
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := oci.ReadArchive(bytes.NewReader(b))
		if err != nil {
			return
		}
		wasm, err := oci.ExtractWasm(img)
		if err != nil {
			return
		}
		if _, err := oci.Verify(img, wasm); err != nil && !bytes.Contains([]byte(err.Error()), []byte("oci: ")) {
			t.Fatalf("Verify error without the package prefix: %v", err)
		}
	})
}
