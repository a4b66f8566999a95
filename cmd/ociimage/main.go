// Command ociimage packages build/plugin.wasm as an OCI image that Istio's
// WasmPlugin loads (package oci: the Wasm image specification's compat
// variant), without a Docker daemon. It writes an OCI image layout directory
// and a tar archive of it, reads both back and verifies them, prints the
// digests a WasmPlugin needs, can push the image to a registry, and can fill
// the url and sha256 of WasmPlugin manifests in for the image.
//
//	go run ./cmd/ociimage -wasm build/plugin.wasm -layout build/oci \
//	    -archive build/plugin-oci.tar -ref ghcr.io/acme/ratelimit:0.1.0 \
//	    [-summary build/plugin-oci.json] [-render examples/istio -render-out build/istio] [-push]
//
// With -exe it packages a static Linux executable instead (the limit service:
// `make oci-limitd`), as a container image FROM scratch that runs as a
// non-root user (oci.BuildExecutable), written, read back and verified the
// same way:
//
//	go run ./cmd/ociimage -exe build/limitd -exe-port 8429 -exe-cmd '--listen=:8429' \
//	    -layout build/limitd-oci -archive build/limitd-oci.tar -ref localhost/ratelimit-wasm/limitd:dev
//
// With -module it packages the native module (build/libtokenbucket.so: `make
// oci-native`) as an image holding it at its root, with -module-installer
// (cmd/installmodule) as its entrypoint (oci.BuildModule),
// written, read back and verified the same way, and -render-native fills in
// the native module's image (the init containers' images, image volume
// references) in the native-module manifests given
// (examples/istio/native-envoyfilter.yaml, examples/envoy-gateway/native.yaml)
// with <ref>@sha256:<image digest>:
//
//	go run ./cmd/ociimage -module build/libtokenbucket.so -module-installer build/installmodule-linux-amd64 -layout build/native-oci \
//	    -archive build/native-oci.tar -ref localhost/ratelimit-wasm/tokenbucket-native:dev \
//	    -render-native examples/istio/native-envoyfilter.yaml -render-out build/istio
//
// The creation time recorded in the image is $SOURCE_DATE_EPOCH, or the Unix
// epoch when unset, so the image digest depends on plugin.wasm (or the
// executable, or the module) alone.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/oci"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

