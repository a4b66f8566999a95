package rls

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ratelimitsrc"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// upstreamRefused are the configurations of envoyproxy/ratelimit's source
// that it refuses itself (its unit tests expect the error), with the reason
// limitd gives, which names the same fault. Every other file there is
// accepted and decided. docs/rate-limit-service.md lists the reasons.
var upstreamRefused = map[string]string{
	"test/config/bad_limit_unit.yaml":      "6: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'",
	"test/config/bad_yaml.yaml":            "2: error loading config file: found unexpected end of stream",
	"test/config/duplicate_key.yaml":       "6: descriptors[1]: duplicate descriptor composite key 'test-domain.key1_value1'",
	"test/config/empty_domain.yaml":        "1: domain: config file cannot have empty domain",
	"test/config/empty_key.yaml":           "3: descriptors[0].key: descriptor has empty key",
	"test/config/misspelled_key.yaml":      "5: descriptors[0].ratelimit: config error, unknown key 'ratelimit'",
	"test/config/misspelled_key2.yaml":     "7: descriptors[0].rate_limit.requestsperunit: config error, unknown key 'requestsperunit'",
	"test/config/non_map_list.yaml":        "3: descriptors[0]: config error, yaml file contains list of type other than map: \"a\"",
	"test/config/non_string_key.yaml":      "1: config error, key is not of type string: 0.25",
	"test/config/replaces_empty.yaml":      "10: descriptors[0].descriptors[0].rate_limit.replaces[0].name: should not have an empty replaces entry",
	"test/config/replaces_self.yaml":       "10: descriptors[0].descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor",
	"test/config/unlimited_with_unit.yaml": "6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
}

// upstreamPairs are files envoyproxy/ratelimit's tests load together.
var upstreamPairs = []struct {
	files []string
	want  string // "" accepted, else the refusal
}{
	// Its default (MERGE_DOMAIN_CONFIG off) refuses a domain in two files.
	{[]string{"test/config/basic_config.yaml", "test/config/duplicate_domain.yaml"}, "duplicate domain \"test-domain\""},
	// With MERGE_DOMAIN_CONFIG on it merges them; limitd has no such mode.
	{[]string{"test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"}, "duplicate domain \"test-domain\""},
}

// The example and test configurations shipped in envoyproxy/ratelimit's
// module source (read from the module cache, never copied here) are each
// accepted and decided, or refused with the reason listed above.
func TestUpstreamConfigs(t *testing.T) {
	dir := ratelimitsrc.Require(t)
	upstreamConfigs(t, dir)
}

// upstreamConfigs checks every configuration file of envoyproxy/ratelimit's
// source at dir.
func upstreamConfigs(t *testing.T, dir string) {
	files, err := ratelimitsrc.ConfigFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	read := func(rel string) rlsconfig.File {
		data, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		return rlsconfig.File{Name: rel, Data: data}
	}
	accepted := 0
	for _, rel := range files {
		t.Run(rel, func(t *testing.T) {
			c, err := rlsconfig.Parse([]rlsconfig.File{read(rel)})
			if want, refused := upstreamRefused[rel]; refused {
				if err == nil || !strings.Contains(err.Error(), rel+":"+want) {
					t.Fatalf("got %v, want a refusal %q", err, rel+":"+want)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			accepted++
			decideAll(t, c)
		})
	}
	if accepted < 10 {
		t.Errorf("only %d files accepted", accepted)
	}
	for i, p := range upstreamPairs {
		var fs []rlsconfig.File
		for _, rel := range p.files {
			fs = append(fs, read(rel))
		}
		_, err := rlsconfig.Parse(fs)
		if (err == nil) != (p.want == "") || (err != nil && !strings.Contains(err.Error(), p.want)) {
			t.Errorf("pair %d %v: got %v, want %q", i, p.files, err, p.want)
		}
	}
}

// decideAll serves c on a memory store and sends every configured limit a
// request that reaches it (a wildcard's value extended, a key without a
// value given one): each answer carries the limit Lookup finds, and a
// descriptor named by its exact configured values finds its own limit.
func decideAll(t *testing.T, c *rlsconfig.Config) {
	t.Helper()
	clk := newClock(epoch)
	m, err := NewMetrics(newRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		srv, err := NewServer(Options{Store: memory(clk), Algorithm: algo, Now: clk.Now, Logger: quiet, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		srv.SetConfig(c)
		for _, domain := range c.Domains() {
			for _, p := range c.Limits(domain) {
				d := &rlpb.RateLimitDescriptor{}
				exact := true
				var es []rlsconfig.Entry
				for _, e := range p.Entries {
					v := e.Value
					switch {
					case v == "":
						v, exact = "any", false
					case strings.HasSuffix(v, "*"):
						v, exact = strings.TrimSuffix(v, "*")+"x", false
					}
					d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: e.Key, Value: v})
					es = append(es, rlsconfig.Entry{Key: e.Key, Value: v})
				}
				want, _ := c.Lookup(domain, es)
				if exact && want.Limit.RequestsPerUnit != p.Limit.RequestsPerUnit {
					t.Errorf("%s: exact values found %v", p.Limit.Key, want.Limit)
				}
				r, err := srv.ShouldRateLimit(t.Context(), &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlpb.RateLimitDescriptor{d}})
				if err != nil {
					t.Fatalf("%s: %v", p.Limit.Key, err)
				}
				st := r.Statuses[0]
				switch {
				case want.Limit.Unlimited:
					if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
						t.Errorf("%s: unlimited answered %v", p.Limit.Key, st)
					}
				case st.CurrentLimit.GetRequestsPerUnit() != want.Limit.RequestsPerUnit || int32(st.CurrentLimit.GetUnit()) != int32(want.Limit.Unit):
					t.Errorf("%s: answered %v, want %d per %s", p.Limit.Key, st, want.Limit.RequestsPerUnit, want.Limit.Unit)
				case want.Limit.RequestsPerUnit == 0 && !want.Limit.ShadowMode && st.Code != over:
					t.Errorf("%s: a limit of 0 answered %v", p.Limit.Key, st)
				case want.Limit.RequestsPerUnit > 0 && st.Code != ok:
					t.Errorf("%s: a first hit answered %v", p.Limit.Key, st)
				}
				if !slices.Contains([]pb.RateLimitResponse_Code{ok, over}, r.OverallCode) {
					t.Errorf("%s: overall %v", p.Limit.Key, r.OverallCode)
				}
			}
		}
	}
}
