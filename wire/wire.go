// Package wire is the contract between the plugin and the limit service
// (limitd): what one decision may ask. Both sides import it, so a cluster
// rule that config.Parse accepts is one the service accepts, and no bound is
// written twice. It builds for wasip1; it reads bodies through the JSON
// reading layer it shares with package config (internal/jsonfield), so a
// field error reads alike from either.
package wire

import "time"

// Bounds of one bucket of a decision, and of one decision.
const (
	// MaxAmount bounds a bucket's tokens_per_second, burst and cost, keeping
	// every time and amount well inside float64's exact range.
	MaxAmount = 1e9
	// MaxFill bounds burst / tokens_per_second, the time an empty bucket
	// needs to refill: it bounds how long a stored bucket lives.
	MaxFill = 7 * 24 * time.Hour
	// MaxPeriod bounds a quota bucket's period (period_end_ms −
	// period_start_ms): a leap year and a day, room for a daylight-saving
	// hour. A quota's key lives to its period's end.
	MaxPeriod = 367 * 24 * time.Hour
	// MaxDelayMs bounds a bucket's max_delay_ms, the longest a request may
	// be held for its tokens (bucket.MaxWait).
	MaxDelayMs = 60_000
	// MaxBuckets is the most buckets one decision may carry: the most
	// cluster rules one plugin configuration may hold.
	MaxBuckets = 16
	// MaxKeyBytes is the longest bucket key (and hash tag), in bytes.
	MaxKeyBytes = 512
	// MaxAnswerBytes bounds the service's answer to one decision; the plugin
	// refuses a longer one as malformed without reading it.
	MaxAnswerBytes = 64 << 10
)
