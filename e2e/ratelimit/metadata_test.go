// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"context"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const metadataYAML = `domain: meta
descriptors:
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
`

// TestDifferentialDynamicMetadata asks envoyproxy/ratelimit with
// RESPONSE_DYNAMIC_METADATA=true and limitd with fixed windows and
// --rls-response-metadata the same requests directly (quota_mode within
// and over its limit, descriptors' own hits, a limit override, the
// request's hits, unlimited and unknown descriptors) and demands the same
// dynamic_metadata, a limit override's text compared with its spaces
// collapsed (the protobuf library varies them on purpose).
func TestDifferentialDynamicMetadata(t *testing.T) {
	t.Parallel()
	files := map[string]string{"meta.yaml": metadataYAML}
	sides := []*service{
		startService(t, reference, files, "RESPONSE_DYNAMIC_METADATA=true"),
		startService(t, limitd, files, "--rls-algorithm", "fixed_window", "--rls-response-metadata"),
	}
	d := func(kv entries, hits uint64, limit *rlcommon.RateLimitDescriptor_RateLimitOverride) *rlcommon.RateLimitDescriptor {
		x := descriptor(kv)
		if hits > 0 {
			x.HitsAddend = wrapperspb.UInt64(hits)
		}
		x.Limit = limit
		return x
	}
	override := &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	reqs := []*rlsv3.RateLimitRequest{
		{Domain: "meta", Descriptors: []*rlcommon.RateLimitDescriptor{d(entries{"quota", "q"}, 0, nil)}},
		{Domain: "meta", HitsAddend: 2, Descriptors: []*rlcommon.RateLimitDescriptor{d(entries{"plain", "p"}, 3, nil), d(entries{"quota", "q"}, 0, nil)}},
		{Domain: "meta", Descriptors: []*rlcommon.RateLimitDescriptor{d(entries{"plain", "p"}, 0, override), d(entries{"free", "f"}, 0, nil), d(entries{"none", "n"}, 0, nil)}},
		{Domain: "meta", Descriptors: []*rlcommon.RateLimitDescriptor{d(entries{"free", "f"}, 0, nil)}},
	}
	inOneWindow(t, []*redistest.Server{sides[0].redis, sides[1].redis}, func() {
		for i, req := range reqs {
			var got [2]*structpb.Struct
			for j, s := range sides {
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				resp, err := rlsv3.NewRateLimitServiceClient(s.conn).ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					t.Fatalf("request %d: %s: %v", i, s.kind, err)
				}
				got[j] = resp.GetDynamicMetadata()
				collapseLimits(got[j])
			}
			if i == 1 && got[0].GetFields()["quotaModeViolations"] == nil {
				t.Errorf("request %d: envoyproxy/ratelimit saw no quota_mode violation: %v", i, got[0])
			}
			if got[0] == nil || !proto.Equal(got[0], got[1]) {
				t.Errorf("request %d: envoyproxy/ratelimit %v\nlimitd %v", i, got[0], got[1])
			}
		}
	})
}

// collapseLimits collapses the spaces of every descriptor's limit text in
// m, a dynamic_metadata.
func collapseLimits(m *structpb.Struct) {
	for _, v := range m.GetFields()["descriptors"].GetListValue().GetValues() {
		f := v.GetStructValue().GetFields()
		if l, ok := f["limit"]; ok {
			f["limit"] = structpb.NewStringValue(strings.Join(strings.Fields(l.GetStringValue()), " "))
		}
	}
}
