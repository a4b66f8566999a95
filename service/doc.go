// Package service is the cluster-wide limit service: token buckets kept in
// Redis (a single node, Sentinel or Redis Cluster), each call one atomic run
// of a Lua script (five of them, below), or in the process's memory with the
// same semantics, so every gateway of a fleet shares one limit. cmd/limitd
// is its binary; openapi.yaml describes the HTTP API.
//
// # Front doors
//
// The service has one core, in core.go: a Store (Decide, Lease, Charge,
// Count) and the function Decide every decision goes through; three front
// doors translate into it:
//
//   - the HTTP API (Server, this package), which the plugin and the native
//     module call: /v1/decide (Decide), /v1/lease, /v1/charge;
//   - Envoy's rate limit service, ShouldRateLimit over gRPC (package rls,
//     configured by envoyproxy/ratelimit's YAML through package rlsconfig):
//     token buckets through Decide, and envoyproxy/ratelimit's fixed
//     windows through Count (window.lua, and the memory store's mirror);
//   - Envoy's rate limit quota service, a bidirectional gRPC stream per
//     Envoy (package rlqs, the same YAML): it divides each limit's rate and
//     burst among the Envoys reporting demand for it, leasing nothing, and
//     hands each an assignment Envoy enforces alone; what the Envoys report
//     allowed is then taken from the same bucket through Lease, so the
//     other doors see that traffic one report late. Its model and bound
//     are in its package doc.
//
// The HTTP API and the rate limit service decide nothing themselves: every
// decision is the store's, so a limit named the same way through either is
// one bucket. Every door takes the same bearer tokens (cmd/limitd's
// --token-file: Config.Tokens here), a token's name being the call's caller
// in the ledger.
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
// A bucket with a max delay (Bucket.MaxDelayMs) may delay instead of
// refusing: short of its cost, it takes it into debt when the refill pays
// the debt back within the max delay (package bucket's Reserve), and answers
// the wait (BucketAnswer.WaitMs; the answer's WaitMs is the longest of the
// enforced buckets'), during which the caller holds the request; past its
// bound it refuses at once, taking nothing. The buckets of a request are
// still all taken or none. A request that may be held records what its
// enforced buckets take as the caller's reservations (see Ledger), so a
// gateway whose held client goes away refunds it with a charge. A debt,
// from charges or delays, refuses every decision that cannot wait, and
// every lease, until it is paid back.
//
// # Redis
//
// Seven Lua scripts, each call one atomic run per Redis Cluster slot:
// bucket.lua, the part the next three start with (Redis's clock, reading
// and writing one bucket and its ledger); decide.lua (a decision: Decide),
// after take.lua, which answers a plain decision (one token bucket with no
// ledger, refund, delay or period) exactly as the general part would, for
// less of Redis's CPU, and leaves any other to it (TestTakeMatchesDecide;
// the benchmark's benchfloor build puts take_floor.lua in its place);
// lease.lua (a lease call: Lease), charge.lua (costs known from the
// response, refunds, and the undo of a request split over slots: Charge);
// window.lua (fixed-window counters: Count); and slots.lua (concurrency
// slots, leases with a TTL: SlotStore, slots.go, which states their model
// and bound).
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
//	<prefix>{<tag>}:<rate>/<burst>:<key>
//
// with prefix "rl:" by default and tag 16 hex digits of the FNV-1a hash of
// the bucket's own key. A bucket's identity is its key and its limit: a call
// naming another limit for a key addresses another bucket, so no caller can
// refill (by claiming a faster rate) or deepen a bucket it does not share the
// limit of, and a rule whose limit changes starts a new bucket. The request's
// hash_tag is ignored, so a bucket's slot never depends on which other
// buckets a request carries. On a Redis Cluster, a request whose buckets fall
// in different slots is one script per slot, in request order; when one
// refuses, the others' takes are given back (refunds of what they just
// reserved, or returns of what they just granted): never over the limit,
// briefly under. On a single node or Sentinel it is one script.
//
// # Ledger
//
// Each bucket's record also holds a ledger (ledger.go, mirrored in
// bucket.lua): per caller (WithCaller; Server names the caller by its token),
// the tokens leases granted and not yet returned, and the tokens refundable
// decisions (Bucket.Refundable, or a request that may be held) reserved and
// not yet refunded, in two
// generations of one window (RedisOptions.LedgerWindow): an amount can be
// given back for one to two windows. A lease's return is clamped to the
// grants outstanding to the same caller and a charge's refund to the
// reservations outstanding to the same caller, in the same atomic script that
// changes the bucket; a positive charge is clamped to 2 × burst. So no caller
// gives back more than it took within the last two windows, and no caller's
// calls lift what another's take: what all callers' requests take over t, net
// of what each gave back of its own, is at most burst + rate × t. Returns
// are also bounded in rate, one burst per window and bucket (the gateways
// spend grants without telling the service, and a caller returning each at
// once would otherwise recycle them), and refunds to what the window
// reserved plus one burst (reservations kept over windows come back a burst
// per window). A caller with nothing outstanding leaves the record, so its
// size is bounded by the callers the server knows. A bucket that is full is
// deleted with its ledger (it takes nothing back anyway), unless a budget is
// in use: then it is kept to the window's end.
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
// Server serves POST /v1/decide, /v1/lease and /v1/charge, GET /healthz,
// GET /readyz (the store answered its last Ping, at most Config.ReadyEvery
// old) and GET /metrics (Prometheus; Config.Metrics says to whom: its
// labels carry request values, so off loopback it asks for a caller's
// token, or is served on a listener of its own). A shadow bucket is decided on its own
// and never changes the enforced answer, even when its decision fails (it is
// then answered allowed and counted as a shadow error). NewHTTPServer serves
// it over HTTP/1.1 and h2c on one port, each connection bounded (streams,
// header sizes, timeouts: the constants beside it). ConnGuard bounds the
// connections: at most a cap; one that never carried an authorized /v1 call
// closed once idle, and evictable for a new one whatever its state once its
// grace is over (accepted a while ago, or a request read from it); a request
// without the token answered 401 before its body is read, its connection
// closed. Request bodies, keys, bucket counts, rates, bursts and costs are
// bounded (Limits, MaxAmount); anything else is a 400 whose message names the
// field, e.g.
//
//	{"error": "buckets[0].burst: must be >= tokens_per_second (10), got 5"}
//
// With a token configured, /v1 requests need "Authorization: Bearer <token>";
// the token's name is the call's caller, or, for a front proxy's token, the
// listed identity it forwards (Config.Identities, Config.IdentityHeader).
//
// # Concurrency
//
// Server, RedisStore and MemoryStore are safe for concurrent use.
package service
