// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package oci

import (
	"bytes"
	"debug/elf"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ModuleFileName is the file a native module image holds at its root: the
// name Envoy looks for (lib<name>.so for dynamic_module_config.name
// "tokenbucket") in $ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
const ModuleFileName = "libtokenbucket.so"

// InstallerPath is where a native module image holds its installer
// (cmd/installmodule), the image's entrypoint.
const InstallerPath = "/usr/local/bin/installmodule"

// InstallerDir is the folder the installer copies the module into by
// default (the image's Cmd): mount the proxy's emptyDir there.
const InstallerDir = "/module"

// BuildModule packages the native module so (libtokenbucket.so, a Linux
// ELF shared object) and its installer (cmd/installmodule, a static
// executable of the same architecture) as an image created at created,
// FROM scratch, whose one layer holds:
//
//	/libtokenbucket.so               the module, mode 0755, owned by root
//	/usr/local/bin/installmodule     the installer, mode 0755
//
// It serves two ways. Mounted as a Kubernetes image volume at a folder D,
// the module is D/libtokenbucket.so: D is what
// ENVOY_DYNAMIC_MODULES_SEARCH_PATH names (Istio), D/libtokenbucket.so what
// an Envoy Gateway EnvoyProxy's dynamicModules[].source.local.path names;
// that needs a runtime that does not mount image volumes noexec. Run as an
// init container with an emptyDir at InstallerDir (the image's entrypoint
// and Cmd, as user NonRootUID), it copies the module there for the proxy to
// mount instead, which works on any runtime. The config records Linux and
// the architecture. As with Build, the image depends only on its inputs:
// the same module and installer give the same digest.
func BuildModule(so, installer []byte, created time.Time) (*Image, error) {
	arch, err := SharedObjectArch(so)
	if err != nil {
		return nil, err
	}
	iarch, err := StaticELFArch(installer)
	if err != nil {
		return nil, fmt.Errorf("oci: installer: %w", err)
	}
	if iarch != arch {
		return nil, fmt.Errorf("oci: installer for %s, module for %s", iarch, arch)
	}
	created = created.UTC()
	layer, err := writeLayer(created, []layerEntry{
		{name: ModuleFileName, mode: 0o755, contents: so},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: InstallerPath[1:], mode: 0o755, contents: installer},
	})
	if err != nil {
		return nil, err
	}
	uid := strconv.Itoa(NonRootUID)
	cfg := v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Config: v1.Config{
			User:       uid + ":" + uid,
			Entrypoint: []string{InstallerPath},
			Cmd:        []string{InstallerDir},
		},
		History: []v1.History{{
			CreatedBy: "ratelimit-wasm oci.BuildModule",
			Comment:   ModuleFileName,
		}},
	}
	return assemble(layer, cfg, created, nil)
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
	if arch := goArch(f.Machine); arch != "" {
		return arch, nil
	}
	return "", fmt.Errorf("oci: module: machine %v is not supported (amd64, arm64)", f.Machine)
}

// VerifyModule checks that img is the image BuildModule makes of so and
// installer: one gzip tar layer whose files are /libtokenbucket.so and the
// installer with their bytes, and a config for Linux on their architecture
// that runs the installer into InstallerDir as NonRootUID. It returns the
// image digest.
func VerifyModule(img v1.Image, so, installer []byte) (v1.Hash, error) {
	digest, cf, err := oneLayerImage(img)
	if err != nil {
		return v1.Hash{}, err
	}
	arch, err := SharedObjectArch(so)
	if err != nil {
		return v1.Hash{}, err
	}
	uid := strconv.Itoa(NonRootUID)
	c := cf.Config
	switch {
	case cf.OS != "linux" || cf.Architecture != arch:
		return v1.Hash{}, fmt.Errorf("oci: config: platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	case !slices.Equal(c.Entrypoint, []string{InstallerPath}) || !slices.Equal(c.Cmd, []string{InstallerDir}):
		return v1.Hash{}, fmt.Errorf("oci: config: entrypoint %q, cmd %q, want [%s] [%s]", c.Entrypoint, c.Cmd, InstallerPath, InstallerDir)
	case c.User != uid+":"+uid:
		return v1.Hash{}, fmt.Errorf("oci: config.User: %q, want %s:%s", c.User, uid, uid)
	}
	files, err := layerFiles(img)
	if err != nil {
		return v1.Hash{}, err
	}
	if len(files) != 2 || !bytes.Equal(files[ModuleFileName], so) || !bytes.Equal(files[InstallerPath[1:]], installer) {
		var names []string
		for n := range files {
			names = append(names, n)
		}
		slices.Sort(names)
		return v1.Hash{}, fmt.Errorf("oci: layer: files [%s], want %s of %d bytes (%s) and %s of %d bytes (%s)",
			strings.Join(names, " "), ModuleFileName, len(so), sha256Hash(so), InstallerPath, len(installer), sha256Hash(installer))
	}
	return digest, nil
}
