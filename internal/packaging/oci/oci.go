// Package oci packages the compiled plugin (plugin.wasm) as an OCI image that
// Istio's Wasm image fetcher loads, and reads such images back. It also
// packages the limit service (BuildExecutable) and the native module
// (BuildModule) as images of their own.
//
// # The image
//
// The image is the "compat" variant of the Wasm image specification
// (github.com/solo-io/wasm, spec-compat.md): an ordinary OCI image manifest
// (application/vnd.oci.image.manifest.v1+json) whose single layer is a gzip
// tarball (application/vnd.oci.image.layer.v1.tar+gzip) holding one regular
// file, plugin.wasm, and whose manifest carries the annotation
// module.wasm.image/variant=compat. The config is a standard OCI image config
// (os wasip1, architecture wasm).
//
// Istio's agent (pkg/wasm/imagefetcher.go) tries, in order: a Docker schema 2
// manifest whose last layer is a Docker gzip layer; an OCI manifest whose last
// layer is application/vnd.oci.image.layer.v1.tar+gzip (it gunzips and untars
// it and takes the first entry whose base name is plugin.wasm); and last the
// "oci" artifact variant, which must have exactly two layers, one of type
// application/vnd.module.wasm.content.layer.v1+wasm. The compat variant is
// the one every registry stores (only standard media types), that docker,
// podman, crane and skopeo handle, and that Istio tries first for OCI
// manifests; the artifact variant gains nothing for Istio and some registries
// refuse its custom media types.
//
// # Digests
//
// Two digests matter and they differ:
//
//   - the image digest, sha256 of the manifest bytes. For an oci:// URL Istio
//     compares WasmPlugin.spec.sha256 with this digest (PrepareFetch returns
//     the manifest digest and the cache compares it with the checksum before
//     it even downloads the layer); it is also what oci://repo@sha256:… pins.
//   - the module digest, sha256 of plugin.wasm itself. For an http(s):// URL
//     Istio compares spec.sha256 with this one.
//
// # Reproducibility
//
// Build is a pure function of the wasm bytes and the creation time passed in:
// tar headers, gzip header, config and manifest carry no other time, user or
// host data, so the same plugin.wasm and time give the same image digest on
// every machine. Image values are immutable and safe for concurrent use.
package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Names and media types of the compat variant.
const (
	// WasmFileName is the file the layer holds and Istio looks for.
	WasmFileName = "plugin.wasm"
	// VariantAnnotation and VariantCompat mark the manifest as the compat
	// variant, as the specification requires for OCI layer media types.
	VariantAnnotation = "module.wasm.image/variant"
	VariantCompat     = "compat"

	ManifestMediaType = types.OCIManifestSchema1
	ConfigMediaType   = types.OCIConfigJSON
	LayerMediaType    = types.OCILayer

	// OS and Architecture recorded in the image config.
	OS           = "wasip1"
	Architecture = "wasm"
)

// wasmHeader is the magic number and version 1 every module starts with.
var wasmHeader = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}

// Digests are the identities of one built image.
type Digests struct {
	// Image is the manifest digest: the value (hex part) of WasmPlugin
	// spec.sha256 for an oci:// URL, and the @sha256: pin of the URL.
	Image v1.Hash
	// Wasm is sha256(plugin.wasm): the value of spec.sha256 for an
	// http(s):// URL, and the module Envoy finally loads.
	Wasm v1.Hash
	// Config and Layer are the blob digests; LayerDiffID is the digest of
	// the uncompressed layer tarball recorded in the config.
	Config      v1.Hash
	Layer       v1.Hash
	LayerDiffID v1.Hash
	// WasmSize and LayerSize are in bytes.
	WasmSize  int64
	LayerSize int64
}

// Image is a built plugin image: its three blobs and their digests. Build one
// with Build; the zero value is not useful.
type Image struct {
	manifest []byte
	config   []byte
	layer    []byte
	digests  Digests
}

