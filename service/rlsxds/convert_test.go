package rlsxds

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

func anys(t *testing.T, rs ...*rlsconf.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(rs))
	for i, r := range rs {
		a, err := anypb.New(r)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// Every field of the resource reaches the configuration as the same YAML
// would: nested descriptors, values, every unit, unlimited, name,
// replaces, shadow_mode, detailed_metric.
func TestConvertEveryField(t *testing.T) {
	res := &rlsconf.RateLimitConfig{Name: "ns/policy", Domain: "gw", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "route", Value: "r1", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 7, Name: "per-user"},
				ShadowMode: true, DetailedMetric: true},
			{Key: "vip", Value: "yes", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_YEAR, RequestsPerUnit: 1000,
				Replaces: []*rlsconf.RateLimitReplace{{Name: "per-user"}}}},
		}},
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "m", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MONTH, RequestsPerUnit: 3}},
		{Key: "s", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 0}},
	}}
	got, files, err := Convert(anys(t, res))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0].Name != "xds:ns/policy" {
		t.Fatalf("files %v", files)
	}
	want, err := rlsconfig.Parse([]rlsconfig.File{{Name: "want.yaml", Data: []byte(`
domain: gw
descriptors:
  - key: route
    value: r1
    descriptors:
      - key: user
        rate_limit: {unit: week, requests_per_unit: 7, name: per-user}
        shadow_mode: true
        detailed_metric: true
      - key: vip
        value: "yes"
        rate_limit: {unit: year, requests_per_unit: 1000, replaces: [{name: per-user}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: m
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: s
    rate_limit: {unit: second, requests_per_unit: 0}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	g, w := got.Limits("gw"), want.Limits("gw")
	if len(g) != 5 || !reflect.DeepEqual(g, w) {
		t.Errorf("from xds:\n%s\nfrom YAML:\n%s", dump(g), dump(w))
	}
	for _, l := range g {
		if l.Limit.Name == "per-user" && (!l.Limit.ShadowMode || !l.Limit.DetailedMetric || l.Limit.Unit != rlsconfig.Week) {
			t.Errorf("user: %+v", l.Limit)
		}
	}
}

func dump(ps []rlsconfig.Path) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%v %+v\n", p.Entries, *p.Limit)
	}
	return b.String()
}

// A resource that does not validate is refused as a file would be,
// named xds:<name>; two resources of one domain are two files of one.
func TestConvertRefused(t *testing.T) {
	deep := &rlsconf.RateLimitDescriptor{Key: "k"}
	for range rlsconfig.MaxDepth + 1 {
		deep = &rlsconf.RateLimitDescriptor{Key: "k", Descriptors: []*rlsconf.RateLimitDescriptor{deep}}
	}
	other, _ := anypb.New(&rlsconf.RateLimitReplace{Name: "x"})
	for _, c := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"no unit", anys(t, domain("a", "d", limit("k", "", 1, rlsconf.RateLimitUnit_UNKNOWN))),
			"rlsconfig: xds:a:"},
		{"unlimited with a unit", anys(t, domain("a", "d", &rlsconf.RateLimitDescriptor{Key: "k",
			RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_HOUR}})),
			"should not specify rate limit unit when unlimited"},
		{"empty domain", anys(t, domain("a", "")), "xds:a:1: domain: config file cannot have empty domain"},
		{"same domain twice", anys(t, domain("a", "d"), domain("b", "d")), `xds:b:1: domain: duplicate domain "d" (also in xds:a)`},
		{"duplicate descriptor", anys(t, domain("a", "d", limit("k", "v", 1, rlsconf.RateLimitUnit_SECOND), limit("k", "v", 2, rlsconf.RateLimitUnit_SECOND))),
			"xds:a"},
		{"too deep", anys(t, &rlsconf.RateLimitConfig{Name: "a", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{deep}}),
			"nest more than"},
		{"another type", []*anypb.Any{other}, "resources[0].type_url"},
		{"not a message", []*anypb.Any{{TypeUrl: TypeURL, Value: []byte{0xff, 0xff}}}, "resources[0]"},
	} {
		_, _, err := Convert(c.res)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// A resource that writes past rlsconfig.MaxFileBytes is refused as a file
// that large is, as soon as the writing passes the bound.
func TestRenderBound(t *testing.T) {
	c := &rlsconf.RateLimitConfig{Name: "big", Domain: "d"}
	for i := range 200_000 {
		c.Descriptors = append(c.Descriptors, limit("k", fmt.Sprint("value-", i), 1, rlsconf.RateLimitUnit_SECOND))
	}
	_, err := Render(c)
	if err == nil || err.Error() != fmt.Sprintf("rlsconfig: xds:big: larger than %d bytes", rlsconfig.MaxFileBytes) {
		t.Fatalf("%v", err)
	}
}

// FuzzRender: whatever a resource's strings hold, the YAML written reads
// back as the same domain, key, value and limit name.
func FuzzRender(f *testing.F) {
	for _, s := range [][4]string{
		{"d", "k", "v", "n"}, {"a: b", "- x", "#c", "&a"}, {"\"q\"", "k\nl", "v\\", "*"}, {"é", "\t", "v*", "'"},
		{"yes", "null", "~", "0x10"}, {"{a}", "[b]", "!tag", "%x"}, {"\u2028", "\x00", "\ufeff", "\\u0041"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, d, k, v, n string) {
		c := &rlsconf.RateLimitConfig{Name: "f", Domain: d, Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: k, Value: v, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 3, Name: n}}}}
		if _, err := anypb.New(c); err != nil {
			t.Skip("not a valid message (strings must be UTF-8)")
		}
		file, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := rlsconfig.Parse([]rlsconfig.File{file})
		if d == "" || k == "" {
			if err == nil {
				t.Fatalf("an empty domain or key accepted:\n%s", file.Data)
			}
			return
		}
		if err != nil {
			t.Fatalf("%v\n%s", err, file.Data)
		}
		ls := cfg.Limits(d)
		if len(ls) != 1 || ls[0].Limit.Name != n || ls[0].Limit.RequestsPerUnit != 3 || ls[0].Limit.Unit != rlsconfig.Day ||
			!reflect.DeepEqual(ls[0].Entries, []rlsconfig.Entry{{Key: k, Value: v}}) {
			t.Fatalf("read back %s\n%s", dump(ls), file.Data)
		}
	})
}
