// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/bench/cmd/bench/nullwasm"
	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// kind is what sits in Envoy's HTTP filter chain before the router.
type kind int

const (
	kindNone    kind = iota // the router alone
	kindNative              // envoy.filters.http.local_ratelimit
	kindPlugin              // this plugin, a local rule
	kindCluster             // this plugin, a cluster rule through limitd
	kindLease               // this plugin, a cluster rule in lease mode
	kindModule              // this plugin built as an Envoy dynamic module, a local rule
)

// usesLimitd reports whether s needs the limit service.
func (s setup) usesLimitd() bool { return s.Kind == kindCluster || s.Kind == kindLease }

// setup is one benchmarked configuration.
type setup struct {
	ID        int    // stable number, for -only and results.json
	Name      string // short name for files and flags
	Label     string // name in the table
	Plot      string // name in the plots, lines split by '\n'
	Kind      kind
	Rejecting bool // limited to reject about half the requests
	// Plugin is the plugin configuration of a diagnostic setup (nil: the
	// standard rule). Diagnostic setups run only when asked for (-diag or
	// -only) and split the plugin's cost into parts.
	Plugin func(limit) string
	// Free leaves Envoy's threads free to run on every CPU (not pinned),
	// as Envoy runs in a container without a CPU limit.
	Free bool
	// Workers is Envoy's --concurrency (0: 1).
	Workers int
}

var setups = []setup{
	{1, "none", "no filter", "no filter", kindNone, false, nil, false, 0},
	{2, "native", "native local_ratelimit", "native", kindNative, false, nil, false, 0},
	{3, "plugin", "plugin, local rule", "plugin", kindPlugin, false, nil, false, 0},
	{4, "plugin-reject", "plugin, ~50% rejected", "plugin\n~50% rej.", kindPlugin, true, nil, false, 0},
	{5, "native-reject", "native, ~50% rejected", "native\n~50% rej.", kindNative, true, nil, false, 0},
	{6, "cluster", "plugin, cluster rule per request", "plugin\ncluster", kindCluster, false, nil, false, 0},
	// Diagnostics: the cost of a Go Wasm filter that does nothing but read
	// one header, and of the plugin without its response headers.
	{7, "plugin-idle", "plugin, rule never applies", "plugin\nidle", kindPlugin, false, idleRule, false, 0},
	{8, "plugin-noheaders", "plugin, no response headers", "plugin\nno hdrs", kindPlugin, false, noHeadersRule, false, 0},
	// The same Wasm filter running a module whose callbacks do nothing
	// (package nullwasm): what Envoy and V8 cost per request before any
	// guest code runs.
	{9, "null-wasm", "no-op Wasm module", "no-op\nWasm", kindPlugin, false, idleRule, false, 0},
	// The no-op module calling the host nullHostCalls times per request:
	// (10) − (9) is the cost of that many calls from a module into Envoy.
	{10, "null-wasm-calls", "no-op Wasm module, 10 host calls", "no-op +10\nhost calls", kindPlugin, false, idleRule, false, 0},
	// A cluster rule with "sync": "lease" on one hot key (one bucket for all
	// requests, as a fleet-wide API limit): spent from a lease in shared
	// data, limitd called once per lease.
	{11, "cluster-lease", "plugin, cluster rule with leases", "plugin\nlease", kindLease, false, nil, false, 0},
	// The same rule run by the same engine built as an Envoy dynamic module
	// (make build-native): native code in Envoy's process, its buckets in
	// process memory.
	{12, "module", "native module, local rule", "native\nmodule", kindModule, false, nil, false, 0},
	// Envoy free on every CPU: the Go runtime of the native module then has
	// a CPU besides the one Envoy's worker holds (docs/native.md).
	{13, "none-free", "no filter, Envoy on any CPU", "no filter\nany CPU", kindNone, false, nil, true, 0},
	{14, "plugin-free", "plugin, local rule, Envoy on any CPU", "plugin\nany CPU", kindPlugin, false, nil, true, 0},
	{15, "module-free", "native module, local rule, Envoy on any CPU", "native module\nany CPU", kindModule, false, nil, true, 0},
	// Four workers on any CPU: with no lock shared by workers in the
	// module, its throughput grows from (15) as no filter's does from (13).
	{16, "none-4", "no filter, 4 workers on any CPU", "no filter\n4 workers", kindNone, false, nil, true, 4},
	{17, "module-4", "native module, local rule, 4 workers on any CPU", "native module\n4 workers", kindModule, false, nil, true, 4},
}

