// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxFrontLines bounds the front page: what the project is, what it costs,
// which limiter when, the quick start, your own Envoy and where to go next.
// Everything else has its page under docs/.
const maxFrontLines = 150

// maxSentenceWords bounds a sentence of the front page's prose.
const maxSentenceWords = 45

// sentenceEndRE ends a sentence: '.', '!' or '?' and a space before what
// may start the next one.
var sentenceEndRE = regexp.MustCompile("([.!?])\\s+([A-Z*`\\[(])")

// prose returns the sentences of a Markdown text outside fenced blocks,
// tables, headings and HTML comments; a list item starts a paragraph.
func prose(md string) []string {
	var paras []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			paras = append(paras, strings.Join(cur, " "))
			cur = nil
		}
	}
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			fenced = !fenced
			flush()
		case fenced:
		case trimmed == "", strings.HasPrefix(trimmed, "|"), strings.HasPrefix(trimmed, "#"), strings.HasPrefix(trimmed, "<!--"):
			flush()
		case strings.HasPrefix(trimmed, "- "):
			flush()
			cur = append(cur, trimmed[2:])
		default:
			cur = append(cur, trimmed)
		}
	}
	flush()
	var out []string
	for _, p := range paras {
		p = sentenceEndRE.ReplaceAllString(p, "$1\n$2")
		out = append(out, strings.Split(p, "\n")...)
	}
	return out
}

// TestFrontPage checks README.md's length, the length of its sentences,
// and that it links each page a reader goes to next.
func TestFrontPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > maxFrontLines {
		t.Errorf("README.md has %d lines, at most %d: move the details to their page under docs/", n, maxFrontLines)
	}
	for _, sentence := range prose(readme) {
		if n := len(strings.Fields(sentence)); n > maxSentenceWords {
			t.Errorf("README.md: a sentence of %d words, at most %d: %.80s…", n, maxSentenceWords, sentence)
		}
	}
	for _, page := range []string{"docs/configuration.md", "docs/responses.md", "docs/limit-service.md",
		"docs/response-costs.md", "docs/istio.md", "docs/troubleshooting.md", "docs/RATIONALE.md",
		"docs/benchmarks/README.md", "(examples)", "docs/compatibility.md", "CHANGELOG.md"} {
		if !strings.Contains(readme, page) {
			t.Errorf("README.md does not link %s", page)
		}
	}
}
