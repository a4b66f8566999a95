package rlsconfig

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ratelimitsrc"
)

// FuzzParse checks properties of every input, not only that Parse returns:
//
//   - a refusal is an *Error naming the file, and a field or the YAML's own
//     fault;
//   - an accepted configuration, written back as YAML (render), parses to
//     the same limits, flags and tree;
//   - each limit reached by explicit values is what Lookup finds for them.
func FuzzParse(f *testing.F) {
	for _, s := range []string{matchYAML, "domain: d\n", "", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, algorithm: fixed_window}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    value_to_metric: yes\n    descriptors:\n      - key: a\n        quota_mode: true\n        rate_limit: {unit: week, requests_per_unit: 0x20, burst: 40, name: n, replaces: [{name: m}]}\n"} {
		f.Add([]byte(s))
	}
	if dir, err := ratelimitsrc.Dir(ratelimitsrc.Version); err == nil {
		if files, err := ratelimitsrc.ConfigFiles(dir); err == nil {
			for _, rel := range files {
				if b, err := os.ReadFile(filepath.Join(dir, rel)); err == nil {
					f.Add(b)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse([]File{{Name: "f.yaml", Data: data}})
		if err != nil {
			var cerr *Error
			if !errors.As(err, &cerr) || cerr.File != "f.yaml" {
				t.Fatalf("%v: not an *Error naming the file", err)
			}
			if cerr.Field == "" && !strings.HasPrefix(cerr.Msg, "error loading config file") &&
				!strings.HasPrefix(cerr.Msg, "want a mapping") && !strings.HasPrefix(cerr.Msg, "config error, key is not of type string") &&
				!strings.HasPrefix(cerr.Msg, "larger than") {
				t.Fatalf("%v: names no field", err)
			}
			return
		}
		domain := c.Domains()[0]
		text := render(domain, c.domains[domain])
		c2, err := Parse([]File{{Name: "f.yaml", Data: []byte(text)}})
		if err != nil {
			t.Fatalf("the configuration written back is refused: %v\n%s", err, text)
		}
		if a, b := dump(c.domains[domain], ""), dump(c2.domains[domain], ""); a != b || c2.Domains()[0] != domain {
			t.Fatalf("round trip changed the configuration:\n%s\nbecame\n%s\nfrom\n%s", a, b, text)
		}
		for _, p := range c.Limits(domain) {
			explicit := true
			for _, e := range p.Entries {
				explicit = explicit && e.Value != "" && !strings.HasSuffix(e.Value, "*")
			}
			if !explicit {
				continue
			}
			m, known := c.Lookup(domain, p.Entries)
			if !known || m.Limit == nil || m.Limit.RequestsPerUnit != p.Limit.RequestsPerUnit || m.Limit.Unlimited != p.Limit.Unlimited {
				t.Fatalf("%s: Lookup found %+v", p.Limit.Key, m.Limit)
			}
		}
	})
}

// render writes a domain's tree as YAML, every string double-quoted.
func render(domain string, n *node) string {
	var b strings.Builder
	b.WriteString("domain: " + strconv.Quote(domain) + "\n")
	renderChildren(&b, n, "")
	return b.String()
}

func renderChildren(b *strings.Builder, n *node, ind string) {
	if len(n.children) == 0 {
		return
	}
	b.WriteString(ind + "descriptors:\n")
	for _, name := range n.order { // file order: the wildcards' order matters
		c := n.children[name]
		b.WriteString(ind + "  - key: " + strconv.Quote(c.key) + "\n")
		in := ind + "    "
		if _, v, ok := c.split(name); ok {
			b.WriteString(in + "value: " + strconv.Quote(v) + "\n")
		}
		if c.valueToMetric {
			b.WriteString(in + "value_to_metric: true\n")
		}
		if c.shareThreshold {
			b.WriteString(in + "share_threshold: true\n")
		}
		if l := c.limit; l != nil {
			b.WriteString(in + "shadow_mode: " + strconv.FormatBool(l.ShadowMode) + "\n")
			b.WriteString(in + "quota_mode: " + strconv.FormatBool(l.QuotaMode) + "\n")
			b.WriteString(in + "detailed_metric: " + strconv.FormatBool(l.DetailedMetric) + "\n")
			b.WriteString(in + "rate_limit:\n")
			if l.Unlimited {
				b.WriteString(in + "  unlimited: true\n")
			} else {
				b.WriteString(in + "  unit: " + l.Unit.String() + "\n")
			}
			b.WriteString(in + "  requests_per_unit: " + strconv.FormatUint(uint64(l.RequestsPerUnit), 10) + "\n")
			if l.Name != "" {
				b.WriteString(in + "  name: " + strconv.Quote(l.Name) + "\n")
			}
			if len(l.Replaces) > 0 {
				b.WriteString(in + "  replaces:\n")
				for _, r := range l.Replaces {
					b.WriteString(in + "    - name: " + strconv.Quote(r) + "\n")
				}
			}
			if l.Algorithm != Default {
				b.WriteString(in + "  algorithm: " + l.Algorithm.String() + "\n")
			}
			if l.Burst != 0 {
				b.WriteString(in + "  burst: " + strconv.FormatUint(uint64(l.Burst), 10) + "\n")
			}
		}
		renderChildren(b, c, in)
	}
}

// dump is a canonical text of a tree: names, flags, wildcards and limits.
func dump(n *node, ind string) string {
	var b strings.Builder
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	slices.Sort(names)
	b.WriteString(ind + "wildcards " + strings.Join(n.wildcards, "|") + "\n")
	for _, name := range names {
		c := n.children[name]
		b.WriteString(ind + strconv.Quote(name) + " key=" + strconv.Quote(c.key) + " v2m=" + strconv.FormatBool(c.valueToMetric) +
			" share=" + strconv.FormatBool(c.shareThreshold) + " pattern=" + c.wildcardPattern + "\n")
		if c.limit != nil {
			b.WriteString(ind + "  limit " + describe(c.limit) + "\n")
		}
		b.WriteString(dump(c, ind+"  "))
	}
	return b.String()
}