// setupByID is the configuration numbered id.
func setupByID(id int) (setup, bool) {
	for _, s := range setups {
		if s.ID == id {
			return s, true
		}
	}
	return setup{}, false
}

// nullHostCalls is how many host calls configuration 10 makes per request.
const nullHostCalls = nullwasm.HostCalls

// isDiag reports whether s is a diagnostic setup.
func (s setup) isDiag() bool { return s.Plugin != nil }

// idleRule is the standard rule behind a condition no request meets: the
// plugin reads one request header per request and decides nothing.
func idleRule(l limit) string {
	return `{"rules":[` + keyRule("per-key", `"match":{"header:x-bench-never":{"present":true}},`, l) + `]}`
}

// noHeadersRule is the standard rule with "headers": "none": no RateLimit
// headers on allowed responses.
func noHeadersRule(l limit) string {
	return `{"headers":"none",` + strings.TrimPrefix(pluginRule(l), "{")
}

// neverLimit is a per-key rate and burst no benchmark can exhaust.
const neverLimit = 1e9

// limit is a per-key token bucket: tokens per second and capacity. The
// native filter takes integers, so both are whole numbers.
type limit struct{ Rate, Burst int64 }

var unlimited = limit{neverLimit, neverLimit}

// nativeStatPrefix is the stat_prefix of the native filter: its statistics
// are <prefix>.http_local_rate_limit.{enabled,ok,rate_limited,enforced}.
const nativeStatPrefix = "bench_native"

// nativeFilter is Envoy's local rate limit filter with one token bucket
// per x-api-key value (rate and burst per second, at most maxDescriptors
// buckets): the filter's own rate_limits turn the header into the
// descriptor entry x-api-key=<value>, and the descriptor whose entry has no
// value is the wildcard that gives every distinct value its own bucket (an
// LRU of at most max_dynamic_descriptors). The filter is enabled and
// enforced for every request (both default to 0%). The default bucket must
// be set but is never consumed when a descriptor matches.
func nativeFilter(rate, burst int64, maxDescriptors int) string {
	return fmt.Sprintf(`- name: envoy.filters.http.local_ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
    stat_prefix: %s
    filter_enabled:
      runtime_key: bench_native_enabled
      default_value: {numerator: 100, denominator: HUNDRED}
    filter_enforced:
      runtime_key: bench_native_enforced
      default_value: {numerator: 100, denominator: HUNDRED}
    token_bucket: {max_tokens: 4000000000, tokens_per_fill: 4000000000, fill_interval: 1s}
    always_consume_default_token_bucket: false
    max_dynamic_descriptors: %d
    rate_limits:
    - actions:
      - request_headers: {header_name: x-api-key, descriptor_key: x-api-key}
    descriptors:
    - entries:
      - key: x-api-key
      token_bucket: {max_tokens: %d, tokens_per_fill: %d, fill_interval: 1s}`, nativeStatPrefix, maxDescriptors, burst, rate)
}

// pluginRule is the plugin's configuration: one local rule giving every
// x-api-key value its own bucket.
func pluginRule(l limit) string { return `{"rules":[` + keyRule("per-key", "", l) + `]}` }

// keyRule is one local rule called name giving every x-api-key value its
// own bucket of l; fields (JSON members, each followed by a comma) go
// between its name and its keys.
func keyRule(name, fields string, l limit) string {
	return `{"name":"` + name + `",` + fields + `"limit_keys":["header:x-api-key"],"algorithm":"token_bucket",` +
		`"algorithm_config":{"tokens_per_second":` + strconv.FormatInt(l.Rate, 10) +
		`,"burst":` + strconv.FormatInt(l.Burst, 10) + `}}`
}

