package oci

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations that name the image in an index.json (OCI image layout spec and
// containerd's convention, which docker load and podman load read).
const (
	RefNameAnnotation   = "org.opencontainers.image.ref.name"
	ImageNameAnnotation = "io.containerd.image.name"
)

// maxArchiveSize bounds what ReadArchive loads into memory: the plugin's
// image is a few megabytes.
const maxArchiveSize = 128 << 20

// WriteLayout writes img to dir as an OCI image layout holding that one
// image, named ref (for example ghcr.io/acme/ratelimit:0.1.0) in index.json.
// A layout already at dir is replaced; a non-empty directory that is not a
// layout is refused rather than deleted.
func WriteLayout(dir string, img v1.Image, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("oci: ref: %w", err)
	}
	if err := clearLayoutDir(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		RefNameAnnotation:   r.Identifier(),
		ImageNameAnnotation: ref,
	}))
	if err != nil {
		return fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	// go-containerregistry creates blobs 0600 and the small files 0777
	// less umask; give every file the same ordinary 0644.
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o644)
	})
	if err != nil {
		return fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	return nil
}

// clearLayoutDir removes the layout at dir, if any, so no stale blob remains.
func clearLayoutDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(entries) == 0) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("oci: layout %s: directory is not empty and holds no oci-layout file; refusing to replace it", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	return nil
}

// ReadLayout returns the only image of the OCI image layout at dir.
func ReadLayout(dir string) (v1.Image, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci: layout %s: index.json: %w", dir, err)
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("oci: layout %s: index.json.manifests: want 1 image, got %d", dir, len(im.Manifests))
	}
	img, err := ii.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("oci: layout %s: %w", dir, err)
	}
	return img, nil
}

// dockerManifest is one entry of the manifest.json that docker load reads.
type dockerManifest struct {
	Config   string
	RepoTags []string `json:",omitempty"`
	Layers   []string
}

// WriteArchive writes the OCI image layout at dir to w as a tar archive
// ("oci-archive", as skopeo and podman call it), adding a manifest.json so
// that docker load accepts it too: the same hybrid docker save writes. Every
// entry gets modTime, so the archive depends only on the layout's content.
func WriteArchive(w io.Writer, dir string, modTime time.Time) error {
	dm, err := dockerManifests(dir)
	if err != nil {
		return err
	}
	var rest []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && rel != "oci-layout" && rel != "index.json" {
			rest = append(rest, rel)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("oci: archive: %w", err)
	}
	sort.Strings(rest)

	tw := tar.NewWriter(w)
	add := func(rel string, content []byte, isDir bool) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(content)), ModTime: modTime, Format: tar.FormatPAX}
		if isDir {
			hdr.Typeflag, hdr.Name, hdr.Mode, hdr.Size = tar.TypeDir, rel+"/", 0o755, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("oci: archive: %s: %w", rel, err)
		}
		if _, err := tw.Write(content); err != nil {
			return fmt.Errorf("oci: archive: %s: %w", rel, err)
		}
		return nil
	}
	addFile := func(rel string) error {
		full := filepath.Join(dir, filepath.FromSlash(rel))
		info, err := os.Stat(full)
		if err != nil {
			return fmt.Errorf("oci: archive: %w", err)
		}
		if info.IsDir() {
			return add(rel, nil, true)
		}
		b, err := os.ReadFile(full)
		if err != nil {
			return fmt.Errorf("oci: archive: %w", err)
		}
		return add(rel, b, false)
	}
	// The small files first, so a streaming reader meets them before the
	// blobs.
	if err := addFile("oci-layout"); err != nil {
		return err
	}
	if err := addFile("index.json"); err != nil {
		return err
	}
	if err := add("manifest.json", dm, false); err != nil {
		return err
	}
	for _, rel := range rest {
		if err := addFile(rel); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("oci: archive: %w", err)
	}
	return nil
}

