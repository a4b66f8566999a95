// Package filter runs the rate limiter's engine (package engine) as an
// Envoy dynamic-module HTTP filter, on Envoy's Go SDK for dynamic modules:
// the same configuration, rules, responses and metric names as the Wasm
// plugin (package plugin), called natively in Envoy's process. Command
// native registers it and builds libtokenbucket.so.
//
// # Model
//
// Envoy calls filter callbacks on many worker threads at once; the engine
// is called from one thread at a time. The adapter keeps one engine.Plugin
// per Envoy thread, found by Envoy's worker index when it creates a filter
// (workers: a read-mostly map, lock-free on reads), each with its own lock
// held during that Plugin's engine calls. A worker only takes its own
// Plugin's lock, so no worker waits on another, and each worker's Plugin
// behaves as one Wasm VM does. The workers share buckets and leases through
// one process-wide Store with the semantics of Envoy's proxy-wasm shared
// data (compare-and-swap, no delete), sharded by key, bounded by max_keys
// as in Wasm: every decision is exact across workers.
//
// Calls the Plugin owns (every lease call, charges, shadow calls) go out
// from Envoy's main thread: dispatched in a function given to the
// configuration's scheduler, answered on the main thread, handed to the
// engine under the owning worker's lock. When such an answer goes on with
// a request that waits for it (a lease call's), the engine asks the filter
// to run that on the request's worker (httpFilter.Run, through the
// stream's scheduler, which Envoy ignores once the stream is complete).
// Calls a request owns go out from its worker through the filter's handle. The engine's once-a-second tick
// is scheduled the same way, once for the process however many
// configurations Envoy keeps (tick.go): one goroutine only asks the
// scheduler of a live configuration, and the scheduled function reads the
// memory figures once (runtime/metrics, without stopping the world) and
// ticks each worker's Plugin of every live configuration under its lock.
// No goroutine of ours touches Envoy objects.
//
// Metrics are defined when Envoy loads the configuration and changed
// through Envoy's config-level metric calls, from whichever thread counts
// (metrics.go): a change on the main thread shows in /stats at once. The
// SDK snapshot does not wrap those calls; envoyabi.go declares them and
// envoyptr.go reads the configuration's Envoy pointer out of the SDK's
// handle, checked against the SDK's type (TestSDKHandleLayout).
//
// # Failures
//
// No callback lets a panic reach Envoy (which would abort): each recovers,
// counts it in tokenbucket.panics, fails the request open (as the engine
// fails a request open on any error), and replaces the worker's Plugin,
// whose state is unknown (the buckets, in the Store, survive: as Wasm's
// FAIL_RELOAD). Envoy refuses a configuration the engine refuses (its
// RefusalError, with the JSON path, in Envoy's log), one the host cannot
// run as Wasm does (engine.Options.FlatMetadata), and any configuration
// when Envoy's environment lacks GODEBUG=cgocheck=0 (without it Go's cgo
// pointer check aborts Envoy as the SDK hands Go pointers to Envoy). The
// configuration is parsed once (engine.Parse); every worker's Plugin is
// built from it.
package filter