// Build packages wasm, which must be a WebAssembly binary module, as a compat
// variant image created at created (recorded in the config; use a fixed time
// for reproducible digests).
func Build(wasm []byte, created time.Time) (*Image, error) {
	if !IsWasm(wasm) {
		return nil, fmt.Errorf("oci: wasm: not a WebAssembly module (want header % x)", wasmHeader)
	}
	created = created.UTC()

	rawTar, err := layerTar(wasm, created)
	if err != nil {
		return nil, err
	}
	cfg := v1.ConfigFile{
		Architecture: Architecture,
		OS:           OS,
		History: []v1.History{{
			CreatedBy: "ratelimit-wasm oci.Build",
			Comment:   WasmFileName,
		}},
	}
	im, err := assemble(rawTar, cfg, created, map[string]string{VariantAnnotation: VariantCompat})
	if err != nil {
		return nil, err
	}
	im.digests.Wasm = sha256Hash(wasm)
	im.digests.WasmSize = int64(len(wasm))
	return im, nil
}

// assemble makes an image of one layer, the uncompressed tarball rawTar, and
// cfg, to which it adds the creation time (also of every history entry) and
// the layer's diff ID. Only the Wasm digests are left for the caller.
func assemble(rawTar []byte, cfg v1.ConfigFile, created time.Time, annotations map[string]string) (*Image, error) {
	layer, err := gzipBytes(rawTar)
	if err != nil {
		return nil, err
	}
	diffID := sha256Hash(rawTar)
	layerDigest := sha256Hash(layer)

	cfg.Created = v1.Time{Time: created}
	cfg.RootFS = v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{diffID}}
	for i := range cfg.History {
		cfg.History[i].Created = v1.Time{Time: created}
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("oci: config: %w", err)
	}
	configDigest := sha256Hash(config)

	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     ManifestMediaType,
		Config: v1.Descriptor{
			MediaType: ConfigMediaType,
			Size:      int64(len(config)),
			Digest:    configDigest,
		},
		Layers: []v1.Descriptor{{
			MediaType: LayerMediaType,
			Size:      int64(len(layer)),
			Digest:    layerDigest,
		}},
		Annotations: annotations,
	}
	manifest, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("oci: manifest: %w", err)
	}

	return &Image{
		manifest: manifest,
		config:   config,
		layer:    layer,
		digests: Digests{
			Image:       sha256Hash(manifest),
			Config:      configDigest,
			Layer:       layerDigest,
			LayerDiffID: diffID,
			LayerSize:   int64(len(layer)),
		},
	}, nil
}

// Digests returns the image's digests.
func (im *Image) Digests() Digests { return im.digests }

// RawManifest returns a copy of the manifest bytes, whose sha256 is the image
// digest.
func (im *Image) RawManifest() []byte { return bytes.Clone(im.manifest) }

// V1 returns the image as a go-containerregistry v1.Image, for writing it to
// a layout, a tarball or a registry.
func (im *Image) V1() (v1.Image, error) {
	img, err := partial.CompressedToImage(imageCore{im})
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	return img, nil
}

// IsWasm reports whether b starts with the WebAssembly magic number and
// version 1. Istio's agent refuses a module that fails the same check.
func IsWasm(b []byte) bool { return bytes.HasPrefix(b, wasmHeader) }

// layerTar returns an uncompressed tarball holding wasm as WasmFileName.
func layerTar(wasm []byte, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     WasmFileName,
		Mode:     0o644,
		Size:     int64(len(wasm)),
		ModTime:  created,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if _, err := tw.Write(wasm); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with a header that carries no name and no time, so
// the output depends on b alone.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	return buf.Bytes(), nil
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// imageCore serves an Image through partial.CompressedImageCore.
type imageCore struct{ im *Image }

func (c imageCore) RawConfigFile() ([]byte, error)      { return c.im.config, nil }
func (c imageCore) MediaType() (types.MediaType, error) { return ManifestMediaType, nil }
func (c imageCore) RawManifest() ([]byte, error)        { return c.im.manifest, nil }
func (c imageCore) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	switch h {
	case c.im.digests.Layer:
		return blob{b: c.im.layer, digest: h, mediaType: LayerMediaType}, nil
	case c.im.digests.Config:
		return blob{b: c.im.config, digest: h, mediaType: ConfigMediaType}, nil
	}
	return nil, fmt.Errorf("oci: no blob %s", h)
}

// blob is an in-memory partial.CompressedLayer.
type blob struct {
	b         []byte
	digest    v1.Hash
	mediaType types.MediaType
}

func (b blob) Digest() (v1.Hash, error)            { return b.digest, nil }
func (b blob) Compressed() (io.ReadCloser, error)  { return io.NopCloser(bytes.NewReader(b.b)), nil }
func (b blob) Size() (int64, error)                { return int64(len(b.b)), nil }
func (b blob) MediaType() (types.MediaType, error) { return b.mediaType, nil }

