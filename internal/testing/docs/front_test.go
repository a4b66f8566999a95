// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFrontLines bounds the front page: what the project is, what it costs,
// which limiter when, the quick start, your own Envoy and where to go next.
// Everything else has its page under docs/.
const maxFrontLines = 150

// TestFrontPage checks README.md's length and that it links each page a
// reader goes to next.
func TestFrontPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > maxFrontLines {
		t.Errorf("README.md has %d lines, at most %d: move the details to their page under docs/", n, maxFrontLines)
	}
	for _, page := range []string{"docs/configuration.md", "docs/responses.md", "docs/limit-service.md",
		"docs/response-costs.md", "docs/istio.md", "docs/troubleshooting.md", "docs/RATIONALE.md",
		"docs/benchmarks/README.md", "(examples)", "docs/compatibility.md", "CHANGELOG.md"} {
		if !strings.Contains(readme, page) {
			t.Errorf("README.md does not link %s", page)
		}
	}
}
