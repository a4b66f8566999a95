// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
)

// TestPluginWasmIsReproducible copies this checkout's files to two paths of
// different lengths and runs `make build oci oci-limitd oci-native` in each
// (with the shared Go build cache, as two CI runs on one machine would;
// outside this checkout, so that nothing reads a build/ file while it is
// rewritten), then demands byte-identical plugin.wasm files and
// libtokenbucket.so files, none of which names its checkout's path, and the
// same image digests for the plugin, for limitd and for the native module.
func TestPluginWasmIsReproducible(t *testing.T) {
	t.Parallel() // a make of its own, in a copy or a build folder of its own: see the package doc
	tmp := t.TempDir()
	dirs := []string{filepath.Join(tmp, "a"), filepath.Join(tmp, "another", "checkout", "of-this-repository")}
	copyCheckout(t, dirs...)

	wasm := map[string][]byte{}
	digests := map[string][3]string{}
	for _, dir := range dirs {
		start := time.Now()
		makeIn(t, dir, "build", "oci", "oci-limitd", "oci-native")
		digests[dir] = [3]string{imageDigest(t, filepath.Join(dir, "build", "plugin-oci.json")),
			imageDigest(t, filepath.Join(dir, "build", "limitd-oci.json")), imageDigest(t, filepath.Join(dir, "build", "native-oci.json"))}
		so, err := os.ReadFile(filepath.Join(dir, "build", "libtokenbucket.so"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(so, []byte(dir)) {
			t.Errorf("%s/build/libtokenbucket.so contains its checkout path %s", dir, dir)
		}
		b, err := os.ReadFile(filepath.Join(dir, "build", "plugin.wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(dir)) {
			t.Errorf("%s/build/plugin.wasm contains its checkout path %s", dir, dir)
		}
		wasm[dir] = b
		t.Logf("make build oci oci-limitd oci-native in %s: %v", dir, time.Since(start).Round(time.Millisecond))
	}
	a, b := wasm[dirs[0]], wasm[dirs[1]]
	if !bytes.Equal(a, b) {
		t.Fatalf("plugin.wasm differs between %s (%d bytes) and %s (%d bytes)", dirs[0], len(a), dirs[1], len(b))
	}
	ia, err := oci.Build(a, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := oci.Build(b, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ia.Digests() != ib.Digests() {
		t.Fatalf("image digests differ: %v, %v", ia.Digests().Image, ib.Digests().Image)
	}
	if digests[dirs[0]] != digests[dirs[1]] {
		t.Fatalf("make oci / oci-limitd / oci-native digests differ: %v in %s, %v in %s", digests[dirs[0]], dirs[0], digests[dirs[1]], dirs[1])
	}
	t.Logf("identical: plugin.wasm sha256:%s, image %s; make oci %s, make oci-limitd %s, make oci-native %s",
		ia.Digests().Wasm.Hex, ia.Digests().Image, digests[dirs[0]][0], digests[dirs[0]][1], digests[dirs[0]][2])
}

// imageDigest returns image_digest from a summary that cmd/ociimage wrote.
func imageDigest(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		ImageDigest string `json:"image_digest"`
	}
	if err := json.Unmarshal(b, &s); err != nil || s.ImageDigest == "" {
		t.Fatalf("%s: no image_digest (%v)", path, err)
	}
	return s.ImageDigest
}
