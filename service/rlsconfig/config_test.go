package rlsconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func parseOne(t *testing.T, yaml string) (*Config, error) {
	t.Helper()
	return Parse([]File{{Name: "c.yaml", Data: []byte(yaml)}})
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := parseOne(t, yaml)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Every refusal names the file, the line and the field.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty file", "", "c.yaml: domain: config file cannot have empty domain"},
		{"empty domain", "descriptors:\n", "c.yaml:1: domain: config file cannot have empty domain"},
		{"not a mapping", "- a\n", "c.yaml:1: want a mapping, got a list"},
		{"syntax", "'''\ndomain: x\n", "c.yaml:3: error loading config file: found unexpected end of stream"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n", "c.yaml:4: descriptors[0].ratelimit: config error, unknown key 'ratelimit'"},
		{"unknown key nested", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n", "c.yaml:6: descriptors[0].rate_limit.requestsperunit: config error, unknown key 'requestsperunit'"},
		{"misplaced key", "domain: d\nunit: day\n", "c.yaml:2: unit: not a field here (fields here: domain, descriptors)"},
		{"non-string key", "0.25: d\n", "c.yaml:1: config error, key is not of type string: 0.25"},
		{"list of scalars", "domain: d\ndescriptors:\n  - a\n", "c.yaml:3: descriptors[0]: config error, yaml file contains list of type other than map: \"a\""},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "c.yaml:3: descriptors[0].key: descriptor has empty key"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", "c.yaml:5: descriptors[1]: duplicate descriptor composite key 'd.k_v'"},
		{"duplicate nested", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: k\n      - key: k\n", "c.yaml:6: descriptors[0].descriptors[1]: duplicate descriptor composite key 'd.a.k'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n", "c.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n", "c.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit ''"},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown}\n", "descriptors[0].rate_limit.unit: invalid rate limit unit 'unknown'"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n", "c.yaml:6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      unit: second\n      replaces:\n        - name:\n", "c.yaml:8: descriptors[0].rate_limit.replaces[0].name: should not have an empty replaces entry"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      unit: second\n      replaces:\n        - name: self\n", "c.yaml:8: descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor"},
		{"share threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "c.yaml:5: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (ending with '*'), but found key 'k_v'"},
		{"float", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1.5}\n", "c.yaml:4: descriptors[0].rate_limit.requests_per_unit: error checking config: a float (1.5) is not a value of the configuration"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n", "c.yaml:4: descriptors[0].rate_limit.requests_per_unit: want an integer from 0 to 4294967295, got -1"},
		{"too large", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4294967296}\n", "descriptors[0].rate_limit.requests_per_unit: want an integer from 0 to 4294967295, got 4294967296"},
		{"quoted number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: \"5\"}\n", "descriptors[0].rate_limit.requests_per_unit: want an integer from 0 to 4294967295, got \"5\""},
		{"bad bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", "c.yaml:4: descriptors[0].shadow_mode: want true or false, got \"maybe\""},
		{"defined twice", "domain: d\ndomain: e\n", "c.yaml:2: domain: defined twice"},
		{"merge key", "base: &b {key: k}\n", "c.yaml:1: base: config error, unknown key 'base'"},
		{"merge key used", "domain: d\ndescriptors:\n  - <<: {key: k}\n", "c.yaml:3: descriptors[0].<<: merge keys (<<) are not supported"},
		{"descriptors not a list", "domain: d\ndescriptors: {key: k}\n", "c.yaml:2: descriptors: want a list, got a mapping"},
		{"rate_limit not a mapping", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5\n", "c.yaml:4: descriptors[0].rate_limit: want a mapping, got \"5\""},
		{"key a list", "domain: d\ndescriptors:\n  - key: [a]\n", "c.yaml:3: descriptors[0].key: want a string, got a list"},
		// The extensions.
		{"algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: leaky}\n", "c.yaml:4: descriptors[0].rate_limit.algorithm: want token_bucket or fixed_window, got \"leaky\""},
		{"burst of a window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window, burst: 10}\n", "descriptors[0].rate_limit.burst: a fixed window has no burst apart from requests_per_unit"},
		{"burst 0", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, burst: 0}\n", "descriptors[0].rate_limit.burst: must be at least 1"},
		{"burst below the rate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 10}\n", "descriptors[0].rate_limit.burst: must be >= requests_per_unit per second (100), got 10"},
		{"burst of unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, burst: 10}\n", "descriptors[0].rate_limit.burst: an unlimited descriptor has no burst"},
		{"burst of zero", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, burst: 10}\n", "descriptors[0].rate_limit.burst: requests_per_unit 0 refuses every hit"},
		{"too deep", "domain: d\ndescriptors:\n" + deep(MaxDepth+1), "descriptors nest more than 32 levels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseOne(t, tc.yaml)
			if err == nil {
				t.Fatalf("accepted; want %q", tc.want)
			}
			var cerr *Error
			if !errors.As(err, &cerr) || cerr.File != "c.yaml" {
				t.Errorf("%v: not an *Error naming the file", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got  %q\nwant %q", err, tc.want)
			}
		})
	}
}

// The bound on nodes counts an alias each time it is used: a file of a
// few lines cannot expand to billions of descriptors.
func TestAliasBomb(t *testing.T) {
	_, err := parse([]File{{Name: "c.yaml", Data: []byte(bomb())}}, 10000)
	if err == nil || !strings.Contains(err.Error(), "more than 10000 YAML nodes (aliases counted each time they are used)") {
		t.Fatalf("got %v", err)
	}
}

// deep is n levels of nested descriptors.
func deep(n int) string {
	var b strings.Builder
	for i := range n {
		ind := strings.Repeat("    ", i)
		b.WriteString(ind + "  - key: k\n" + ind + "    descriptors:\n")
	}
	return b.String()
}

// bomb is a file whose aliases expand to 10^8 descriptors: level i is ten
// descriptors, each holding level i-1 through an alias.
func bomb() string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0\n      - key: leaf\n")
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n", i, i)
		for j := range 10 {
			fmt.Fprintf(&b, "      - key: c%d\n        descriptors: *l%d\n", j, i-1)
		}
	}
	return b.String()
}

