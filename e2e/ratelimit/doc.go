// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package ratelimit holds limitd's black-box and differential tests as the
// rate limit service of Envoy's own rate limit filter
// (envoy.filters.http.ratelimit, the RLS gRPC API): real Envoy 1.40 (its
// filter is the client, no plugin), limitd (build/limitd), envoyproxy/ratelimit
// built from source (build/envoy-ratelimit/service_cmd) and real redis-server
// processes, one per service.
//
// Each test runs on flavours of the service: envoyproxy/ratelimit,
// limitd with fixed windows (--rls-algorithm fixed_window) and limitd with
// token buckets. The black-box tests (TestBurstTwoEnvoys,
// TestDescriptorKinds, TestHitsAddendFromHeader, TestReloadUnderTraffic,
// TestRefusedFile, TestRedisStopped, and TestExtensions for limitd alone)
// say what each must answer; the differential ones play the same traffic
// on two or three side by side and compare (TestDifferentialFixedWindow,
// TestDifferentialTokenBucket, TestDifferentialStats; with envoyproxy/ratelimit's
// settings beside limitd's flags: TestDifferentialPrometheus,
// TestDifferentialNearLimitRatio, TestDifferentialResponseHeaders,
// TestDifferentialDynamicMetadata) or feed both every
// configuration file that ships in envoyproxy/ratelimit's source
// (TestReferenceConfigurations, TestReferenceConfigurationPairs). Fixed
// windows are counted on the clock: a script is played inside one window
// (its start aligned, or replayed when an edge fell inside).
//
// Configured over xDS, both services take Envoy Gateway's golden
// RateLimitConfig outputs from one ADS server with mutual TLS
// (TestEnvoyGatewayGolden by direct calls, TestEnvoyGatewayGoldenThroughEnvoy
// through Envoy where its actions run here); limitd alone is started before
// any snapshot (TestEnvoyGatewayStartBeforeSnapshot) and run against a
// hostile ADS server (TestXDSHostileServer). Envoy Gateway's source is read
// from the module cache (`go mod download`), not a dependency of this module.
//
// It is a Go module of its own (`make test-ratelimit`): its go.mod names
// envoyproxy/ratelimit at the version mk/ratelimit.mk builds, so that
// `go mod download` puts that version's source in the module cache, where
// the tests read its example and test configurations; its dependencies
// never reach the product's go.mod.
package ratelimit
