package rlsconfig

import (
	"slices"
	"strings"
	"testing"
)

const matchYAML = `
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: wild
    value: f*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: wild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: wild
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: mid
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: nested
    value: v
    rate_limit: {unit: minute, requests_per_unit: 6}
    descriptors:
      - key: inner
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 7}
      - key: deep
        descriptors:
          - key: leaf
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 8}
  - key: metric
    value_to_metric: true
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 9}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: svc
    value: svc/*
    share_threshold: true
    descriptors:
      - key: ep
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 11}
`

// Lookup finds limits as envoyproxy/ratelimit does, and names their
// statistics and counters as it does.
func TestLookup(t *testing.T) {
	c := mustParse(t, matchYAML)
	for _, tc := range []struct {
		entries []string // key, value, ...
		rpu     uint32   // 0: no limit
		key     string   // statistics key
		values  []string // nil: the request's
	}{
		{[]string{"wild", "foo"}, 3, "d.wild_foo", nil},   // exact first
		{[]string{"wild", "foo1"}, 1, "d.wild_foo*", nil}, // then wildcards in file order
		{[]string{"wild", "fa"}, 2, "d.wild_f*", nil},     // the next wildcard
		{[]string{"wild", "x"}, 4, "d.wild", nil},         // then the key alone
		{[]string{"wild", ""}, 4, "d.wild", nil},          // an empty value too
		{[]string{"mid", "barb"}, 0, "", nil},             // "*" inside a value is no wildcard
		{[]string{"mid", "bar*b"}, 5, "d.mid_bar*b", nil}, // but matches itself
		{[]string{"nested", "v"}, 6, "d.nested_v", nil},   // a limit with children
		{[]string{"nested", "v", "inner", "goodness"}, 7, "d.nested_v.inner_goo*", nil},
		{[]string{"nested", "v", "inner", "bad"}, 0, "", nil},
		{[]string{"nested", "v", "deep", "x"}, 0, "", nil}, // deep has no limit itself
		{[]string{"nested", "v", "deep", "x", "leaf", "y"}, 8, "d.nested_v.deep_x.leaf_y", nil},
		{[]string{"nested", "v", "deep", "x", "leaf", "y", "more", "z"}, 0, "", nil},
		{[]string{"nested", "w"}, 0, "", nil},
		{[]string{"metric", "m1", "path", "/a"}, 9, "d.metric_m1.path", nil},
		{[]string{"files", "files/a.txt"}, 10, "d.files_files/*", []string{"files/*"}},
		{[]string{"svc", "svc/x", "ep", "e1"}, 11, "d.svc_svc/*.ep_e1", []string{"svc/*", "e1"}},
		{[]string{"unknown", "x"}, 0, "", nil},
	} {
		var es []Entry
		for i := 0; i < len(tc.entries); i += 2 {
			es = append(es, Entry{Key: tc.entries[i], Value: tc.entries[i+1]})
		}
		m, known := c.Lookup("d", es)
		if !known {
			t.Fatal("domain d unknown")
		}
		name := strings.Join(tc.entries, "/")
		if tc.rpu == 0 {
			if m.Limit != nil {
				t.Errorf("%s: matched %v", name, m.Limit)
			}
			continue
		}
		if m.Limit == nil || m.Limit.RequestsPerUnit != tc.rpu || m.Limit.Key != tc.key {
			t.Errorf("%s: got %+v, want %d named %s", name, m.Limit, tc.rpu, tc.key)
			continue
		}
		want := tc.values
		if want == nil {
			for _, e := range es {
				want = append(want, e.Value)
			}
		}
		if !slices.Equal(m.Values, want) {
			t.Errorf("%s: values %q, want %q", name, m.Values, want)
		}
	}
	if _, known := c.Lookup("other", []Entry{{Key: "wild", Value: "foo"}}); known {
		t.Error("domain other is known")
	}
	// The configuration's own limit is never changed by a lookup.
	m, _ := c.Lookup("d", []Entry{{Key: "nested", Value: "v"}, {Key: "deep", Value: "x"}, {Key: "leaf", Value: "y"}})
	m.Limit.Key = "changed"
	if m2, _ := c.Lookup("d", []Entry{{Key: "nested", Value: "v"}, {Key: "deep", Value: "x"}, {Key: "leaf", Value: "z"}}); m2.Limit.Key != "d.nested_v.deep_x.leaf_z" {
		t.Errorf("a lookup changed the configuration: %s", m2.Limit.Key)
	}
	if got := OverrideKey("d", []Entry{{Key: "a", Value: "1"}, {Key: "b"}}); got != "d.a_1.b" {
		t.Errorf("OverrideKey: %s", got)
	}
}

// Limits lists every configured limit with the entries that reach it.
func TestLimits(t *testing.T) {
	c := mustParse(t, matchYAML)
	var got []string
	for _, p := range c.Limits("d") {
		var kv []string
		for _, e := range p.Entries {
			kv = append(kv, e.Key+"="+e.Value)
		}
		got = append(got, p.Limit.Key+" "+strings.Join(kv, ","))
	}
	want := []string{
		"d.files_files/* files=files/*",
		"d.metric.path metric=,path=",
		"d.mid_bar*b mid=bar*b",
		"d.nested_v nested=v",
		"d.nested_v.deep.leaf nested=v,deep=,leaf=",
		"d.nested_v.inner_goo* nested=v,inner=goo*",
		"d.svc_svc/*.ep svc=svc/*,ep=",
		"d.wild wild=",
		"d.wild_f* wild=f*",
		"d.wild_foo wild=foo",
		"d.wild_foo* wild=foo*",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
