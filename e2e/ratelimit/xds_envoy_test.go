// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// envoyRoute is a golden case's route as Envoy's rate limit filter runs
// it: the filter's domain, the route's rate_limits, and request headers
// that make every action find its entry.
type envoyRoute struct {
	domain     string
	rateLimits string
	headers    map[string]string
}

// goldenEnvoyRoute is the first route of a case whose rate limits all use
// actions the harness's Envoy can run here (generic_key, request_headers,
// header_value_match on exact values of headers, not pseudo-headers,
// expected to match), in one domain;
// ok is false when the case has none.
func goldenEnvoyRoute(t *testing.T, dir, name string) (r envoyRoute, ok bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name+".routes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range documents(b) {
		var rt struct {
			RateLimitsByDomain map[string][]struct {
				Actions []map[string]map[string]map[string]any `json:"actions"`
			} `json:"rateLimitsByDomain"`
		}
		if err := yaml.Unmarshal(doc, &rt); err != nil {
			t.Fatal(err)
		}
		if len(rt.RateLimitsByDomain) != 1 {
			continue
		}
		for domain, rls := range rt.RateLimitsByDomain {
			r = envoyRoute{domain: domain, headers: map[string]string{}}
			var descs []envoy.Descriptor
			ok = true
			for _, rl := range rls {
				var d envoy.Descriptor
				for _, a := range rl.Actions {
					act, good := envoyAction(a["ActionSpecifier"], r.headers)
					ok = ok && good
					d.Actions = append(d.Actions, act)
				}
				descs = append(descs, d)
			}
			if ok {
				r.rateLimits = envoy.RateLimitsYAML(descs...)
				return r, true
			}
		}
	}
	return envoyRoute{}, false
}

// envoyAction is one golden action as Envoy's YAML, adding to headers what
// a request needs for it to find its entry.
func envoyAction(spec map[string]map[string]any, headers map[string]string) (envoy.Action, bool) {
	for kind, a := range spec {
		key, _ := a["descriptor_key"].(string)
		value, _ := a["descriptor_value"].(string)
		switch kind {
		case "GenericKey":
			return envoy.GenericKey(key, value), true
		case "RequestHeaders":
			h, _ := a["header_name"].(string)
			headers[h] = "user-1"
			return envoy.RequestHeaders(h, key), true
		case "HeaderValueMatch":
			expect, _ := a["expect_match"].(map[string]any)
			hs, _ := a["headers"].([]any)
			if expect["value"] != true || len(hs) == 0 {
				return "", false
			}
			var matchers []string
			for _, h := range hs {
				hm, _ := h.(map[string]any)
				name, _ := hm["name"].(string)
				exact, found := dig(hm, "HeaderMatchSpecifier", "StringMatch", "MatchPattern", "Exact")
				if !found || name == "" || strings.HasPrefix(name, ":") || hm["invert_match"] == true {
					return "", false
				}
				headers[name] = exact
				matchers = append(matchers, fmt.Sprintf("{name: %q, string_match: {exact: %q}}", name, exact))
			}
			return envoy.Action(fmt.Sprintf("{header_value_match: {descriptor_key: %q, descriptor_value: %q, expect_match: true, headers: [%s]}}",
				key, value, strings.Join(matchers, ", "))), true
		}
	}
	return "", false
}

// dig follows keys down nested maps to a string.
func dig(m map[string]any, keys ...string) (string, bool) {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		v = mm[k]
	}
	s, ok := v.(string)
	return s, ok
}

// TestEnvoyGatewayGoldenThroughEnvoy plays the golden cases whose route
// Envoy can run here (goldenEnvoyRoute) through Envoy 1.40's own rate limit
// filter, one Envoy in front of envoyproxy/ratelimit and one in front of
// limitd, both configured over ADS with the case's snapshot: the same
// requests, in lockstep within one second, get the same statuses and
// x-ratelimit-* headers from both.
func TestEnvoyGatewayGoldenThroughEnvoy(t *testing.T) {
	t.Parallel()
	cases := goldenCases(t)
	dir := filepath.Join(gatewayModule(t), "internal", "xds", "translator", "testdata", "out", "ratelimit-config")
	p := newXDSPKI(t)
	x := startXDSServer(t, "127.0.0.1:0", p.server, nil)
	x.set("0", cases[0].resources...)
	ref := startReferenceXDS(t, x.addr, p)
	lim := startLimitdWith(t, limitdBinary(t), limitdXDSArgs(x.addr, p, string(limitd)), nil, true).service
	var used, skipped []string
	for i, c := range cases {
		version := fmt.Sprintf("envoy-%d", i)
		x.set(version, c.resources...)
		x.waitACK(version, string(reference), string(limitd))
		if err := ref.rl.WaitLoads(i+2, len(ref.rl.ConfigErrors()), waitTimeout); err != nil {
			t.Fatal(err)
		}
		r, ok := goldenEnvoyRoute(t, dir, c.name)
		if !ok {
			skipped = append(skipped, c.name)
			continue
		}
		used = append(used, c.name)
		t.Run(c.name, func(t *testing.T) {
			rl := envoy.RateLimit{Domain: r.domain, RouteRateLimits: r.rateLimits}
			var sides []*side
			for _, s := range []*service{ref, lim} {
				e := startEnvoy(t, s, rl)
				cl := e.Client()
				t.Cleanup(cl.Close)
				sides = append(sides, &side{s: s, e: e, c: cl, label: string(s.kind)})
			}
			steps := []step{{note: c.name, headers: r.headers, want: make([]int, 7), second: true}}
			var got [][][]seen
			for attempt := 1; attempt <= 3; attempt++ {
				flush(t, ref, lim)
				var one bool
				if got, one = lockstep(sides, steps); one {
					break
				}
			}
			for k := range got[0][0] {
				a, b := got[0][0][k], got[1][0][k]
				if a.Status == 0 || b.Status == 0 {
					t.Errorf("request %d: no answer: envoyproxy/ratelimit %v, limitd %v", k, a, b)
				}
				if !sameAnswer(a, b) {
					t.Errorf("request %d: envoyproxy/ratelimit %v, limitd %v", k, a, b)
				}
			}
			t.Logf("domain %s, headers %v: %v", r.domain, r.headers, got[0][0])
		})
	}
	t.Logf("through Envoy: %d cases %v; by direct calls only (actions not run here): %v", len(used), used, skipped)
	if len(used) < 10 {
		t.Errorf("only %d cases through Envoy", len(used))
	}
}