// dockerManifests builds docker load's manifest.json for the images of the
// layout at dir, naming each by its io.containerd.image.name annotation.
func dockerManifests(dir string) ([]byte, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci: archive: %w", err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci: archive: index.json: %w", err)
	}
	var out []dockerManifest
	for i, desc := range im.Manifests {
		if !desc.MediaType.IsImage() {
			return nil, fmt.Errorf("oci: archive: index.json.manifests[%d].mediaType: %s is not an image", i, desc.MediaType)
		}
		img, err := ii.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("oci: archive: %w", err)
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("oci: archive: %w", err)
		}
		e := dockerManifest{Config: blobPath(m.Config.Digest)}
		for _, l := range m.Layers {
			e.Layers = append(e.Layers, blobPath(l.Digest))
		}
		if n := desc.Annotations[ImageNameAnnotation]; n != "" {
			e.RepoTags = []string{n}
		}
		out = append(out, e)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("oci: archive: manifest.json: %w", err)
	}
	return b, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// ReadArchive returns the only image of an archive written by WriteArchive
// (any tar of an OCI image layout), checking every blob against its digest.
func ReadArchive(r io.Reader) (v1.Image, error) {
	files := map[string][]byte{}
	var total int64
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("oci: archive: %w", err)
		}
		if isSparse(hdr) {
			return nil, fmt.Errorf("oci: archive: %s: sparse entries are not supported", hdr.Name)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		total += hdr.Size
		if total > maxArchiveSize {
			return nil, fmt.Errorf("oci: archive: more than %d bytes", maxArchiveSize)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("oci: archive: %s: %w", hdr.Name, err)
		}
		files[strings.TrimPrefix(hdr.Name, "./")] = b
	}
	for n, b := range files {
		if !strings.HasPrefix(n, "blobs/sha256/") {
			continue
		}
		if got := sha256Hash(b); "blobs/sha256/"+got.Hex != n {
			return nil, fmt.Errorf("oci: archive: %s: content has digest %s", n, got)
		}
	}
	if _, ok := files["oci-layout"]; !ok {
		return nil, errors.New("oci: archive: no oci-layout file")
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		return nil, fmt.Errorf("oci: archive: index.json: %w", err)
	}
	if len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("oci: archive: index.json.manifests: want 1 image, got %d", len(idx.Manifests))
	}
	desc := idx.Manifests[0]
	raw, ok := files[blobPath(desc.Digest)]
	if !ok {
		return nil, fmt.Errorf("oci: archive: no blob for manifest %s", desc.Digest)
	}
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("oci: archive: manifest: %w", err)
	}
	img, err := partial.CompressedToImage(archiveImage{files: files, raw: raw, manifest: &m, mediaType: desc.MediaType})
	if err != nil {
		return nil, fmt.Errorf("oci: archive: %w", err)
	}
	return img, nil
}

// isSparse reports whether hdr is a GNU or PAX sparse file, whose size says
// nothing about the bytes the archive really holds.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// archiveImage serves an image from the blobs of an archive.
type archiveImage struct {
	files     map[string][]byte
	raw       []byte
	manifest  *v1.Manifest
	mediaType types.MediaType
}

func (a archiveImage) RawManifest() ([]byte, error)        { return a.raw, nil }
func (a archiveImage) MediaType() (types.MediaType, error) { return a.mediaType, nil }
func (a archiveImage) RawConfigFile() ([]byte, error) {
	b, ok := a.files[blobPath(a.manifest.Config.Digest)]
	if !ok {
		return nil, fmt.Errorf("no config blob %s", a.manifest.Config.Digest)
	}
	return b, nil
}
func (a archiveImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range a.manifest.Layers {
		if l.Digest == h {
			b, ok := a.files[blobPath(h)]
			if !ok {
				return nil, fmt.Errorf("no layer blob %s", h)
			}
			return blob{b: b, digest: h, mediaType: l.MediaType}, nil
		}
	}
	if h == a.manifest.Config.Digest {
		b, err := a.RawConfigFile()
		return blob{b: b, digest: h, mediaType: a.manifest.Config.MediaType}, err
	}
	return nil, fmt.Errorf("no blob %s in the manifest", h)
}

// Push uploads img to the registry as ref with the credentials of the local
// docker config (the same keychain crane uses). The registry keeps the
// manifest bytes, so the pushed image has the same digest. Registries on
// localhost are reached over plain HTTP.
func Push(ctx context.Context, img v1.Image, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("oci: ref: %w", err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("oci: push %s: %w", ref, err)
	}
	return nil
}

// Pull fetches ref from its registry, as Istio's agent does before it checks
// the digest and extracts the module.
func Pull(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("oci: ref: %w", err)
	}
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return nil, fmt.Errorf("oci: pull %s: %w", ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("oci: pull %s: %w", ref, err)
	}
	return img, nil
}
