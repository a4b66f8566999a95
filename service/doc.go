// Package service is the cluster-wide limit service: token buckets kept in
// Redis (a single node, Sentinel or Redis Cluster) and decided by one Lua
// script, behind a small HTTP API, so every gateway of a fleet shares one
// limit. cmd/limitd is its binary; openapi.yaml describes the API.
//
// # Model
//
// A request (Request) names one or more buckets, each with its limit (rate in
// tokens per second, burst) and the cost to take. The buckets are decided
// together and atomically: either every bucket holds its cost and all are
// consumed, or none is touched. The arithmetic is package bucket's: a bucket
// holds the tokens left at a moment, refills continuously, and a missing
// bucket is full. Answers report, per bucket, whether it alone had the
// tokens, the whole tokens remaining, and the waits (retry after, time to
// full) in milliseconds rounded up, so a client rounds them as it needs.
//
// # Redis
//
// RedisStore runs decide.lua once per request, by SHA (EVALSHA; on NOSCRIPT
// it falls back to EVAL once, which loads the script again). The script
// reads the time with Redis's TIME, so no gateway's or service's clock
// matters, and mirrors package bucket operation for operation, so both give
// bit-identical tokens (the differential tests hold them in step). A bucket
// is stored as a string "<tokens> <Unix µs>" whose expiry is the time it
// needs to be full again (rounded up to the millisecond, plus one): a key
// vanishes only once it would read as full anyway, so idle keys cost
// nothing, and the number of keys is bounded by what is refilling.
// A consumed bucket that is full at once (cost 0) is deleted.
//
// Keys are named
//
//	<prefix>{<tag>}:<key>
//
// with prefix "rl:" by default and tag the request's hash_tag, or, without
// one, 16 hex digits of the FNV-1a hash of the bucket's own key. Redis
// Cluster hashes only the tag, so all buckets of a request with a hash_tag
// share a slot and one script can decide them; single-bucket requests without
// one spread evenly over the cluster. A bucket's identity is the pair (tag,
// key): a client must send the same hash_tag every time it sends a key
// (typically a constant per configuration, or none at all). On a Redis
// Cluster, a request whose buckets fall in different slots (several buckets,
// no hash_tag) is refused with a *ValidationError on hash_tag; on a single
// node or Sentinel it is decided as sent.
//
// When a rule's limit changes, tokens carry over (clamped to the new burst),
// as in package bucket; but a key that expired under the old limit reads as
// full under the new one.
//
// Under load, concurrent decisions are pipelined (BatchOptions): a worker
// sends every decision already waiting in one pipeline of EVALSHA, one
// round trip per node. Each decision remains its own atomic script run.
// Client retries are off in cmd/limitd: a reply lost after the script ran
// may have consumed tokens, and a retry would consume them twice; the error
// goes to the client (503), whose failure mode decides.
//
// # Memory
//
// MemoryStore keeps the buckets in the process with the same semantics
// (package bucket's Take under one mutex, the same key names, buckets
// forgotten once full, a hard bound on their number). It is what limitd runs
// without --redis, limiting per process; it is never a stand-in for Redis in
// the Redis tests.
//
// # HTTP
//
// Server serves POST /v1/decide, GET /healthz, GET /readyz (the store
// answers) and GET /metrics (Prometheus). Request bodies, keys, bucket counts,
// rates, bursts and costs are bounded (Limits, MaxAmount); anything else is
// a 400 whose message names the field, e.g.
//
//	{"error": "buckets[0].burst: must be >= tokens_per_second (10), got 5"}
//
// With a token configured, /v1 requests need "Authorization: Bearer <token>".
//
// # Concurrency
//
// Server, RedisStore and MemoryStore are safe for concurrent use.
package service
