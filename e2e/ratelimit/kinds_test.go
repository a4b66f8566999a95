// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// kindsYAML has one descriptor of each kind the configuration knows, each
// reached through its own request headers. Limits are per hour, so a
// script of a few seconds sees one window.
const kindsYAML = `domain: kinds
descriptors:
  # shadow_mode: over the limit is reported, never refused
  - key: shadow
    rate_limit: {unit: hour, requests_per_unit: 2}
    shadow_mode: true
  # unlimited: never counted
  - key: free
    rate_limit: {unlimited: true}
  # nested: a tenant's limit, and each of its users' under it
  - key: tenant
    value: acme
    rate_limit: {unit: hour, requests_per_unit: 5}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2}
  # wildcard: each value under /api/ has its own limit
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  # replaces: a member's limit, replaced by a larger one for VIPs
  - key: member
    rate_limit: {name: per_member, unit: hour, requests_per_unit: 2}
  - key: vip
    value: "yes"
    descriptors:
      - key: member
        rate_limit:
          unit: hour
          requests_per_unit: 4
          replaces: [{name: per_member}]
`

// kindsRateLimits are the route's rate_limits for kindsYAML: one
// descriptor per header (a missing header sends none), two for a tenant's
// user (the tenant's and the user's), two for a VIP member.
var kindsRateLimits = envoy.RateLimitsYAML(
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-shadow", "shadow")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-free", "free")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-tenant", "tenant")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-tenant", "tenant"), envoy.RequestHeaders("x-user", "user")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-path", "path")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-member", "member")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-vip", "vip"), envoy.RequestHeaders("x-member", "member")}},
)

var kindsScript = []step{
	{note: "shadow: over its limit, never refused", headers: map[string]string{"x-shadow": "s"}, want: []int{200, 200, 200, 200}},
	{note: "unlimited", headers: map[string]string{"x-free": "f"}, want: []int{200, 200, 200, 200, 200, 200, 200, 200}},
	{note: "nested: u1's limit of 2 under the tenant's 5", headers: map[string]string{"x-tenant": "acme", "x-user": "u1"}, want: []int{200, 200, 429}},
	{note: "nested: u2's", headers: map[string]string{"x-tenant": "acme", "x-user": "u2"}, want: []int{200, 200, 429}},
	// Fixed windows counted the two refused requests on the tenant too (6
	// of 5); limitd's token buckets did not (4 of 5), so one more passes.
	{note: "nested: the tenant alone", headers: map[string]string{"x-tenant": "acme"}, want: []int{429, 429}, atomic: []int{200, 429}},
	{note: "nested: another tenant has no limit", headers: map[string]string{"x-tenant": "other", "x-user": "u1"}, want: []int{200, 200, 200}},
	{note: "wildcard: /api/a", headers: map[string]string{"x-path": "/api/a"}, want: []int{200, 200, 429}},
	{note: "wildcard: /api/b, a limit of its own", headers: map[string]string{"x-path": "/api/b"}, want: []int{200, 200, 429}},
	{note: "wildcard: no match", headers: map[string]string{"x-path": "/web/a"}, want: []int{200, 200, 200}},
	{note: "replaces: m1's own limit", headers: map[string]string{"x-member": "m1"}, want: []int{200, 200, 429}},
	{note: "replaces: m2 as a VIP, the larger limit", headers: map[string]string{"x-member": "m2", "x-vip": "yes"}, want: []int{200, 200, 200, 200, 429}},
	{note: "replaces: m2's own limit untouched by the VIP requests", headers: map[string]string{"x-member": "m2"}, want: []int{200, 200, 429}},
}

// TestDescriptorKinds plays kindsScript through Envoy's own filter on each
// flavour: shadow, unlimited, nested, wildcard and replaces descriptors.
// envoyproxy/ratelimit and limitd differ at one step, written down in the
// script: a request one descriptor refuses takes nothing from the others
// on limitd.
func TestDescriptorKinds(t *testing.T) {
	t.Parallel()
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"kinds.yaml": kindsYAML}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits})
			var got [][]seen
			inOneWindow(t, []*redistest.Server{s.redis}, func() { got = runScript(e, kindsScript) })
			checkStatuses(t, f, kindsScript, got)
			// Unlimited: no limit to report, so Envoy writes no headers.
			for _, g := range got[1] {
				if g.Limit != "" || g.Remaining != "" {
					t.Errorf("unlimited: %v, want no x-ratelimit-* headers", g)
				}
			}
			// A VIP member's answer is the replacing limit's.
			for i, g := range got[10][:4] {
				if g.Limit != "4, 4;w=3600" || g.Remaining != []string{"3", "2", "1", "0"}[i] {
					t.Errorf("VIP request %d: %v, want limit \"4, 4;w=3600\" remaining %d", i, g, 3-i)
				}
			}
			if f.kind == limitd {
				m := s.metrics(t)
				for _, want := range []string{
					`limitd_rls_shadow_mode_total{descriptor="shadow",domain="kinds"} 2`,
					`limitd_rls_total_hits_total{descriptor="shadow",domain="kinds"} 4`,
					`limitd_rls_over_limit_total{descriptor="path_/api/*",domain="kinds"} 2`,
					`limitd_rls_total_hits_total{descriptor="vip_yes.member",domain="kinds"} 5`,
				} {
					if !containsLine(m, want) {
						t.Errorf("/metrics: no line %q in\n%s", want, logtext.Grep(m, "limitd_rls_"))
					}
				}
			}
		})
	}
}
