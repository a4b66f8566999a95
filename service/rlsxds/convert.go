package rlsxds

import (
	"fmt"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// TypeURL is the one resource type the client asks for and accepts.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// yamlRoot, yamlDescriptor, yamlRateLimit and yamlReplace are a resource
// as envoyproxy/ratelimit's YAML writes it: the fields the resource has,
// and no others.
type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
}

type yamlRateLimit struct {
	Unit            string        `yaml:"unit"`
	RequestsPerUnit uint32        `yaml:"requests_per_unit"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// FileName is the name a resource's configuration errors give it, as a
// file's would: "xds:" and the resource's name.
func FileName(resource string) string { return "xds:" + resource }

// Render writes one RateLimitConfig resource as the YAML file
// envoyproxy/ratelimit's format reads, so it is validated by the one path
// files take (rlsconfig.Parse). The unit is written by its enum name
// (UNKNOWN included, which only an unlimited limit may have), as
// envoyproxy/ratelimit converts it. Descriptors nest at most
// rlsconfig.MaxDepth levels: a deeper resource is refused here, before the
// recursion.
func Render(c *rlsconf.RateLimitConfig) (rlsconfig.File, error) {
	name := FileName(c.GetName())
	descs, err := renderDescriptors(c.GetDescriptors(), 1, name, "descriptors")
	if err != nil {
		return rlsconfig.File{}, err
	}
	data, err := yaml.Marshal(yamlRoot{Domain: c.GetDomain(), Descriptors: descs})
	if err != nil {
		return rlsconfig.File{}, fmt.Errorf("rlsxds: %s: %w", name, err)
	}
	return rlsconfig.File{Name: name, Data: data}, nil
}

func renderDescriptors(ds []*rlsconf.RateLimitDescriptor, depth int, file, field string) ([]yamlDescriptor, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if depth > rlsconfig.MaxDepth {
		return nil, &rlsconfig.Error{File: file, Field: field, Msg: fmt.Sprintf("descriptors nest more than %d deep", rlsconfig.MaxDepth)}
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		at := fmt.Sprintf("%s[%d]", field, i)
		sub, err := renderDescriptors(d.GetDescriptors(), depth+1, file, at+".descriptors")
		if err != nil {
			return nil, err
		}
		out[i] = yamlDescriptor{
			Key: d.GetKey(), Value: d.GetValue(), Descriptors: sub,
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(),
		}
		if rl := d.GetRateLimit(); rl != nil {
			y := &yamlRateLimit{Unit: rl.GetUnit().String(), RequestsPerUnit: rl.GetRequestsPerUnit(),
				Unlimited: rl.GetUnlimited(), Name: rl.GetName()}
			for _, r := range rl.GetReplaces() {
				y.Replaces = append(y.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = y
		}
	}
	return out, nil
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
