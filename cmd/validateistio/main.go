// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command validateistio checks Kubernetes manifests for the plugin before
// they are applied (`make validate-istio`): each document is decoded strictly
// into the Istio or Kubernetes API type of its kind (WasmPlugin,
// ServiceEntry, DestinationRule, AuthorizationPolicy, PeerAuthentication,
// Service, Deployment, Secret, ServiceAccount; an unknown or misspelt field,
// a duplicate key or a wrong type fails), and every WasmPlugin's
// pluginConfig goes through the plugin's own parser in the JSON form Istio
// hands it (package manifest).
// The manifests' own choices (failStrategy, phase, limits) are not judged.
//
//	go run ./cmd/validateistio build/istio/*.yaml
//	go run ./cmd/validateistio -require-clusters examples/istio/*.yaml
//
// It exits 1 when a file fails, 2 on a usage error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/internal/manifest"
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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: validateistio [-require-clusters] manifest.yaml...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if err := validate(fs.Args(), manifest.Options{RequireClusters: *requireClusters}, stdout); err != nil {
		if !errors.Is(err, errFailed) {
			fmt.Fprintln(stderr, err)
		}
		return 1
	}
	return 0
}

// validate decodes every file, then validates all their documents
// together, printing one line per file, per note and per error.
func validate(paths []string, opts manifest.Options, w io.Writer) error {
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
	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAIL %v\n", e)
	}
	if failed || len(r.Errors) > 0 {
		return errFailed
	}
	fmt.Fprintf(w, "%d file(s) valid: %d WasmPlugin(s), %d rule(s) accepted by the plugin's parser\n", len(paths), r.Plugins, r.Rules)
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
