// Package store keeps token buckets in proxy-wasm shared data, bounded in
// memory and exact under concurrency.
//
// # Model
//
// A Table is a bounded table of package slots (shared-data keys of four
// slots, placed by a per-process seed, exact creation, bounded CAS loops),
// whose record is a bucket: its bucket.State and the moment it is full again
// (FullAt). A bucket identity is a 64-bit hash of the rule and the client's
// key values; host memory is bounded by Groups whatever the number of
// distinct clients.
//
// # Reclaiming and eviction
//
// A full bucket is indistinguishable from a new one, so a slot whose FullAt
// has passed is reused without changing any decision. When every slot of
// the group holds a bucket that is not yet full, the one closest to full
// (smallest FullAt) among those not in debt is evicted: its client's next
// request starts from a full bucket, so the error is at most the tokens that
// bucket had yet to refill, less than one burst. A bucket in debt (left
// below zero by a cost known from the response) is evicted only when every
// bucket of its group is in debt, and then forgives less than two bursts;
// since groups are placed by a seed no client knows, to fill its own group
// with debt a client must fill most of the table. Evictions are counted in
// Outcome.
//
// # Exactness
//
// A decision reads each bucket's group, decides, and writes the group back
// with the CAS the read returned; a write that loses a race re-reads and
// decides again, up to slots.MaxAttempts times per bucket, after which the
// decision fails with slots.ErrContention and leaves every bucket unchanged.
//
// Several buckets (stacked rules) are decided together: if any rejects,
// nothing is written; if a write fails and the re-read decision rejects, the
// buckets already written are refunded. Either all consume or none keeps a
// consumed token.
//
// A Table is used by one VM (one Envoy worker) and is not safe for concurrent
// use; the VMs share state only through SharedData.
package store