// clusterRule is the plugin's configuration for setup 6: one cluster rule
// per x-api-key value decided by the limit service behind the Envoy cluster
// limit_service. The timeout is generous so that a busy loopback service
// does not turn into fail-open decisions (counted in service_errors).
func clusterRule(l limit) string { return clusterRuleSync(l, "per_request", `"header:x-api-key"`) }

// clusterRuleSync is clusterRule with the given sync and limit keys (setup
// 11: "lease", and none: one bucket).
func clusterRuleSync(l limit, sync, keys string) string {
	return `{"service":{"cluster":"limit_service","timeout_ms":1000},` +
		`"rules":[{"name":"fleet","scope":"cluster","sync":"` + sync + `","limit_keys":[` + keys + `],"algorithm":"token_bucket",` +
		`"algorithm_config":{"tokens_per_second":` + strconv.FormatInt(l.Rate, 10) +
		`,"burst":` + strconv.FormatInt(l.Burst, 10) + `}}]}`
}

// options builds Envoy's options for s with the per-key limit l: the one
// bootstrap, with or without the plugin, the native filter or the limit
// service's cluster.
func (s setup) options(upstreamPort, servicePort, keys int, l limit) envoy.Options {
	o := envoy.Options{
		UpstreamPort:  upstreamPort,
		Concurrency:   max(s.Workers, 1),
		LogLevel:      "warn",
		FailurePolicy: "FAIL_CLOSED",
	}
	switch s.Kind {
	case kindNone:
		o.NoWasm = true
	case kindNative:
		o.NoWasm = true
		o.Filters = nativeFilter(l.Rate, l.Burst, maxDescriptors(keys))
		if s.ID == nativeHeadersSetup.ID {
			o.Filters += "\n    enable_x_ratelimit_headers: DRAFT_VERSION_03"
		}
	case kindPlugin:
		o.PluginConfig = pluginRule(l)
		if s.Plugin != nil {
			o.PluginConfig = s.Plugin(l)
		}
	case kindCluster:
		o.PluginConfig = clusterRule(l)
		o.ServicePort = servicePort
	case kindLease:
		o.PluginConfig = clusterRuleSync(l, "lease", "")
		o.ServicePort = servicePort
	case kindModule:
		o.Build = envoy.Native
		o.PluginConfig = pluginRule(l)
		if s.Plugin != nil {
			o.PluginConfig = s.Plugin(l)
		}
	}
	return o
}

// maxDescriptors is the native filter's max_dynamic_descriptors: room for
// every key with a margin, so that no bucket is ever evicted.
func maxDescriptors(keys int) int { return max(keys*2, 1000) }

// decides reports whether s's filter counts decisions in /stats.
func (s setup) decides() bool {
	return s.Kind != kindNone && s.Name != "plugin-idle" && s.Name != "null-wasm" && s.Name != "null-wasm-calls"
}

// allowedStat and rejectedStat name the statistics that prove the limiter
// ran: every request it saw is counted in one of them.
func (s setup) allowedStat() string {
	switch s.Kind {
	case kindNative:
		return nativeStatPrefix + ".http_local_rate_limit.ok"
	case kindPlugin:
		return "wasmcustom.tokenbucket.rule.per-key.allowed"
	case kindModule:
		return envoy.Native.StatPrefix() + "tokenbucket.rule.per-key.allowed"
	case kindCluster, kindLease:
		return "wasmcustom.tokenbucket.rule.fleet.allowed"
	}
	return ""
}

func (s setup) rejectedStat() string {
	switch s.Kind {
	case kindNative:
		return nativeStatPrefix + ".http_local_rate_limit.rate_limited"
	case kindPlugin:
		return "wasmcustom.tokenbucket.rule.per-key.rejected"
	case kindModule:
		return envoy.Native.StatPrefix() + "tokenbucket.rule.per-key.rejected"
	case kindCluster, kindLease:
		return "wasmcustom.tokenbucket.rule.fleet.rejected"
	}
	return ""
}

// keyRequests returns one prebuilt request per x-api-key value k0..k(n-1).
func keyRequests(n int, more ...string) [][]byte {
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = loadgen.Request("GET", "/bench", append([]string{"Host: bench", "x-api-key: k" + strconv.Itoa(i)}, more...)...)
	}
	return reqs
}