// maxWasmSize bounds what ExtractWasm reads from a layer entry (the plugin is
// about 5 MB).
const maxWasmSize = 64 << 20

// ExtractWasm returns the module an image holds, found the way Istio's agent
// finds it in a compat variant image with an OCI manifest: the last layer
// must be application/vnd.oci.image.layer.v1.tar+gzip, and the module is the
// first tar entry whose base name is plugin.wasm. The result must pass IsWasm,
// as Istio also demands.
func ExtractWasm(img v1.Image) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("oci: layers: %w", err)
	}
	if len(layers) == 0 {
		return nil, errors.New("oci: layers: image has none")
	}
	last := layers[len(layers)-1]
	mt, err := last.MediaType()
	if err != nil {
		return nil, fmt.Errorf("oci: layers[%d].mediaType: %w", len(layers)-1, err)
	}
	if mt != LayerMediaType {
		return nil, fmt.Errorf("oci: layers[%d].mediaType: want %s, got %s", len(layers)-1, LayerMediaType, mt)
	}
	rc, err := last.Compressed()
	if err != nil {
		return nil, fmt.Errorf("oci: layers[%d]: %w", len(layers)-1, err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("oci: layers[%d]: not gzip: %w", len(layers)-1, err)
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("oci: layers[%d]: no %s", len(layers)-1, WasmFileName)
		}
		if err != nil {
			return nil, fmt.Errorf("oci: layers[%d]: %w", len(layers)-1, err)
		}
		if path.Base(hdr.Name) != WasmFileName {
			continue
		}
		if hdr.Size > maxWasmSize {
			return nil, fmt.Errorf("oci: layers[%d]: %s: %d bytes, more than %d", len(layers)-1, hdr.Name, hdr.Size, maxWasmSize)
		}
		wasm, err := io.ReadAll(io.LimitReader(tr, maxWasmSize))
		if err != nil {
			return nil, fmt.Errorf("oci: layers[%d]: %s: %w", len(layers)-1, hdr.Name, err)
		}
		if !IsWasm(wasm) {
			return nil, fmt.Errorf("oci: layers[%d]: %s: not a WebAssembly module", len(layers)-1, hdr.Name)
		}
		return wasm, nil
	}
}

// Verify checks that img is a compat variant image of wasm: OCI manifest and
// config media types, exactly one layer of the gzip tar media type, the
// variant annotation, and a module equal to wasm found as Istio finds it. It
// returns the image digest.
func Verify(img v1.Image, wasm []byte) (v1.Hash, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("oci: digest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("oci: manifest: %w", err)
	}
	switch {
	case m.SchemaVersion != 2:
		return v1.Hash{}, fmt.Errorf("oci: manifest.schemaVersion: want 2, got %d", m.SchemaVersion)
	case m.MediaType != ManifestMediaType:
		return v1.Hash{}, fmt.Errorf("oci: manifest.mediaType: want %s, got %q", ManifestMediaType, m.MediaType)
	case m.Config.MediaType != ConfigMediaType:
		return v1.Hash{}, fmt.Errorf("oci: manifest.config.mediaType: want %s, got %q", ConfigMediaType, m.Config.MediaType)
	case len(m.Layers) != 1:
		return v1.Hash{}, fmt.Errorf("oci: manifest.layers: want 1 layer, got %d", len(m.Layers))
	case m.Layers[0].MediaType != LayerMediaType:
		return v1.Hash{}, fmt.Errorf("oci: manifest.layers[0].mediaType: want %s, got %q", LayerMediaType, m.Layers[0].MediaType)
	case m.Annotations[VariantAnnotation] != VariantCompat:
		return v1.Hash{}, fmt.Errorf("oci: manifest.annotations[%q]: want %q, got %q", VariantAnnotation, VariantCompat, m.Annotations[VariantAnnotation])
	}
	got, err := ExtractWasm(img)
	if err != nil {
		return v1.Hash{}, err
	}
	if !bytes.Equal(got, wasm) {
		return v1.Hash{}, fmt.Errorf("oci: %s: image holds %d bytes (%s), want %d bytes (%s)",
			WasmFileName, len(got), sha256Hash(got), len(wasm), sha256Hash(wasm))
	}
	return digest, nil
}
