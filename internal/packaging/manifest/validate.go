// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package manifest

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	clientnet "istio.io/client-go/pkg/apis/networking/v1"
	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// sha256Pattern is the WasmPlugin CRD's pattern for spec.sha256.
var sha256Pattern = regexp.MustCompile(`^[a-f0-9]{64}$`)

// urlSchemes are the schemes Istio's agent fetches a module from.
var urlSchemes = []string{"oci://", "https://", "http://", "file://"}

// PluginConfig returns the configuration string Istio gives the plugin for
// wp: spec.pluginConfig, a google.protobuf.Struct, marshalled to JSON by
// protojson (pilot/pkg/model/extensions.go), then wrapped in a StringValue.
func PluginConfig(wp *clientext.WasmPlugin) ([]byte, error) {
	if wp.Spec.PluginConfig == nil {
		return nil, fmt.Errorf("spec.pluginConfig: missing (the plugin needs at least one rule)")
	}
	b, err := protojson.Marshal(wp.Spec.PluginConfig)
	if err != nil {
		return nil, fmt.Errorf("spec.pluginConfig: %w", err)
	}
	return b, nil
}

// Clusters returns the Envoy clusters Istio builds for the Services and
// ServiceEntries of docs, outbound|<port>||<host>, mapped to their host.
func Clusters(docs []Doc) map[string]string {
	out := map[string]string{}
	for _, d := range docs {
		switch o := d.Obj.(type) {
		case *corev1.Service:
			host := o.Name + "." + o.Namespace + ".svc.cluster.local"
			for _, p := range o.Spec.Ports {
				out["outbound|"+strconv.Itoa(int(p.Port))+"||"+host] = host
			}
		case *clientnet.ServiceEntry:
			for _, h := range o.Spec.Hosts {
				for _, p := range o.Spec.Ports {
					out["outbound|"+strconv.Itoa(int(p.Number))+"||"+h] = h
				}
			}
		}
	}
	return out
}

// Options tune Validate.
type Options struct {
	// RequireClusters makes a cluster rule whose service.cluster none of the
	// documents creates an error; otherwise it is a note (the Service may
	// be applied from elsewhere).
	RequireClusters bool
	// RootNamespace is Istio's root namespace (meshConfig.rootNamespace),
	// where an EnvoyFilter applies to workloads of every namespace;
	// "" means DefaultRootNamespace.
	RootNamespace string
}

// DefaultRootNamespace is Istio's default root namespace.
const DefaultRootNamespace = "istio-system"

// Report is what Validate found.
type Report struct {
	// Errors make the manifests unusable: Istio or the plugin would refuse
	// them, or they contradict each other.
	Errors []error
	// Notes are what could not be checked from these documents alone.
	Notes []string
	// Plugins counts the WasmPlugins checked, NativeFilters the native
	// module's filters in EnvoyFilters, Rules the rules of both.
	Plugins, NativeFilters, Rules int
}

