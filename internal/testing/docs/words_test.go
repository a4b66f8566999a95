// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// userFacing reports whether the Markdown file at rel (relative to the
// repository's top, forward slashes) is read by users: the front page, the
// changelog, the limit service's README, every page under docs/ and every
// example's README.
func userFacing(rel string) bool {
	switch {
	case rel == "README.md", rel == "CHANGELOG.md", rel == "service/README.md":
		return true
	case strings.HasPrefix(rel, "docs/"):
		return true
	case strings.HasPrefix(rel, "examples/") && path.Base(rel) == "README.md":
		return true
	}
	return false
}

var (
	// issueRE finds a reference to one of the project's issues by number:
	// "issue 11", "issues 10, 11", "Issue #13". A user has no access to
	// them: say what changed or what is asked instead.
	issueRE = regexp.MustCompile(`(?i)\bissues?\s+#?[0-9]+`)
	// numberedRE finds a parenthesised small number, "(23)": the way the
	// benchmark program numbers its configurations. A user reads the
	// configuration's name instead. A value given for a setting named in a
	// code span ("`default_cost` (2)") is not one: see valueRE.
	numberedRE = regexp.MustCompile(`\([0-9]{1,2}\)`)
	// valueRE is a code span followed by a space, ending where a
	// parenthesised value of the setting it names would start.
	valueRE = regexp.MustCompile("`\\s$")
)

// wordProblem is one reference a user cannot follow.
type wordProblem struct {
	line int
	what string
}

// foreignWords returns the issue numbers and numbered configurations in the
// prose of one Markdown text: outside fenced code blocks and code spans.
func foreignWords(md string) []wordProblem {
	var out []wordProblem
	fenced := ""
	for i, line := range strings.Split(md, "\n") {
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fenced == "":
				fenced = m[1][:1]
			case strings.HasPrefix(m[1], fenced):
				fenced = ""
			}
			continue
		}
		if fenced != "" {
			continue
		}
		// A code span keeps its backticks, emptied: what follows it still
		// reads as following a code span.
		text := codeSpanRE.ReplaceAllString(line, "``")
		for _, m := range issueRE.FindAllString(text, -1) {
			out = append(out, wordProblem{i + 1, "issue number " + strconv.Quote(m) + ": say what changed or what is asked"})
		}
		for _, loc := range numberedRE.FindAllStringIndex(text, -1) {
			if valueRE.MatchString(text[:loc[0]]) {
				continue
			}
			out = append(out, wordProblem{i + 1, "numbered configuration " + strconv.Quote(text[loc[0]:loc[1]]) + ": name the configuration"})
		}
	}
	return out
}

// TestForeignWords checks that user-facing Markdown speaks the user's
// language: no issue numbers and no numbered benchmark configurations.
func TestForeignWords(t *testing.T) {
	n := 0
	for _, rel := range markdownFiles(t) {
		if !userFacing(rel) {
			continue
		}
		n++
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range foreignWords(string(b)) {
			t.Errorf("%s:%d: %s", rel, p.line, p.what)
		}
	}
	if n == 0 {
		t.Fatal("no user-facing Markdown files")
	}
}

// TestForeignWordsFinds checks the check on text whose answer is known.
func TestForeignWordsFinds(t *testing.T) {
	tests := []struct {
		md   string
		want []int // lines with a problem, one entry per problem
	}{
		{"What changed for issue 11's targets", []int{1}},
		{"issues 10, 11 (in part) and Issue #13", []int{1, 1}},
		{"| (23) (1) no filter | 83.6 |", []int{1, 1}},
		{"so of (3) − (9) = +52.9 µs", []int{1, 1}},
		{"the plugin's issued counter", nil},
		{"counts as `default_cost` (2).", nil},
		{"`MaxAttempts` (32) per bucket", nil},
		{"a value (`x`) and (`y`)", nil},
		{"text\n```\nburst: must be >= tokens_per_second (10), got 5\n```\n(3) plugin", []int{5}},
		{"see the plugin (`(3)`)", nil},
		{"the main checkout (caa42cc) and 1,234 (12%)", nil},
	}
	for _, tt := range tests {
		var got []int
		for _, p := range foreignWords(tt.md) {
			got = append(got, p.line)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("foreignWords(%q): problems on lines %v, want %v", tt.md, got, tt.want)
		}
	}
}
