// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const hitsYAML = `domain: hits
descriptors:
  - key: weighted
    value: "yes"
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// TestHitsAddendFromHeader takes each request's hits from its x-hits
// header through Envoy's own hits_addend (a substitution format on the
// filter's rate_limits, sent as the descriptor's hits_addend): 3 and 4 of
// 10 leave 3, 0 checks without taking, 3 more leave 0, and 1 more is
// refused. x-ratelimit-remaining follows every step.
func TestHitsAddendFromHeader(t *testing.T) {
	t.Parallel()
	steps := []struct {
		hits          string
		status        int
		remaining     string
		noDescriptors bool
	}{
		{hits: "3", status: 200, remaining: "7"},
		{hits: "4", status: 200, remaining: "3"},
		{hits: "0", status: 200, remaining: "3"},
		{hits: "3", status: 200, remaining: "0"},
		{hits: "0", status: 200, remaining: "0"},
		{hits: "1", status: 429, remaining: "0"},
		// Not a number Envoy accepts: it sends no descriptor at all.
		{hits: "many", status: 200, noDescriptors: true},
	}
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"hits.yaml": hitsYAML}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "hits", FailureModeDeny: true,
				FilterRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{
					Actions: []envoy.Action{envoy.GenericKey("weighted", "yes")}, HitsAddend: "%REQ(x-hits)%"})})
			var got []seen
			inOneWindow(t, []*redistest.Server{s.redis}, func() {
				c := e.Client()
				defer c.Close()
				got = got[:0]
				for _, st := range steps {
					got = append(got, seenOf(c.Get("/", map[string]string{"x-hits": st.hits})))
				}
			})
			for i, st := range steps {
				g := got[i]
				switch {
				case st.noDescriptors:
					if g.Status != st.status || g.Limit != "" {
						t.Errorf("step %d: x-hits %s: %v, want %d and no x-ratelimit-* headers", i, st.hits, g, st.status)
					}
				case g.Status != st.status || g.Remaining != st.remaining || g.Limit != "10, 10;w=3600":
					t.Errorf("step %d: x-hits %s: %v, want %d remaining %s of \"10, 10;w=3600\"", i, st.hits, g, st.status, st.remaining)
				}
			}
		})
	}
}
