// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command validateistio checks Kubernetes manifests for the plugin before
// they are applied (`make validate-istio`): each document is decoded strictly
// into the Istio or Kubernetes API type of its kind (WasmPlugin,
// EnvoyFilter, ServiceEntry, DestinationRule, AuthorizationPolicy,
// PeerAuthentication, Service, Deployment, Secret, ServiceAccount; an
// unknown or misspelt field, a duplicate key or a wrong type fails), every
// WasmPlugin's pluginConfig and every native-module configuration of an
// EnvoyFilter goes through the plugin's own parser in the form the plugin
// receives it, and the Deployments an EnvoyFilter selects must give Envoy
// what it needs to load the native module (package manifest).
// The manifests' own choices (failStrategy, phase, limits) are not judged.
//
//	go run ./cmd/validateistio build/istio/*.yaml
//	go run ./cmd/validateistio -require-clusters examples/istio/*.yaml
//	go run ./cmd/validateistio -image build/plugin-oci.json build/istio/*.yaml
//
// With -image (the summary `make oci` writes), every WasmPlugin must also
// load that image: an oci:// url must be oci://<its ref> with spec.sha256
// its image digest, another url's spec.sha256 that of its plugin.wasm. So a
// manifest rendered for another reference, or before the plugin was
// rebuilt, is refused rather than applied. With -native-image (the summary
// `make oci-native` writes), every image an istio-proxy gets the native
// module from must be that image as <ref>@sha256:<image digest>: the image
// of each init container writing the volume istio-proxy mounts at its
// ENVOY_DYNAMIC_MODULES_SEARCH_PATH, or of an image volume mounted there.
// The files are only read.
//
// It exits 1 when a file fails, 2 on a usage error.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errFailed says that findings were printed.
var errFailed = errors.New("validateistio: manifests refused")

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validateistio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	requireClusters := fs.Bool("require-clusters", false, "fail when a cluster rule's service.cluster is created by none of the given manifests")
	imagePath := fs.String("image", "", "the summary `make oci` wrote (build/plugin-oci.json): every WasmPlugin must load that image")
	nativePath := fs.String("native-image", "", "the summary `make oci-native` wrote (build/native-oci.json): every image the native module is loaded from (init container or image volume) must be that image")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: validateistio [-require-clusters] [-image build/plugin-oci.json] [-native-image build/native-oci.json] manifest.yaml...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	var img *image
	if *imagePath != "" {
		var err error
		if img, err = readImage(*imagePath); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	var native *nativeImage
	if *nativePath != "" {
		var err error
		if native, err = readNativeImage(*nativePath); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	if err := validate(fs.Args(), manifest.Options{RequireClusters: *requireClusters}, img, native, stdout); err != nil {
		if !errors.Is(err, errFailed) {
			fmt.Fprintln(stderr, err)
		}
		return 1
	}
	return 0
}

// validate decodes every file, then validates all their documents
// together (and against img and native, when not nil), printing one line per file, per
// note and per error.
func validate(paths []string, opts manifest.Options, img *image, native *nativeImage, w io.Writer) error {
	var all []manifest.Doc
	failed := false
	for _, p := range paths {
		docs, err := manifest.DecodeFile(p)
		if err != nil {
			fmt.Fprintf(w, "FAIL %s: %v\n", p, err)
			failed = true
			continue
		}
		if len(docs) == 0 {
			fmt.Fprintf(w, "FAIL %s: no document\n", p)
			failed = true
			continue
		}
		kinds := map[string]int{}
		for _, d := range docs {
			kinds[d.Kind]++
		}
		fmt.Fprintf(w, "ok   %s: %s\n", p, describe(kinds))
		for i := range docs {
			docs[i].File = filepath.ToSlash(p) // name files as given in the findings
		}
		all = append(all, docs...)
	}
	r := manifest.Validate(all, opts)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note %s\n", n)
	}
	if img != nil {
		r.Errors = append(r.Errors, img.check(all)...)
	}
	if native != nil {
		r.Errors = append(r.Errors, native.check(all)...)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAIL %v\n", e)
	}
	if failed || len(r.Errors) > 0 {
		return errFailed
	}
	fmt.Fprintf(w, "%d file(s) valid: %d WasmPlugin(s), %d native-module filter(s) in EnvoyFilters, %d rule(s) accepted by the plugin's parser\n",
		len(paths), r.Plugins, r.NativeFilters, r.Rules)
	return nil
}

func describe(kinds map[string]int) string {
	var parts []string
	for k, n := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// image is the part of cmd/ociimage's summary that a WasmPlugin names.
type image struct {
	file        string
	Ref         string `json:"ref"`
	ImageSHA256 string `json:"image_sha256"`
	WasmSHA256  string `json:"wasm_sha256"`
}

func readImage(path string) (*image, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("validateistio: -image: %w", err)
	}
	img := &image{file: path}
	if err := json.Unmarshal(b, img); err != nil {
		return nil, fmt.Errorf("validateistio: -image %s: %w", path, err)
	}
	if img.Ref == "" || len(img.ImageSHA256) != 64 || len(img.WasmSHA256) != 64 {
		return nil, fmt.Errorf("validateistio: -image %s: want ref, image_sha256 and wasm_sha256, got %q, %q, %q", path, img.Ref, img.ImageSHA256, img.WasmSHA256)
	}
	return img, nil
}

// check returns an error for every WasmPlugin of docs that would not load
// img.
func (img *image) check(docs []manifest.Doc) []error {
	var errs []error
	for _, d := range docs {
		wp, ok := d.Obj.(*clientext.WasmPlugin)
		if !ok {
			continue
		}
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s (WasmPlugin %s/%s): %s (the image of %s)", d, wp.Namespace, wp.Name, fmt.Sprintf(format, args...), img.file))
		}
		url, sum := wp.Spec.Url, wp.Spec.Sha256
		switch {
		case strings.HasPrefix(url, "oci://"):
			if url != "oci://"+img.Ref {
				fail("spec.url %q, want %q", url, "oci://"+img.Ref)
			}
			if sum != img.ImageSHA256 {
				fail("spec.sha256 %q, want the image digest %q", sum, img.ImageSHA256)
			}
		case sum != "" && sum != img.WasmSHA256:
			fail("spec.sha256 %q, want plugin.wasm's %q", sum, img.WasmSHA256)
		}
	}
	return errs
}