// What envoyproxy/ratelimit's YAML 1.1 decoder accepts is accepted: yes/no
// booleans, hex and octal integers, numbers and booleans as strings, units
// in any case, anchors and aliases, null fields.
func TestYAMLForms(t *testing.T) {
	c := mustParse(t, `
domain: d
descriptors:
  - key: k
    value: 123
    shadow_mode: yes
    rate_limit: &lim
      unit: MINUTE
      requests_per_unit: 0x10
  - key: k
    value: true
    detailed_metric: On
    rate_limit: *lim
  - key: k
    value: v
    rate_limit:
      unit: Hour
      requests_per_unit: 1_000
      name:
      replaces:
  - key: nothing
    rate_limit:
  - key: free
    rate_limit:
      unlimited: y
`)
	got := c.Limits("d")
	want := []string{
		"d.free unlimited",
		"d.k_123 16/minute shadow",
		"d.k_true 16/minute detailed",
		"d.k_v 1000/hour",
	}
	var have []string
	for _, p := range got {
		have = append(have, describe(p.Limit))
	}
	if !slices.Equal(have, want) {
		t.Errorf("limits:\n%s\nwant:\n%s", strings.Join(have, "\n"), strings.Join(want, "\n"))
	}
	if _, err := parseOne(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 0o17}\n"); err != nil {
		t.Errorf("octal: %v", err)
	}
}

func describe(l *RateLimit) string {
	s := l.Key
	if l.Unlimited {
		s += " unlimited"
	} else {
		s += " " + itoa(l.RequestsPerUnit) + "/" + l.Unit.String()
	}
	if l.ShadowMode {
		s += " shadow"
	}
	if l.QuotaMode {
		s += " quota"
	}
	if l.DetailedMetric {
		s += " detailed"
	}
	if l.Algorithm != Default {
		s += " " + l.Algorithm.String()
	}
	if l.Burst != 0 {
		s += " burst=" + itoa(l.Burst)
	}
	if l.Name != "" {
		s += " name=" + l.Name
	}
	if len(l.Replaces) > 0 {
		s += " replaces=" + strings.Join(l.Replaces, ",")
	}
	return s
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b [10]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// Load reads a file, or a folder's .yaml and .yml files in name order; a
// domain in two files is refused naming both.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write("c.txt", "not: read\n")
	write(".hidden.yaml", "not: read\n")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	c, files, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"a", "b"}) || len(files) != 2 {
		t.Errorf("domains %v, files %d", got, len(files))
	}
	if c, _, err := Load(filepath.Join(dir, "a.yaml")); err != nil || !slices.Equal(c.Domains(), []string{"a"}) {
		t.Errorf("one file: %v", err)
	}
	write("c.yaml", "domain: a\n")
	_, _, err = Load(dir)
	want := filepath.Join(dir, "c.yaml") + ":1: domain: duplicate domain \"a\" (also in " + filepath.Join(dir, "a.yaml") + ")"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
	write("c.yaml", strings.Repeat("#", MaxFileBytes+1))
	if _, _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a file over the bound: %v", err)
	}
	if _, _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing path was accepted")
	}
}

// A file in the folder that is not a regular file (a FIFO named *.yaml, a
// device) is skipped and named, never read: opening a FIFO for reading
// would wait for a writer forever. A path that is itself one is refused.
func TestReadFilesSkipsSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "b.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	type result struct {
		files   []File
		skipped []string
		err     error
	}
	done := make(chan result, 2)
	go func() {
		files, skipped, err := ReadFiles(dir)
		done <- result{files, skipped, err}
	}()
	go func() {
		files, skipped, err := ReadFiles(fifo)
		done <- result{files, skipped, err}
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for range 2 {
		select {
		case r := <-done:
			switch {
			case r.err == nil && (len(r.files) != 1 || !slices.Equal(r.skipped, []string{fifo})):
				t.Errorf("the folder: files %d, skipped %v; want a.yaml read, b.yaml skipped", len(r.files), r.skipped)
			case r.err != nil && !strings.Contains(r.err.Error(), "not a regular file"):
				t.Errorf("the FIFO itself: %v", r.err)
			}
		case <-timeout.C:
			// Free the blocked reader, so the test ends.
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			t.Fatal("ReadFiles blocked on a FIFO")
		}
	}
}

// Count counts every level of every domain's descriptors, and those with a
// limit.
func TestCount(t *testing.T) {
	c, err := Parse([]File{
		{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: n\n        value: v\n")},
		{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if d, l := c.Count(); d != 3 || l != 2 {
		t.Errorf("Count() = %d, %d; want 3, 2", d, l)
	}
}
