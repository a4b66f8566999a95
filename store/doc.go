// Package store keeps token buckets in proxy-wasm shared data, bounded in
// memory and exact under concurrency.
//
// # Model
//
// Shared data is one process-wide key/value map, shared by every Envoy worker
// (each worker runs its own Wasm VM), with compare-and-swap writes and neither
// delete nor expiry: every key ever written stays for the life of the process.
// A Table therefore never creates a key per client. It owns a fixed set of
// Groups shared-data keys ("<prefix><index>"), each holding SlotsPerGroup
// slots of RecordLen bytes. A bucket identity (a 64-bit hash of the rule and
// the client's key values) lives in group hash % Groups, in the slot whose
// fingerprint equals the hash. Host memory is bounded by Groups, whatever the
// number of distinct clients: about Groups × (GroupLen + key and map overhead).
//
// # Reclaiming and eviction
//
// Each slot records the moment its bucket is full again (FullAt). A full
// bucket is indistinguishable from a new one, so a slot whose FullAt has
// passed is reused without changing any decision. When every slot of the
// group holds a bucket that is not yet full, the one closest to full (smallest
// FullAt) among those not in debt is evicted: its client's next request
// starts from a full bucket, so the error is at most the tokens that bucket
// had yet to refill, less than one burst. A bucket in debt (left below zero
// by a cost known from the response) is evicted only when every bucket of
// its group is in debt, and then forgives less than two bursts. A bucket's
// group is its identity mixed with a seed drawn once per Envoy process
// (seed.go), so a client cannot choose keys that share a group with its own
// bucket: to fill that group with debt it must fill most of the table.
// Evictions are counted in Outcome.
//
// # Exactness
//
// A decision reads each bucket's group, decides, and writes the group back
// with the CAS the read returned; a write that loses a race re-reads and
// decides again, up to MaxAttempts times per bucket, after which the decision
// fails with ErrContention and leaves every bucket unchanged. A missing group
// key is created with the CAS of a value this Table read earlier (see
// docs/RATIONALE.md): Envoy's CAS counter is process-wide, so if another
// worker created the key after that read the write fails with a CAS mismatch
// instead of silently overwriting it. Nothing is written at start-up.
//
// Several buckets (stacked rules) are decided together: if any rejects,
// nothing is written; if a write fails and the re-read decision rejects, the
// buckets already written are refunded. Either all consume or none keeps a
// consumed token.
//
// A Table is used by one VM (one Envoy worker) and is not safe for concurrent
// use; the VMs share state only through SharedData.
package store
