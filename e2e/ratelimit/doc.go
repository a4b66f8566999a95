// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package ratelimit holds limitd's black-box and differential tests as the
// rate limit service of Envoy's own rate limit filter
// (envoy.filters.http.ratelimit, the RLS gRPC API): real Envoy 1.40 (its
// filter is the client, no plugin), limitd (build/limitd), envoyproxy/ratelimit
// built from source (build/ratelimit/service_cmd) and real redis-server
// processes, one per service.
//
// It is a Go module of its own (`make test-ratelimit`): its go.mod names
// envoyproxy/ratelimit at the version mk/ratelimit.mk builds, so that
// `go mod download` puts that version's source in the module cache, where
// the tests read its example and test configurations; its dependencies
// never reach the product's go.mod.
package ratelimit
