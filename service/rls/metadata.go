package rls

import (
	"strings"
	"unicode/utf8"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is the answer's dynamic_metadata as envoyproxy/ratelimit
// gives it with RESPONSE_DYNAMIC_METADATA: not the configuration's (neither
// its YAML nor its xDS resource has a descriptor metadata) but the request
// as it was decided, which Envoy's filter puts in the request's dynamic
// metadata (under envoy.filters.http.ratelimit) for later filters and logs:
//
//   - domain: the request's domain;
//   - descriptors: for each of the request's descriptors, entries (a list
//     of "key=value"), limit (its limit override, in the protobuf text form,
//     whose spacing the protobuf library varies on purpose) and hitsAddend
//     (its own), each only when set;
//   - hitsAddend: the request's, when not 0;
//   - quotaModeViolations: the indexes of the descriptors over a quota_mode
//     limit (not shadow_mode), when any;
//   - quotaModeEnabled: whether any descriptor's limit (not unlimited, not
//     replaced) is in quota_mode.
func dynamicMetadata(req *pb.RateLimitRequest, ds []descriptor) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(validString(req.GetDomain()))}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, pd := range req.GetDescriptors() {
		if pd == nil {
			continue
		}
		entries := make([]*structpb.Value, 0, len(pd.GetEntries()))
		for _, e := range pd.GetEntries() {
			entries = append(entries, structpb.NewStringValue(validString(e.GetKey()+"="+e.GetValue())))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if pd.GetLimit() != nil {
			f["limit"] = structpb.NewStringValue(validString(pd.GetLimit().String()))
		}
		if h := pd.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	var violations []*structpb.Value
	quota := false
	for i := range ds {
		d := &ds[i]
		if d.limit == nil {
			continue
		}
		quota = quota || d.limit.QuotaMode
		if d.over && d.limit.QuotaMode && !d.limit.ShadowMode {
			violations = append(violations, structpb.NewNumberValue(float64(i)))
		}
	}
	if len(violations) > 0 {
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: violations})
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(quota)
	return &structpb.Struct{Fields: fields}
}

// validString is s with invalid UTF-8 replaced: a protobuf string must be
// valid (the handler's decoder already puts a request's strings in a valid
// form, decode.go; a direct caller of ShouldRateLimit may not).
func validString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
