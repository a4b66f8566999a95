// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package oci

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// NonRootUID is the user and group the image runs as (the value distroless
// images call nonroot).
const NonRootUID = 65532

// Executable describes the image BuildExecutable makes.
type Executable struct {
	// Name is the file name under /usr/local/bin, e.g. "limitd".
	Name string
	// Binary is the executable: a statically linked ELF file.
	Binary []byte
	// Cmd are the default arguments (the image's Cmd; Entrypoint is the
	// executable).
	Cmd []string
	// Ports are the exposed TCP ports.
	Ports []int
	// Aliases are absolute paths, outside /usr/local/bin, at which the
	// layer holds a symbolic link to the executable: another name to run
	// it by (limitd's /bin/ratelimit).
	Aliases []string
}

// ExecutablePath returns where the image holds the executable named name.
func ExecutablePath(name string) string { return "/usr/local/bin/" + name }

// BuildExecutable packages one statically linked Linux executable (the limit
// service, limitd) as an ordinary container image created at created, FROM
// scratch: no base image is pulled. Its single layer holds what a static
// binary that runs as a non-root user needs and nothing else:
//
//	/etc/passwd, /etc/group   root and the user NonRootUID ("nonroot")
//	/home/nonroot/            its home and the working directory, owned by it
//	/tmp/                     mode 1777
//	/usr/local/bin/<name>     the executable, mode 0755, owned by root
//	each of e.Aliases         a symbolic link to it (and its folders)
//
// The config runs the executable as NonRootUID:NonRootUID with e's Cmd and
// exposed ports, on the ELF file's architecture. There are no CA
// certificates: a TLS client inside must be given them (SSL_CERT_FILE). As
// with Build, the image depends only on e and created: the same executable
// gives the same digest.
func BuildExecutable(e Executable, created time.Time) (*Image, error) {
	if e.Name == "" || path.Base(e.Name) != e.Name || e.Name == "." || e.Name == ".." {
		return nil, fmt.Errorf("oci: executable name %q: want a plain file name", e.Name)
	}
	arch, err := StaticELFArch(e.Binary)
	if err != nil {
		return nil, err
	}
	for _, a := range e.Aliases {
		if !path.IsAbs(a) || path.Clean(a) != a || a == "/" || path.Dir(a) == path.Dir(ExecutablePath(e.Name)) {
			return nil, fmt.Errorf("oci: alias %q: want a clean absolute path outside %s", a, path.Dir(ExecutablePath(e.Name)))
		}
	}
	created = created.UTC()
	rawTar, err := rootfsTar(e, created)
	if err != nil {
		return nil, err
	}
	uid := strconv.Itoa(NonRootUID)
	ports := map[string]struct{}{}
	for _, p := range e.Ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("oci: port %d: out of range", p)
		}
		ports[strconv.Itoa(p)+"/tcp"] = struct{}{}
	}
	cfg := v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Config: v1.Config{
			User:         uid + ":" + uid,
			Entrypoint:   []string{ExecutablePath(e.Name)},
			Cmd:          e.Cmd,
			ExposedPorts: ports,
			Env:          []string{"PATH=/usr/local/bin"},
			WorkingDir:   "/home/nonroot",
		},
		History: []v1.History{{
			CreatedBy: "ratelimit-wasm oci.BuildExecutable",
			Comment:   e.Name,
		}},
	}
	return assemble(rawTar, cfg, created, nil)
}

// StaticELFArch returns the Go architecture name of a statically linked
// Linux ELF executable (no program interpreter, no shared libraries), or an
// error saying why b is not one.
func StaticELFArch(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("oci: executable: not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("oci: executable: ELF type %v is not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("oci: executable: dynamically linked (it has a program interpreter); build it with CGO_ENABLED=0")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return "", fmt.Errorf("oci: executable: needs shared libraries %q; build it with CGO_ENABLED=0", libs)
	}
	if arch := goArch(f.Machine); arch != "" {
		return arch, nil
	}
	return "", fmt.Errorf("oci: executable: machine %v is not supported (amd64, arm64)", f.Machine)
}

// goArch is the Go architecture name of an ELF machine ("" when it is
// neither amd64 nor arm64).
func goArch(m elf.Machine) string {
	switch m {
	case elf.EM_X86_64:
		return "amd64"
	case elf.EM_AARCH64:
		return "arm64"
	}
	return ""
}

// rootfsTar returns the layer of BuildExecutable, uncompressed.
func rootfsTar(e Executable, created time.Time) ([]byte, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:65532:\n"
	entries := []layerEntry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, contents: []byte(group)},
		{name: "etc/passwd", mode: 0o644, contents: []byte(passwd)},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: NonRootUID, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: ExecutablePath(e.Name)[1:], mode: 0o755, contents: e.Binary},
	}
	dirs := map[string]bool{}
	for _, en := range entries {
		if en.dir {
			dirs[en.name] = true
		}
	}
	for _, a := range e.Aliases {
		var parents []string
		for d := path.Dir(a); d != "/"; d = path.Dir(d) {
			parents = append([]string{d[1:] + "/"}, parents...)
		}
		for _, d := range parents {
			if !dirs[d] {
				dirs[d] = true
				entries = append(entries, layerEntry{name: d, mode: 0o755, dir: true})
			}
		}
		entries = append(entries, layerEntry{name: a[1:], mode: 0o777, link: ExecutablePath(e.Name)})
	}
	return writeLayer(created, entries)
}

// layerEntry is one file or folder (dir) of a layer writeLayer makes, owned
// by uid as user and group.
type layerEntry struct {
	name     string
	mode     int64
	uid      int
	dir      bool
	link     string // a symbolic link to link
	contents []byte
}

