package oci_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakewasm"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func mustBuild(t *testing.T, wasm []byte, created time.Time) *oci.Image {
	t.Helper()
	im, err := oci.Build(wasm, created)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return im
}

func mustV1(t *testing.T, im *oci.Image) v1.Image {
	t.Helper()
	img, err := im.V1()
	if err != nil {
		t.Fatalf("V1: %v", err)
	}
	return img
}

// layerEntry is one entry of an image's layer, its header and contents.
type layerEntry struct {
	hdr  *tar.Header
	body []byte
}

// layerEntries reads the entries of img's first layer, in order.
func layerEntries(t *testing.T, img v1.Image) []layerEntry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []layerEntry
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, layerEntry{hdr, b})
	}
}

// checkManifest decodes raw manifest bytes on its own (not through the
// package) and checks every field Istio and the Wasm image spec care about.
func checkManifest(t *testing.T, raw []byte) (config, layer v1.Descriptor) {
	t.Helper()
	var m struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     string            `json:"mediaType"`
		Config        v1.Descriptor     `json:"config"`
		Layers        []v1.Descriptor   `json:"layers"`
		Annotations   map[string]string `json:"annotations"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("manifest: %v\n%s", err, raw)
	}
	if m.SchemaVersion != 2 {
		t.Errorf("schemaVersion = %d, want 2", m.SchemaVersion)
	}
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("mediaType = %q", m.MediaType)
	}
	if m.Config.MediaType != "application/vnd.oci.image.config.v1+json" {
		t.Errorf("config.mediaType = %q", m.Config.MediaType)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("layers = %d, want exactly 1", len(m.Layers))
	}
	if m.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("layers[0].mediaType = %q", m.Layers[0].MediaType)
	}
	if want := map[string]string{"module.wasm.image/variant": "compat"}; len(m.Annotations) != 1 || m.Annotations["module.wasm.image/variant"] != "compat" {
		t.Errorf("annotations = %v, want %v", m.Annotations, want)
	}
	return m.Config, m.Layers[0]
}

// layerFiles gunzips and untars a layer blob on its own and returns its
// entries.
func layerFiles(t *testing.T, gz []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("layer: not gzip: %v", err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			t.Errorf("layer entry %q has type %c, want a regular file", hdr.Name, hdr.Typeflag)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
		files[hdr.Name] = b
	}
	return files
}

func TestBuildManifestAndLayer(t *testing.T) {
	wasm := fakewasm.Module("payload")
	im := mustBuild(t, wasm, t0)
	d := im.Digests()

	raw := im.RawManifest()
	if got := sha(raw); got != d.Image.Hex {
		t.Errorf("Digests().Image = %s, sha256(manifest) = %s", d.Image.Hex, got)
	}
	if d.Wasm.Hex != sha(wasm) {
		t.Errorf("Digests().Wasm = %s, want sha256(plugin.wasm) = %s", d.Wasm.Hex, sha(wasm))
	}
	if d.Image == d.Wasm {
		t.Error("image digest equals the module digest; they must differ")
	}
	cfgDesc, layerDesc := checkManifest(t, raw)

	img := mustV1(t, im)
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("Layers() = %d, %v", len(layers), err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	gz, _ := io.ReadAll(rc)
	rc.Close()
	if sha(gz) != layerDesc.Digest.Hex || int64(len(gz)) != layerDesc.Size {
		t.Errorf("layer blob sha256 %s size %d, manifest says %s size %d", sha(gz), len(gz), layerDesc.Digest, layerDesc.Size)
	}
	files := layerFiles(t, gz)
	if len(files) != 1 || !bytes.Equal(files["plugin.wasm"], wasm) {
		t.Errorf("layer holds %v, want exactly plugin.wasm = %d bytes", keys(files), len(wasm))
	}

	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if sha(rawCfg) != cfgDesc.Digest.Hex {
		t.Errorf("config blob sha256 %s, manifest says %s", sha(rawCfg), cfgDesc.Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "wasip1" || cfg.Architecture != "wasm" || !cfg.Created.Time.Equal(t0) {
		t.Errorf("config os/arch/created = %s/%s/%v", cfg.OS, cfg.Architecture, cfg.Created.Time)
	}
	diffID, _ := layers[0].DiffID()
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != diffID {
		t.Errorf("rootfs.diff_ids = %v, want [%s]", cfg.RootFS.DiffIDs, diffID)
	}
	if got, err := img.Digest(); err != nil || got != d.Image {
		t.Errorf("v1 image digest = %s, %v; want %s", got, err, d.Image)
	}
	if got, err := oci.ExtractWasm(img); err != nil || !bytes.Equal(got, wasm) {
		t.Errorf("ExtractWasm = %d bytes, %v", len(got), err)
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func TestBuildIsReproducible(t *testing.T) {
	a := fakewasm.Module("a")
	tests := []struct {
		name     string
		wasm     []byte
		created  time.Time
		wantSame bool
	}{
		{"same input", a, t0, true},
		{"same instant in another zone", a, t0.In(time.FixedZone("x", 3600)), true},
		{"other time", a, t0.Add(time.Second), false},
		{"other module", fakewasm.Module("b"), t0, false},
	}
	base := mustBuild(t, a, t0).Digests().Image
	for _, tt := range tests {
		got := mustBuild(t, tt.wasm, tt.created).Digests().Image
		if (got == base) != tt.wantSame {
			t.Errorf("%s: digest %s vs %s, want same = %v", tt.name, got, base, tt.wantSame)
		}
	}
}

func TestBuildRejectsNonWasm(t *testing.T) {
	for _, in := range [][]byte{
		nil,
		[]byte("\x00asm"),
		[]byte("\x00asm\x02\x00\x00\x00"),
		[]byte("#!/bin/sh\necho hi\n"),
	} {
		if _, err := oci.Build(in, t0); err == nil || !strings.HasPrefix(err.Error(), "oci: wasm:") {
			t.Errorf("Build(%q) error = %v, want an oci: wasm: error", in, err)
		}
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	wasm := fakewasm.Module("layout")
	im := mustBuild(t, wasm, t0)
	d := im.Digests()
	dir := filepath.Join(t.TempDir(), "oci")
	const ref = "ghcr.io/acme/ratelimit:0.1.0"
	if err := oci.WriteLayout(dir, mustV1(t, im), ref); err != nil {
		t.Fatal(err)
	}

	// Read it back with go-containerregistry's own layout reader.
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests", len(idx.Manifests))
	}
	desc := idx.Manifests[0]
	if desc.Digest != d.Image || desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("index.json manifest %s %s, want %s", desc.MediaType, desc.Digest, d.Image)
	}
	if desc.Annotations["org.opencontainers.image.ref.name"] != "0.1.0" || desc.Annotations["io.containerd.image.name"] != ref {
		t.Errorf("index.json annotations = %v", desc.Annotations)
	}
	// Every blob is named after its content's digest.
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 3 {
		t.Errorf("layout has %d blobs, want 3 (manifest, config, layer)", len(blobs))
	}
	for _, b := range blobs {
		content, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", b.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if sha(content) != b.Name() {
			t.Errorf("blob %s has sha256 %s", b.Name(), sha(content))
		}
	}
	manifest, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", d.Image.Hex))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(manifest, im.RawManifest()) {
		t.Error("manifest blob in the layout differs from the built manifest")
	}
	_, layerDesc := checkManifest(t, manifest)
	layer, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", layerDesc.Digest.Hex))
	if err != nil {
		t.Fatal(err)
	}
	if files := layerFiles(t, layer); len(files) != 1 || !bytes.Equal(files["plugin.wasm"], wasm) {
		t.Errorf("layout layer holds %v", keys(files))
	}

	img, err := oci.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := oci.Verify(img, wasm); err != nil || got != d.Image {
		t.Errorf("Verify(layout) = %s, %v; want %s", got, err, d.Image)
	}
}

func TestWriteLayoutReplacesOnlyALayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oci")
	first := mustBuild(t, fakewasm.Module("one"), t0)
	second := mustBuild(t, fakewasm.Module("two"), t0)
	if err := oci.WriteLayout(dir, mustV1(t, first), "x/y:1"); err != nil {
		t.Fatal(err)
	}
	if err := oci.WriteLayout(dir, mustV1(t, second), "x/y:2"); err != nil {
		t.Fatal(err)
	}
	blobs, _ := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if len(blobs) != 3 {
		t.Errorf("after rewriting, %d blobs remain, want 3 (no stale blob)", len(blobs))
	}
	img, err := oci.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.Verify(img, fakewasm.Module("two")); err != nil {
		t.Error(err)
	}

	other := t.TempDir()
	keep := filepath.Join(other, "keep.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := oci.WriteLayout(other, mustV1(t, first), "x/y:1"); err == nil {
		t.Error("WriteLayout into a non-empty, non-layout directory succeeded")
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "mine" {
		t.Errorf("the foreign file was touched: %q, %v", b, err)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	wasm := fakewasm.Module("archive")
	im := mustBuild(t, wasm, t0)
	d := im.Digests()
	dir := filepath.Join(t.TempDir(), "oci")
	const ref = "registry.example:5000/team/ratelimit:dev"
	if err := oci.WriteLayout(dir, mustV1(t, im), ref); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, dir, t0); err != nil {
		t.Fatal(err)
	}
	archive := buf.Bytes()

	// Read the tar on its own: the layout's files, byte for byte, plus
	// docker load's manifest.json.
	entries := map[string][]byte{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !hdr.ModTime.Equal(t0) || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("entry %s: mtime %v uid %d gid %d", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid)
		}
		b, _ := io.ReadAll(tr)
		entries[hdr.Name] = b
		order = append(order, hdr.Name)
	}
	if len(order) < 3 || order[0] != "oci-layout" || order[1] != "index.json" || order[2] != "manifest.json" {
		t.Errorf("archive starts with %v, want oci-layout, index.json, manifest.json", order)
	}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		want, _ := os.ReadFile(p)
		if got, ok := entries[filepath.ToSlash(rel)]; !ok || !bytes.Equal(got, want) {
			t.Errorf("archive entry %s differs from the layout file (present %v)", rel, ok)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var dm []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &dm); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(dm) != 1 || dm[0].Config != "blobs/sha256/"+d.Config.Hex || len(dm[0].Layers) != 1 ||
		dm[0].Layers[0] != "blobs/sha256/"+d.Layer.Hex || len(dm[0].RepoTags) != 1 || dm[0].RepoTags[0] != ref {
		t.Errorf("manifest.json = %+v", dm)
	}

	// The package's reader, as make oci uses it.
	img, err := oci.ReadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := oci.Verify(img, wasm); err != nil || got != d.Image {
		t.Errorf("Verify(archive) = %s, %v; want %s", got, err, d.Image)
	}

	// docker load's view, through go-containerregistry's tarball reader.
	path := filepath.Join(t.TempDir(), "plugin-oci.tar")
	if err := os.WriteFile(path, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	timg, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("tarball.ImageFromPath: %v", err)
	}
	tl, err := timg.Layers()
	if err != nil || len(tl) != 1 {
		t.Fatalf("tarball layers = %d, %v", len(tl), err)
	}
	rc, err := tl[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	gz, _ := io.ReadAll(rc)
	rc.Close()
	if files := layerFiles(t, gz); len(files) != 1 || !bytes.Equal(files["plugin.wasm"], wasm) {
		t.Errorf("docker view of the layer holds %v", keys(files))
	}
}

func TestReadArchiveRejectsTamperedBlob(t *testing.T) {
	im := mustBuild(t, fakewasm.Module("tamper"), t0)
	dir := filepath.Join(t.TempDir(), "oci")
	if err := oci.WriteLayout(dir, mustV1(t, im), "x/y:z"); err != nil {
		t.Fatal(err)
	}
	layerPath := filepath.Join(dir, "blobs", "sha256", im.Digests().Layer.Hex)
	b, _ := os.ReadFile(layerPath)
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(layerPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, dir, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := oci.ReadArchive(&buf); err == nil || !strings.Contains(err.Error(), im.Digests().Layer.Hex) {
		t.Errorf("ReadArchive of a tampered layer: %v", err)
	}
}

func TestVerifyRejects(t *testing.T) {
	wasm := fakewasm.Module("v")
	img := mustV1(t, mustBuild(t, wasm, t0))
	extra, err := random.Layer(64, types.OCILayer)
	if err != nil {
		t.Fatal(err)
	}
	twoLayers, err := mutate.AppendLayers(img, extra)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		img     v1.Image
		wasm    []byte
		wantErr string
	}{
		{"other module", img, fakewasm.Module("w"), "plugin.wasm: image holds"},
		{"docker manifest", mutate.MediaType(img, types.DockerManifestSchema2), wasm, "manifest.mediaType"},
		{"no variant annotation", mutate.Annotations(img, map[string]string{"module.wasm.image/variant": ""}).(v1.Image), wasm, "annotations"},
		{"two layers", twoLayers, wasm, "manifest.layers: want 1 layer, got 2"},
	}
	for _, tt := range tests {
		_, err := oci.Verify(tt.img, tt.wasm)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: Verify error = %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
}

// TestPushPullLoopbackRegistry pushes to an in-process registry on loopback,
// pulls back by tag and by digest as Istio's agent does, and checks that the
// registry serves the digest make oci printed.
func TestPushPullLoopbackRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	wasm := fakewasm.Module("push")
	im := mustBuild(t, wasm, t0)
	d := im.Digests()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ref := host + "/ratelimit/plugin:test"
	if err := oci.Push(ctx, mustV1(t, im), ref); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{ref, host + "/ratelimit/plugin@" + d.Image.String()} {
		img, err := oci.Pull(ctx, r)
		if err != nil {
			t.Fatalf("Pull(%s): %v", r, err)
		}
		got, err := oci.Verify(img, wasm)
		if err != nil {
			t.Fatalf("Verify(%s): %v", r, err)
		}
		// What Istio compares with WasmPlugin.spec.sha256 for oci://.
		if got.Hex != d.Image.Hex {
			t.Errorf("%s: registry digest %s, make oci printed %s", r, got.Hex, d.Image.Hex)
		}
	}
}

// TestRealPluginWasm packages the real build output. It skips when
// build/plugin.wasm is absent, except in CI, where it must exist.
func TestRealPluginWasm(t *testing.T) {
	path := os.Getenv("PLUGIN_WASM")
	if path == "" {
		path = filepath.Join("..", "..", "..", "build", "plugin.wasm")
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		ci.Skip(t, "%s not built (run make build): %v", path, err)
	}
	im := mustBuild(t, wasm, time.Unix(0, 0))
	d := im.Digests()
	if d.Wasm.Hex != sha(wasm) {
		t.Errorf("module digest %s, sha256(%s) = %s", d.Wasm.Hex, path, sha(wasm))
	}
	dir := filepath.Join(t.TempDir(), "oci")
	if err := oci.WriteLayout(dir, mustV1(t, im), "localhost/ratelimit-wasm/tokenbucket:dev"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, dir, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	fromLayout, err := oci.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	fromArchive, err := oci.ReadArchive(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for name, img := range map[string]v1.Image{"layout": fromLayout, "archive": fromArchive} {
		got, err := oci.Verify(img, wasm)
		if err != nil || got != d.Image {
			t.Errorf("%s: Verify = %s, %v; want %s", name, got, err, d.Image)
		}
	}
	t.Logf("plugin.wasm %d bytes sha256:%s; layer %d bytes; image %s", d.WasmSize, d.Wasm.Hex, d.LayerSize, d.Image)
}
