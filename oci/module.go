// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package oci

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ModuleFileName is the file a native module image holds at its root: the
// name Envoy looks for (lib<name>.so for dynamic_module_config.name
// "tokenbucket") in $ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
const ModuleFileName = "libtokenbucket.so"

// BuildModule packages the native module (libtokenbucket.so, a Linux ELF
// shared object) as an image created at created, FROM scratch, whose one
// layer holds the module alone at the root:
//
//	/libtokenbucket.so   mode 0755, owned by root
//
// Mounted as a Kubernetes image volume at a directory D, the file is
// D/libtokenbucket.so: D is what ENVOY_DYNAMIC_MODULES_SEARCH_PATH names
// (Istio), and D/libtokenbucket.so what an Envoy Gateway EnvoyProxy's
// dynamicModules[].source.local.path names. The image has no entrypoint: it
// is a file to mount or copy, not a program. The config records Linux and
// the shared object's architecture. As with Build, the image depends only on
// so and created: the same module gives the same digest.
func BuildModule(so []byte, created time.Time) (*Image, error) {
	arch, err := SharedObjectArch(so)
	if err != nil {
		return nil, err
	}
	created = created.UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: ModuleFileName, Mode: 0o755, Size: int64(len(so)),
		ModTime: created, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if _, err := tw.Write(so); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	cfg := v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		History: []v1.History{{
			CreatedBy: "ratelimit-wasm oci.BuildModule",
			Comment:   ModuleFileName,
		}},
	}
	return assemble(buf.Bytes(), cfg, created, nil)
}

// SharedObjectArch returns the Go architecture name of a Linux ELF shared
// object (amd64 or arm64), or an error saying why b is not one.
func SharedObjectArch(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("oci: module: not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_DYN {
		return "", fmt.Errorf("oci: module: ELF type %v is not a shared object", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("oci: module: it has a program interpreter: an executable, not a shared object")
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("oci: module: machine %v is not supported (amd64, arm64)", f.Machine)
}

// VerifyModule checks that img is the image BuildModule makes of so: one
// gzip tar layer whose only file is /libtokenbucket.so with so's bytes, and
// a config for Linux on its architecture with no entrypoint. It returns the
// image digest.
func VerifyModule(img v1.Image, so []byte) (v1.Hash, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("oci: digest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("oci: manifest: %w", err)
	}
	if m.MediaType != ManifestMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != LayerMediaType {
		return v1.Hash{}, fmt.Errorf("oci: manifest: want an OCI manifest with one %s layer, got %s with %d layers", LayerMediaType, m.MediaType, len(m.Layers))
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("oci: config: %w", err)
	}
	arch, err := SharedObjectArch(so)
	if err != nil {
		return v1.Hash{}, err
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		return v1.Hash{}, fmt.Errorf("oci: config: platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	}
	if len(cf.Config.Entrypoint) != 0 || len(cf.Config.Cmd) != 0 {
		return v1.Hash{}, fmt.Errorf("oci: config: entrypoint %q, cmd %q: a module image runs nothing", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	files, err := layerFiles(img)
	if err != nil {
		return v1.Hash{}, err
	}
	if len(files) != 1 || !bytes.Equal(files[ModuleFileName], so) {
		var names []string
		for n := range files {
			names = append(names, n)
		}
		return v1.Hash{}, fmt.Errorf("oci: layer: files [%s], want only %s of %d bytes (%s)",
			strings.Join(names, " "), ModuleFileName, len(so), sha256Hash(so))
	}
	return digest, nil
}