// writeLayer returns an uncompressed tar layer of entries, in order, each
// modified at created.
func writeLayer(created time.Time, entries []layerEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, en := range entries {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: en.name, Mode: en.mode, Size: int64(len(en.contents)),
			Uid: en.uid, Gid: en.uid, ModTime: created, Format: tar.FormatPAX,
		}
		switch {
		case en.dir:
			hdr.Typeflag = tar.TypeDir
		case en.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, en.link
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("oci: layer: %s: %w", en.name, err)
		}
		if _, err := tw.Write(en.contents); err != nil {
			return nil, fmt.Errorf("oci: layer: %s: %w", en.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("oci: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// VerifyExecutable checks that img is the image BuildExecutable makes of e:
// one gzip tar layer, config for Linux on the executable's architecture,
// run as a non-root user that /etc/passwd names, Entrypoint the executable,
// e's Cmd and ports, and the executable's bytes equal to e.Binary. It
// returns the image digest.
func VerifyExecutable(img v1.Image, e Executable) (v1.Hash, error) {
	digest, cf, err := oneLayerImage(img)
	if err != nil {
		return v1.Hash{}, err
	}
	arch, err := StaticELFArch(e.Binary)
	if err != nil {
		return v1.Hash{}, err
	}
	uid := strconv.Itoa(NonRootUID)
	c := cf.Config
	switch {
	case cf.OS != "linux" || cf.Architecture != arch:
		return v1.Hash{}, fmt.Errorf("oci: config: platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	case c.User != uid+":"+uid:
		return v1.Hash{}, fmt.Errorf("oci: config.User: %q, want %s:%s", c.User, uid, uid)
	case !slices.Equal(c.Entrypoint, []string{ExecutablePath(e.Name)}):
		return v1.Hash{}, fmt.Errorf("oci: config.Entrypoint: %q, want [%s]", c.Entrypoint, ExecutablePath(e.Name))
	case !slices.Equal(c.Cmd, e.Cmd):
		return v1.Hash{}, fmt.Errorf("oci: config.Cmd: %q, want %q", c.Cmd, e.Cmd)
	case len(c.ExposedPorts) != len(e.Ports):
		return v1.Hash{}, fmt.Errorf("oci: config.ExposedPorts: %v, want %v", c.ExposedPorts, e.Ports)
	}
	for _, p := range e.Ports {
		if _, ok := c.ExposedPorts[strconv.Itoa(p)+"/tcp"]; !ok {
			return v1.Hash{}, fmt.Errorf("oci: config.ExposedPorts: %v lacks %d/tcp", c.ExposedPorts, p)
		}
	}
	files, links, err := layerContents(img)
	if err != nil {
		return v1.Hash{}, err
	}
	for _, a := range e.Aliases {
		if got := links[a[1:]]; got != ExecutablePath(e.Name) {
			return v1.Hash{}, fmt.Errorf("oci: %s: a link to %q, want one to %s", a, got, ExecutablePath(e.Name))
		}
	}
	if len(links) != len(e.Aliases) {
		return v1.Hash{}, fmt.Errorf("oci: %d symbolic links in the layer, want %d (%q)", len(links), len(e.Aliases), e.Aliases)
	}
	if !bytes.Contains(files["etc/passwd"], []byte("nonroot:x:"+uid+":"+uid+":")) {
		return v1.Hash{}, fmt.Errorf("oci: /etc/passwd: no nonroot user %s", uid)
	}
	bin := ExecutablePath(e.Name)[1:]
	if !bytes.Equal(files[bin], e.Binary) {
		return v1.Hash{}, fmt.Errorf("oci: /%s: %d bytes (%s), want %d bytes (%s)",
			bin, len(files[bin]), sha256Hash(files[bin]), len(e.Binary), sha256Hash(e.Binary))
	}
	return digest, nil
}

// oneLayerImage returns the digest and config of img after checking that
// its manifest is an OCI one with one gzip tar layer.
func oneLayerImage(img v1.Image) (v1.Hash, *v1.ConfigFile, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, nil, fmt.Errorf("oci: digest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return v1.Hash{}, nil, fmt.Errorf("oci: manifest: %w", err)
	}
	if m.MediaType != ManifestMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != LayerMediaType {
		return v1.Hash{}, nil, fmt.Errorf("oci: manifest: want an OCI manifest with one %s layer, got %s with %d layers", LayerMediaType, m.MediaType, len(m.Layers))
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, nil, fmt.Errorf("oci: config: %w", err)
	}
	return digest, cf, nil
}

// maxLayerSize bounds what layerFiles reads.
const maxLayerSize = 256 << 20

// layerFiles returns the regular files of img's only layer by name.
func layerFiles(img v1.Image) (map[string][]byte, error) {
	files, _, err := layerContents(img)
	return files, err
}

// layerContents returns the regular files of img's only layer by name,
// and its symbolic links' targets by name.
func layerContents(img v1.Image) (map[string][]byte, map[string]string, error) {
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		return nil, nil, fmt.Errorf("oci: layers: want 1, got %d (%v)", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return nil, nil, fmt.Errorf("oci: layer: %w", err)
	}
	defer rc.Close()
	files := map[string][]byte{}
	links := map[string]string{}
	var total int64
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, links, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("oci: layer: %w", err)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			links[path.Clean(hdr.Name)] = hdr.Linkname
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if total += hdr.Size; total > maxLayerSize {
			return nil, nil, fmt.Errorf("oci: layer: more than %d bytes", maxLayerSize)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, fmt.Errorf("oci: layer: %s: %w", hdr.Name, err)
		}
		files[path.Clean(hdr.Name)] = b
	}
}