// Validate checks, beyond the strict decoding, what neither the API server
// nor Istio checks before a proxy gets the configuration, without judging
// the manifests' own choices (failStrategy, phase, selectors, limits):
//
//   - a WasmPlugin's url has a scheme Istio fetches, and its sha256, when
//     set, matches the CRD's pattern;
//   - its pluginConfig, in the JSON form Istio hands the plugin, passes the
//     plugin's parser (config.Parse): a configuration the plugin refuses
//     makes the proxy reject the whole listener update;
//   - its cluster rules name a cluster of the form outbound|<port>|<subset>|<host>;
//     when a Service or ServiceEntry of docs creates it, service.authority is
//     that host (otherwise a note, or an error with RequireClusters);
//   - no two WasmPlugins of one namespace share a pluginName (their
//     buckets would mix in shared data);
//   - an EnvoyFilter that loads the native module (NativeFilters) does so
//     well-formed, its configuration passes the plugin's parser as the
//     module receives it (filter_config's StringValue), its cluster rules
//     pass the checks above, and every Deployment of docs it selects gives
//     its istio-proxy container what Envoy needs to load the module:
//     GODEBUG with cgocheck=0 and ENVOY_DYNAMIC_MODULES_SEARCH_PATH naming a
//     folder mounted from a volume, through the container's own fields or
//     the injector's annotations (sidecar.istio.io/userVolume,
//     sidecar.istio.io/userVolumeMount, proxy.istio.io/config's
//     proxyMetadata). With no selected Deployment among docs, a note.
func Validate(docs []Doc, opts Options) Report {
	var r Report
	known := Clusters(docs)
	rootIDs := map[string]Doc{}
	for _, d := range docs {
		wp, ok := d.Obj.(*clientext.WasmPlugin)
		if !ok {
			continue
		}
		r.Plugins++
		fail := func(format string, args ...any) {
			r.Errors = append(r.Errors, fmt.Errorf("%s (WasmPlugin %s/%s): %s", d, wp.Namespace, wp.Name, fmt.Sprintf(format, args...)))
		}
		s := &wp.Spec
		if !hasScheme(s.Url) {
			fail("spec.url %q: want one of %v", s.Url, urlSchemes)
		}
		if s.Sha256 != "" && !sha256Pattern.MatchString(s.Sha256) {
			fail("spec.sha256 %q: does not match the CRD's %s", s.Sha256, sha256Pattern)
		}
		key := wp.Namespace + "/" + s.PluginName
		if other, dup := rootIDs[key]; dup {
			fail("spec.pluginName %q: also the pluginName of %s: their buckets would share keys", s.PluginName, other)
		}
		rootIDs[key] = d
		pc, err := PluginConfig(wp)
		if err != nil {
			fail("%v", err)
			continue
		}
		cfg, err := config.Parse(pc)
		if err != nil {
			fail("spec.pluginConfig, as Istio passes it, is refused by the plugin: %v", err)
			continue
		}
		r.Rules += len(cfg.Rules)
		r.checkClusterRules(d, cfg, known, opts, fail)
	}
	root := opts.RootNamespace
	if root == "" {
		root = DefaultRootNamespace
	}
	for _, d := range docs {
		ef, ok := d.Obj.(*clientnetv1a3.EnvoyFilter)
		if !ok {
			continue
		}
		fail := func(format string, args ...any) {
			r.Errors = append(r.Errors, fmt.Errorf("%s (EnvoyFilter %s/%s): %s", d, ef.Namespace, ef.Name, fmt.Sprintf(format, args...)))
		}
		filters, err := NativeFilters(ef)
		if err != nil {
			fail("%v", err)
			continue
		}
		if len(filters) == 0 {
			continue
		}
		for _, f := range filters {
			r.NativeFilters++
			cfg, err := config.Parse(f.Config)
			if err != nil {
				fail("spec.configPatches[%d]: filter_config, as the module receives it, is refused by the plugin: %v", f.Patch, err)
				continue
			}
			r.Rules += len(cfg.Rules)
			r.checkClusterRules(d, cfg, known, opts, fail)
		}
		errs, note := checkNativeWorkloads(docs, d, ef, root)
		r.Errors = append(r.Errors, errs...)
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	return r
}

// checkClusterRules checks the cluster rules of cfg, the configuration of
// the plugin in document d, against the clusters docs create (known).
func (r *Report) checkClusterRules(d Doc, cfg *config.Config, known map[string]string, opts Options, fail func(string, ...any)) {
	for _, rule := range cfg.Rules {
		if rule.Scope != config.ScopeCluster {
			continue
		}
		c := rule.Service.Cluster
		parts := strings.Split(c, "|")
		if len(parts) != 4 || parts[0] != "outbound" || parts[3] == "" {
			fail("rule %s: service.cluster %q: not a cluster Istio builds (outbound|<port>|<subset>|<host>)", rule.Name, c)
			continue
		}
		if p, err := strconv.Atoi(parts[1]); err != nil || p < 1 || p > 65535 {
			fail("rule %s: service.cluster %q: port %q", rule.Name, c, parts[1])
			continue
		}
		host, ok := known[c]
		switch {
		case !ok && opts.RequireClusters:
			fail("rule %s: service.cluster %q: no Service or ServiceEntry here creates it (these do: %v)", rule.Name, c, sortedKeys(known))
		case !ok:
			r.Notes = append(r.Notes, fmt.Sprintf("%s: rule %s: service.cluster %q: not created by these manifests; apply a Service or ServiceEntry for %s port %s", d, rule.Name, c, parts[3], parts[1]))
		case rule.Service.Authority != host:
			fail("rule %s: service.authority %q, want the service host %q", rule.Name, rule.Service.Authority, host)
		}
	}
}

func hasScheme(url string) bool {
	for _, s := range urlSchemes {
		if strings.HasPrefix(url, s) && len(url) > len(s) {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
