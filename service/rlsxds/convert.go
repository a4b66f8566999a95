package rlsxds

import (
	"bytes"
	"fmt"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// TypeURL is the one resource type the client asks for and accepts.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// FileName is the name a resource's configuration errors give it, as a
// file's would: "xds:" and the resource's name.
func FileName(resource string) string { return "xds:" + resource }

// Render writes one RateLimitConfig resource as the YAML file
// envoyproxy/ratelimit's format reads, so it is validated by the one path
// files take (rlsconfig.Parse): the fields the resource has, each string
// double-quoted (quote), the unit by its enum name
// (UNKNOWN included, which only an unlimited limit may have), as
// envoyproxy/ratelimit converts it. Writing stops past
// rlsconfig.MaxFileBytes, and descriptors nest at most rlsconfig.MaxDepth
// levels: a larger or deeper resource is refused here, in time linear in
// what was written.
func Render(c *rlsconf.RateLimitConfig) (rlsconfig.File, error) {
	r := renderer{file: FileName(c.GetName())}
	r.b.WriteString("domain: ")
	r.quote(c.GetDomain())
	r.b.WriteByte('\n')
	if err := r.descriptors(c.GetDescriptors(), 0, "descriptors"); err != nil {
		return rlsconfig.File{}, err
	}
	if err := r.check(); err != nil {
		return rlsconfig.File{}, err
	}
	return rlsconfig.File{Name: r.file, Data: r.b.Bytes()}, nil
}

// renderer writes one resource's YAML.
type renderer struct {
	file string
	b    bytes.Buffer
}

func (r *renderer) check() error {
	if r.b.Len() > rlsconfig.MaxFileBytes {
		return &rlsconfig.Error{File: r.file, Msg: fmt.Sprintf("larger than %d bytes", rlsconfig.MaxFileBytes)}
	}
	return nil
}

// quote writes s as a YAML double-quoted scalar: every character that is
// not printable in YAML, or that a double-quoted scalar would fold (line
// breaks), escaped as \uXXXX; '"' and '\\' escaped; the rest as it is.
func (r *renderer) quote(s string) {
	r.b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			r.b.WriteByte('\\')
			r.b.WriteRune(c)
		case c < 0x20, c >= 0x7f && c <= 0x9f, c == 0x2028, c == 0x2029, c == 0xfeff, c == 0xfffe, c == 0xffff,
			c >= 0xd800 && c <= 0xdfff:
			fmt.Fprintf(&r.b, "\\u%04x", c)
		default:
			r.b.WriteRune(c)
		}
	}
	r.b.WriteByte('"')
}

func (r *renderer) descriptors(ds []*rlsconf.RateLimitDescriptor, depth int, field string) error {
	if len(ds) == 0 {
		return nil
	}
	if depth >= rlsconfig.MaxDepth {
		return &rlsconfig.Error{File: r.file, Field: field, Msg: fmt.Sprintf("descriptors nest more than %d deep", rlsconfig.MaxDepth)}
	}
	in := strings.Repeat("  ", depth)
	r.b.WriteString(in + "descriptors:\n")
	for i, d := range ds {
		if err := r.check(); err != nil {
			return err
		}
		r.b.WriteString(in + "- key: ")
		r.quote(d.GetKey())
		r.b.WriteByte('\n')
		if d.GetValue() != "" {
			r.b.WriteString(in + "  value: ")
			r.quote(d.GetValue())
			r.b.WriteByte('\n')
		}
		if rl := d.GetRateLimit(); rl != nil {
			fmt.Fprintf(&r.b, "%s  rate_limit: {unit: %s, requests_per_unit: %d", in, rl.GetUnit(), rl.GetRequestsPerUnit())
			if rl.GetUnlimited() {
				r.b.WriteString(", unlimited: true")
			}
			if rl.GetName() != "" {
				r.b.WriteString(", name: ")
				r.quote(rl.GetName())
			}
			if len(rl.GetReplaces()) > 0 {
				r.b.WriteString(", replaces: [")
				for j, rp := range rl.GetReplaces() {
					if j > 0 {
						r.b.WriteString(", ")
					}
					r.b.WriteString("{name: ")
					r.quote(rp.GetName())
					r.b.WriteString("}")
				}
				r.b.WriteString("]")
			}
			r.b.WriteString("}\n")
		}
		if d.GetShadowMode() {
			r.b.WriteString(in + "  shadow_mode: true\n")
		}
		if d.GetDetailedMetric() {
			r.b.WriteString(in + "  detailed_metric: true\n")
		}
		if err := r.descriptors(d.GetDescriptors(), depth+1, fmt.Sprintf("%s[%d].descriptors", field, i)); err != nil {
			return err
		}
	}
	return nil
}

// Convert reads a response's resources and parses them as one
// configuration, each resource a file (FileName): the same checks and the
// same errors as files, a domain served twice refused as a domain in two
// files is. At most rlsconfig.MaxFiles resources are read.
func Convert(resources []*anypb.Any) (*rlsconfig.Config, []rlsconfig.File, error) {
	if len(resources) > rlsconfig.MaxFiles {
		return nil, nil, fmt.Errorf("rlsxds: resources: more than %d", rlsconfig.MaxFiles)
	}
	files := make([]rlsconfig.File, 0, len(resources))
	for i, r := range resources {
		if r.GetTypeUrl() != TypeURL {
			return nil, nil, fmt.Errorf("rlsxds: resources[%d].type_url: want %s, got %q", i, TypeURL, r.GetTypeUrl())
		}
		var c rlsconf.RateLimitConfig
		if err := anypb.UnmarshalTo(r, &c, proto.UnmarshalOptions{}); err != nil {
			return nil, nil, fmt.Errorf("rlsxds: resources[%d]: %w", i, err)
		}
		f, err := Render(&c)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
	}
	cfg, err := rlsconfig.Parse(files)
	if err != nil {
		return nil, nil, err
	}
	return cfg, files, nil
}
