// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

// DemoConfigYAML is the standard bootstrap of the end-to-end tests, a
// template for Options.Config:
//
//   - an admin interface on 127.0.0.1:{{.AdminPort}};
//   - a listener on 127.0.0.1:{{.ListenerPort}} whose HTTP connection manager
//     (stat_prefix "ingress") runs envoy.filters.http.wasm, then the router,
//     routing every path to the cluster "upstream" (route timeout 15 s);
//   - the Wasm filter: name and root_id "tokenbucket", V8 VM with vm_id
//     "tokenbucket" loading {{.PluginWasm}}, the plugin configuration
//     {{.PluginConfig}} as a google.protobuf.StringValue, and failure_policy
//     {{.FailurePolicy}} (FAIL_CLOSED unless Options say otherwise; the
//     deprecated fail_open is left unset);
//   - the cluster "upstream" on 127.0.0.1:{{.UpstreamPort}} and, when
//     {{.ServicePort}} is not 0, the cluster "limit_service" on
//     127.0.0.1:{{.ServicePort}}, both HTTP/1.1 with circuit breakers high
//     enough for MaxBurst concurrent requests.
//
// A plugin metric "x" reads as Stat("wasmcustom.x"); the listener's
// statistics are under "http.ingress.".
const DemoConfigYAML = `admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: {{.AdminPort}}}
static_resources:
  listeners:
  - name: main
    address:
      socket_address: {address: 127.0.0.1, port_value: {{.ListenerPort}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          use_remote_address: true
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: upstream, timeout: 15s}
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tokenbucket
                root_id: tokenbucket
                vm_config:
                  runtime: envoy.wasm.runtime.v8
                  vm_id: tokenbucket
                  code:
                    local:
                      filename: {{yamlstr .PluginWasm}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {{yamlstr .PluginConfig}}
                failure_policy: {{.FailurePolicy}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    connect_timeout: 2s
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http_protocol_options: {}}
    circuit_breakers:
      thresholds:
      - {max_connections: 10000, max_pending_requests: 10000, max_requests: 10000}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{.UpstreamPort}}}
{{- if .ServicePort}}
  - name: limit_service
    connect_timeout: 2s
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http_protocol_options: {}}
    circuit_breakers:
      thresholds:
      - {max_connections: 10000, max_pending_requests: 10000, max_requests: 10000}
    load_assignment:
      cluster_name: limit_service
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{.ServicePort}}}
{{- end}}
`

// PlainConfigYAML is DemoConfigYAML without the Wasm filter: admin on
// {{.AdminPort}}, a listener on {{.ListenerPort}} whose router sends every
// path to the cluster "upstream" on {{.UpstreamPort}}. It is the baseline for
// benchmarks and for testing this package.
const PlainConfigYAML = `admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: {{.AdminPort}}}
static_resources:
  listeners:
  - name: main
    address:
      socket_address: {address: 127.0.0.1, port_value: {{.ListenerPort}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: upstream, timeout: 15s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    connect_timeout: 2s
    type: STATIC
    circuit_breakers:
      thresholds:
      - {max_connections: 10000, max_pending_requests: 10000, max_requests: 10000}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{.UpstreamPort}}}
`
