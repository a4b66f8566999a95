package istio_test

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// loadManifest reads and strictly decodes every document of a manifest
// (package manifest: the Istio and Kubernetes API types, unknown fields
// refused).
func loadManifest(t *testing.T, path string) []manifest.Doc {
	t.Helper()
	docs, err := manifest.DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// loadExamples decodes every manifest of this directory (the Envoy bootstrap
// template aside).
func loadExamples(t *testing.T) []manifest.Doc {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var docs []manifest.Doc
	for _, f := range files {
		if f == envoyTemplate {
			continue
		}
		docs = append(docs, loadManifest(t, f)...)
	}
	if len(docs) == 0 {
		t.Fatal("no manifests found")
	}
	return docs
}

var sha256Pattern = regexp.MustCompile(`^[a-f0-9]{64}$`)
