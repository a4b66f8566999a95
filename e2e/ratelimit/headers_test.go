// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"strconv"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// rlHeader is what one request got: its status and the three headers the
// service added (response_headers_to_add, copied by Envoy's filter).
type rlHeader struct {
	status                  int
	limit, remaining, reset string
}

// TestDifferentialResponseHeaders plays kindsScript through Envoy 1.40's
// ratelimit filter on envoyproxy/ratelimit with
// LIMIT_RESPONSE_HEADERS_ENABLED=true (header names of its own) and on
// limitd with fixed windows, --rls-response-headers and the same names:
// every request gets the same status and the same three headers on both
// (the reset within a second: the sides are asked a moment apart). limitd
// with token buckets and the same flags beside them writes the headers on
// the same requests, with a remaining count within the limit and a reset
// within the hour (its own buckets' values, and maybe another descriptor's:
// a refused request takes nothing from the others, so the closest limit
// can differ).
func TestDifferentialResponseHeaders(t *testing.T) {
	t.Parallel()
	ref := flavour{name: "envoyproxy-ratelimit", kind: reference, window: true, args: []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true",
		"LIMIT_LIMIT_HEADER=Q-Limit", "LIMIT_REMAINING_HEADER=Q-Remaining", "LIMIT_RESET_HEADER=Q-Reset"}}
	lim := flavour{name: "limitd-fixed-window", kind: limitd, window: true, args: []string{"--rls-algorithm", "fixed_window",
		"--rls-response-headers", "--rls-response-header-names", "Q-Limit,Q-Remaining,Q-Reset"}}
	bucket := flavour{name: "limitd-token-bucket", kind: limitd, args: []string{
		"--rls-response-headers", "--rls-response-header-names", "Q-Limit,Q-Remaining,Q-Reset"}}
	sides := startSides(t, map[string]string{"kinds.yaml": kindsYAML},
		envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, ref, lim, bucket)
	got := make([][]rlHeader, len(sides))
	inOneWindow(t, redisesOf(sides), func() {
		for i := range got {
			got[i] = got[i][:0]
		}
		for _, st := range kindsScript {
			for range st.want {
				for i, sd := range sides {
					r := sd.c.Get("/", st.headers)
					got[i] = append(got[i], rlHeader{r.Status, r.Header.Get("q-limit"), r.Header.Get("q-remaining"), r.Header.Get("q-reset")})
				}
			}
		}
	})
	with := 0
	for j := range got[0] {
		a, b := got[0][j], got[1][j]
		ra, ea := strconv.Atoi(a.reset)
		rb, eb := strconv.Atoi(b.reset)
		resetOK := a.reset == b.reset || ea == nil && eb == nil && ra-rb <= 1 && rb-ra <= 1
		if a.status != b.status || a.limit != b.limit || a.remaining != b.remaining || !resetOK {
			t.Errorf("request %d: envoyproxy/ratelimit %+v, limitd %+v", j, a, b)
		}
		if a.limit != "" {
			with++
		}
		c := got[2][j]
		limit, el := strconv.Atoi(c.limit)
		remaining, er := strconv.Atoi(c.remaining)
		reset, et := strconv.Atoi(c.reset)
		if (c.limit == "") != (a.limit == "") || a.limit != "" && (el != nil || er != nil || et != nil || remaining > limit || reset < 0 || reset > 3600) {
			t.Errorf("request %d: token buckets %+v, envoyproxy/ratelimit %+v", j, c, a)
		}
	}
	if with == 0 {
		t.Fatal("no request got the headers")
	}
	t.Logf("%d requests compared, %d with the headers", len(got[0]), with)
}
