// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's top directory, from this package's.
const root = "../../.."

// markdownFiles returns the Markdown files git tracks or would track (new,
// not ignored), relative to root with forward slashes.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md").Output()
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("not a git checkout (%v); CI=true makes this a failure", err)
	}
	var files []string
	for _, f := range strings.Fields(string(out)) {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatal("no Markdown files")
	}
	return files
}

var (
	// inlineLinkRE finds [text](target) and ![alt](target); the target
	// ends at the first space (a title may follow) or ")".
	inlineLinkRE = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefRE finds reference definitions: [label]: target
	refDefRE   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	headingRE  = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	fenceRE    = regexp.MustCompile("^ {0,3}(```+|~~~+)")
)

// link is one relative link of a Markdown file.
type link struct {
	file   string // the file it is in, relative to root
	line   int
	target string // as written
}

// parsed is what the link check needs of one Markdown file.
type parsed struct {
	links   []link
	anchors map[string]bool
}

// parseMarkdown reads the links and the anchors of the file at rel: links
// outside fenced code blocks and code spans; anchors from headings (with
// GitHub's -1, -2 suffixes for repeats) and from <a name|id="...">.
func parseMarkdown(t *testing.T, rel string) parsed {
	t.Helper()
	f, err := os.Open(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := parsed{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[1][:3]
			case strings.HasPrefix(m[1], fence):
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			slug := githubSlug(m[2])
			if k := seen[slug]; k > 0 {
				p.anchors[slug+"-"+strconv.Itoa(k)] = true
			} else {
				p.anchors[slug] = true
			}
			seen[slug]++
		}
		text := codeSpanRE.ReplaceAllString(line, "")
		if m := refDefRE.FindStringSubmatch(text); m != nil {
			p.links = append(p.links, link{rel, n, m[1]})
			continue
		}
		for _, m := range inlineLinkRE.FindAllStringSubmatch(text, -1) {
			p.links = append(p.links, link{rel, n, m[1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	htmlTagRE = regexp.MustCompile(`<[^>]+>`)
	mdLinkRE  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// githubSlug is the anchor GitHub gives a heading: the rendered text (links
// by their text, no tags), lowercased, every character that is not a
// letter, a digit, a space, '-' or '_' removed (so '*' emphasis and code
// backquotes go), and spaces turned into '-'. Underscores stay, which is
// right for names like max_keys; a heading emphasised with _..._ would
// keep them where GitHub drops them: use *...*.
func githubSlug(heading string) string {
	s := mdLinkRE.ReplaceAllString(heading, "$1")
	s = htmlTagRE.ReplaceAllString(s, "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestGithubSlug(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Quick start", "quick-start"},
		{"Using the plugin in your own Envoy", "using-the-plugin-in-your-own-envoy"},
		{"Costs known from the response: LLM token budgets, counting only some outcomes", "costs-known-from-the-response-llm-token-budgets-counting-only-some-outcomes"},
		{"Memory (`max_keys`)", "memory-max_keys"},
		{"Envoy version floor: what was measured", "envoy-version-floor-what-was-measured"},
		{"`failure_mode` and *outages*", "failure_mode-and-outages"},
		{"A [link](x.md) in a heading", "a-link-in-a-heading"},
		{"Größe & Ordnung", "größe--ordnung"},
	} {
		if got := githubSlug(tc.in); got != tc.want {
			t.Errorf("githubSlug(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestMarkdownLinks checks every relative link of every Markdown file of
// the repository: its file or directory exists, and its #anchor, if any, is
// a heading or explicit anchor of that Markdown file. Links with a scheme
// (https:, mailto:) are not followed; a path starting with / is read from
// the repository's top, as GitHub does.
func TestMarkdownLinks(t *testing.T) {
	files := markdownFiles(t)
	docs := map[string]parsed{}
	get := func(rel string) parsed {
		p, ok := docs[rel]
		if !ok {
			p = parseMarkdown(t, rel)
			docs[rel] = p
		}
		return p
	}
	checked := 0
	for _, file := range files {
		for _, l := range get(file).links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			target, anchor, _ := strings.Cut(l.target, "#")
			rel := file
			if target != "" {
				// GitHub resolves /x from the repository's top.
				rel = path.Clean(path.Join(path.Dir(file), target))
				if strings.HasPrefix(target, "/") {
					rel = path.Clean(strings.TrimPrefix(target, "/"))
				}
				if rel == ".." || strings.HasPrefix(rel, "../") {
					t.Errorf("%s:%d: %s: outside the repository", l.file, l.line, l.target)
					continue
				}
				st, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
				if err != nil {
					t.Errorf("%s:%d: %s: no such file or directory", l.file, l.line, l.target)
					continue
				}
				if st.IsDir() {
					if anchor != "" {
						t.Errorf("%s:%d: %s: an anchor on a directory", l.file, l.line, l.target)
					}
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(rel, ".md") {
				t.Errorf("%s:%d: %s: an anchor into a file that is not Markdown", l.file, l.line, l.target)
				continue
			}
			if !get(rel).anchors[anchor] {
				t.Errorf("%s:%d: %s: %s has no heading or anchor %q", l.file, l.line, l.target, rel, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the parser is broken")
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(files))
}
