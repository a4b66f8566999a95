package service

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// The contract's types, shared with the plugin through package wire.
type (
	// Bucket is one token bucket of a decision (wire.Bucket).
	Bucket = wire.Bucket
	// Request is one decision over one or more buckets, taken atomically
	// (wire.Request).
	Request = wire.Request
	// Limits bound what a call may ask (wire.Limits).
	Limits = wire.Limits
	// ValidationError is a call the service refuses; Field names the
	// offending part of the JSON body (wire.FieldError).
	ValidationError = wire.FieldError
	// LeaseBucket and LeaseRequest are one lease call (wire.LeaseRequest).
	LeaseBucket  = wire.LeaseBucket
	LeaseRequest = wire.LeaseRequest
	// ChargeBucket and ChargeRequest are one charge call (wire.ChargeRequest).
	ChargeBucket  = wire.ChargeBucket
	ChargeRequest = wire.ChargeRequest
)

// Defaults of Limits, and the bound on rates, bursts and costs: the wire
// contract's, which the plugin's configuration parser checks cluster rules
// against.
const (
	DefaultMaxBodyBytes = wire.DefaultMaxBodyBytes
	DefaultMaxKeyBytes  = wire.MaxKeyBytes
	DefaultMaxBuckets   = wire.MaxBuckets
	DefaultMaxFill      = wire.MaxFill
	MaxAmount           = wire.MaxAmount
)

// DecodeRequest parses and validates a JSON body of POST /v1/decide
// (wire.DecodeRequest).
func DecodeRequest(body []byte, lim Limits) (*Request, error) { return wire.DecodeRequest(body, lim) }

// DefaultLedgerWindow is the default ledger window of the stores: what a
// lease grants or a decision reserves can be given back (by a lease's return,
// or a charge's refund) for at least one window and at most two.
const DefaultLedgerWindow = time.Minute