// Summary is what -summary writes: the image's identities as JSON.
type Summary struct {
	Ref    string `json:"ref"`
	Layout string `json:"layout,omitempty"`
	// Archive is the tar of the layout.
	Archive string `json:"archive,omitempty"`
	// ImageDigest is sha256:<hex> of the manifest; ImageSHA256 its hex part,
	// the WasmPlugin spec.sha256 for an oci:// url.
	ImageDigest string `json:"image_digest"`
	ImageSHA256 string `json:"image_sha256"`
	// WasmSHA256 is sha256(plugin.wasm), the spec.sha256 for an http(s)://
	// url.
	WasmSHA256  string `json:"wasm_sha256"`
	WasmSize    int64  `json:"wasm_size"`
	LayerDigest string `json:"layer_digest"`
	LayerSize   int64  `json:"layer_size"`
	Pushed      bool   `json:"pushed"`
	// Manifests are the WasmPlugin manifests written by -render.
	Manifests []string `json:"manifests,omitempty"`
	// Executable is /usr/local/bin/<name> in an -exe image, and
	// ExecutableSHA256 the sha256 of its bytes (empty for the plugin).
	Executable       string `json:"executable,omitempty"`
	ExecutableSHA256 string `json:"executable_sha256,omitempty"`
	// Aliases are the symbolic links to the executable (-exe-alias).
	Aliases []string `json:"aliases,omitempty"`
	// User is the uid:gid an -exe image runs as.
	User string `json:"user,omitempty"`
	// Module is /libtokenbucket.so in a -module image, ModuleSHA256 the
	// sha256 of its bytes and Architecture the platform's (amd64, arm64).
	Module       string `json:"module,omitempty"`
	ModuleSHA256 string `json:"module_sha256,omitempty"`
	Architecture string `json:"architecture,omitempty"`
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	wasmPath := fs.String("wasm", "build/plugin.wasm", "the compiled plugin")
	layoutDir := fs.String("layout", "build/oci", "OCI image layout directory to write (replaced if it is a layout)")
	archivePath := fs.String("archive", "build/plugin-oci.tar", "tar archive of the layout to write (empty: none)")
	ref := fs.String("ref", "localhost/ratelimit-wasm/tokenbucket:dev", "image reference recorded in the layout and used by -push")
	summaryPath := fs.String("summary", "", "write the digests as JSON to this file")
	push := fs.Bool("push", false, "push the image to -ref (credentials from ~/.docker/config.json), then pull it back and verify it")
	renderSrc := fs.String("render", "", "directory of WasmPlugin manifests to fill in with -ref and the image digest (empty: none)")
	renderDst := fs.String("render-out", "build/istio", "where -render writes the filled-in manifests")
	exePath := fs.String("exe", "", "package this static Linux executable as a container image instead of -wasm")
	exeName := fs.String("exe-name", "", "the executable's name under /usr/local/bin (default: the base name of -exe)")
	exeCmd := fs.String("exe-cmd", "", "default arguments of an -exe image, separated by spaces")
	exePort := fs.Int("exe-port", 0, "TCP port an -exe image exposes (0: none)")
	exeAlias := fs.String("exe-alias", "", "absolute paths, separated by spaces, at which an -exe image holds a symbolic link to the executable (limitd's /bin/ratelimit)")
	modulePath := fs.String("module", "", "package this native module (a Linux ELF shared object) instead of -wasm")
	installerPath := fs.String("module-installer", "", "with -module: the installer (cmd/installmodule, static, the module's architecture), the image's entrypoint")
	renderNative := fs.String("render-native", "", "native-module manifests (space-separated, each file or file=output-dir) whose image volume references and .../tokenbucket-native container images to fill in with -ref@<image digest>, written to -render-out or output-dir (empty: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	created, err := sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return err
	}

	var (
		built *oci.Image
		check func(v1.Image) (v1.Hash, error) // verifies an image read back
		exe   oci.Executable
	)
	var module, installer []byte
	switch {
	case *exePath != "" && *modulePath != "":
		return errors.New("-exe and -module: one image at a time")
	case *modulePath != "":
		if *installerPath == "" {
			return errors.New("-module needs -module-installer (cmd/installmodule built for the module's architecture)")
		}
		if module, err = os.ReadFile(*modulePath); err != nil {
			return err
		}
		if installer, err = os.ReadFile(*installerPath); err != nil {
			return err
		}
		if built, err = oci.BuildModule(module, installer, created); err != nil {
			return fmt.Errorf("%s: %w", *modulePath, err)
		}
		check = func(img v1.Image) (v1.Hash, error) { return oci.VerifyModule(img, module, installer) }
	case *exePath != "":
		bin, err := os.ReadFile(*exePath)
		if err != nil {
			return err
		}
		exe = oci.Executable{Name: *exeName, Binary: bin, Cmd: strings.Fields(*exeCmd), Aliases: strings.Fields(*exeAlias)}
		if exe.Name == "" {
			exe.Name = filepath.Base(*exePath)
		}
		if *exePort != 0 {
			exe.Ports = []int{*exePort}
		}
		if built, err = oci.BuildExecutable(exe, created); err != nil {
			return fmt.Errorf("%s: %w", *exePath, err)
		}
		check = func(img v1.Image) (v1.Hash, error) { return oci.VerifyExecutable(img, exe) }
	default:
		wasm, err := os.ReadFile(*wasmPath)
		if err != nil {
			return err
		}
		if built, err = oci.Build(wasm, created); err != nil {
			return fmt.Errorf("%s: %w", *wasmPath, err)
		}
		check = func(img v1.Image) (v1.Hash, error) { return oci.Verify(img, wasm) }
	}
	img, err := built.V1()
	if err != nil {
		return err
	}
	d := built.Digests()
	verify := func(where string, img v1.Image) error {
		got, err := check(img)
		if err != nil {
			return fmt.Errorf("verify %s: %w", where, err)
		}
		if got != d.Image {
			return fmt.Errorf("verify %s: image digest %s, built %s", where, got, d.Image)
		}
		return nil
	}

	// Write, then read back from disk and verify what was written.
	if err := oci.WriteLayout(*layoutDir, img, *ref); err != nil {
		return err
	}
	fromLayout, err := oci.ReadLayout(*layoutDir)
	if err != nil {
		return err
	}
	if err := verify("layout "+*layoutDir, fromLayout); err != nil {
		return err
	}
	if *archivePath != "" {
		if err := writeArchive(*archivePath, *layoutDir, created); err != nil {
			return err
		}
		f, err := os.Open(*archivePath)
		if err != nil {
			return err
		}
		fromArchive, err := oci.ReadArchive(f)
		f.Close()
		if err != nil {
			return err
		}
		if err := verify("archive "+*archivePath, fromArchive); err != nil {
			return err
		}
	}

	if *push {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := oci.Push(ctx, img, *ref); err != nil {
			return err
		}
		pulled, err := oci.Pull(ctx, *ref)
		if err != nil {
			return err
		}
		if err := verify("registry "+*ref, pulled); err != nil {
			return err
		}
	}

	var rendered []string
	if *renderSrc != "" && (*exePath != "" || *modulePath != "") {
		return errors.New("-render fills in WasmPlugins: not with -exe or -module")
	}
	if *renderNative != "" && *modulePath == "" {
		return errors.New("-render-native fills in the native module's image: only with -module")
	}
	if *renderSrc != "" {
		if rendered, err = renderManifests(*renderSrc, *renderDst, *ref, d.Image.Hex); err != nil {
			return err
		}
	}
	if *renderNative != "" {
		if rendered, err = renderNativeManifests(strings.Fields(*renderNative), *renderDst, *ref, d.Image.String()); err != nil {
			return err
		}
	}

	s := Summary{
		Ref:         *ref,
		Layout:      *layoutDir,
		Archive:     *archivePath,
		ImageDigest: d.Image.String(),
		ImageSHA256: d.Image.Hex,
		WasmSHA256:  d.Wasm.Hex,
		WasmSize:    d.WasmSize,
		LayerDigest: d.Layer.String(),
		LayerSize:   d.LayerSize,
		Pushed:      *push,
		Manifests:   rendered,
	}
	if *modulePath != "" {
		s.WasmSHA256, s.WasmSize = "", 0
		s.Module = "/" + oci.ModuleFileName
		s.ModuleSHA256 = sha256Hex(module)
		s.Architecture, _ = oci.SharedObjectArch(module) // BuildModule checked it
	}
	if *exePath != "" {
		s.WasmSHA256, s.WasmSize = "", 0
		s.Executable = oci.ExecutablePath(exe.Name)
		s.ExecutableSHA256 = sha256Hex(exe.Binary)
		s.Aliases = exe.Aliases
		s.User = strconv.Itoa(oci.NonRootUID) + ":" + strconv.Itoa(oci.NonRootUID)
	}
	if *summaryPath != "" {
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*summaryPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	printSummary(stdout, s)
	return nil
}

// sourceDateEpoch parses $SOURCE_DATE_EPOCH (reproducible-builds.org): Unix
// seconds, the epoch when empty.
func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH: want Unix seconds >= 0, got %q", v)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// writeArchive writes the tar next to its final name and renames it, so an
// interrupted run never leaves a truncated archive behind.
func writeArchive(path, layoutDir string, modTime time.Time) error {
	var buf bytes.Buffer
	if err := oci.WriteArchive(&buf, layoutDir, modTime); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".plugin-oci-*.tar")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(buf.Bytes())
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func printSummary(w io.Writer, s Summary) {
	what, hash, width := "wasm", s.WasmSHA256, 8
	if s.Module != "" {
		what, hash, width = "module", s.ModuleSHA256, 8
		fmt.Fprintf(w, "OCI image of the native module (linux/%s, %s at its root), read back and verified:\n", s.Architecture, s.Module)
	} else if s.Executable != "" {
		what, hash, width = "executable", s.ExecutableSHA256, 11
		fmt.Fprintf(w, "Container image of %s (static, runs as %s), read back and verified:\n", s.Executable, s.User)
		for _, a := range s.Aliases {
			fmt.Fprintf(w, "  %s -> %s\n", a, s.Executable)
		}
	} else {
		fmt.Fprintf(w, "OCI image (Wasm image spec, compat variant) of %d-byte plugin.wasm, verified as Istio reads it:\n", s.WasmSize)
	}
	col := func(name string) string { return fmt.Sprintf("  %-*s", width, name) }
	fmt.Fprintf(w, "%s %s\n", col("layout"), s.Layout)
	if s.Archive != "" {
		fmt.Fprintf(w, "%s %s (oci-archive; docker load accepts it too)\n", col("archive"), s.Archive)
	}
	fmt.Fprintf(w, "%s %s", col("ref"), s.Ref)
	if s.Pushed {
		fmt.Fprint(w, " (pushed, pulled back, verified)")
	}
	fmt.Fprintf(w, "\n%s %s\n%s sha256:%s\n", col("image"), s.ImageDigest, col(what), hash)
	if s.Module != "" {
		fmt.Fprintf(w, "Image volume (Kubernetes), or init container copying the module into an emptyDir at %s, with image %s@%s\n",
			oci.InstallerDir, s.Ref, s.ImageDigest)
		for _, m := range s.Manifests {
			fmt.Fprintf(w, "wrote %s (the module's image %s@%s)\n", m, s.Ref, s.ImageDigest)
		}
		return
	}
	if s.Executable != "" {
		return
	}
	fmt.Fprintf(w, "WasmPlugin with url oci://<repo>:<tag> or oci://<repo>@%s:\n", s.ImageDigest)
	fmt.Fprintf(w, "  sha256: %s\n", s.ImageSHA256)
	fmt.Fprintf(w, "WasmPlugin with url https://.../plugin.wasm:\n")
	fmt.Fprintf(w, "  sha256: %s\n", s.WasmSHA256)
	for _, m := range s.Manifests {
		fmt.Fprintf(w, "wrote %s (url oci://%s, sha256 of the image)\n", m, s.Ref)
	}
}
