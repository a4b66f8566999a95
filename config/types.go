package config

import (
	"regexp"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// Config is a parsed, validated plugin configuration. Build one with Parse;
// the zero value is not useful. A Config is immutable after Parse and safe for
// concurrent reads.
type Config struct {
	// Rules in the order they are evaluated.
	Rules []Rule
	// XFFNumTrustedHops is how many proxies in front of Envoy append to
	// X-Forwarded-For. 0 (the default) ignores the header for ip:address.
	XFFNumTrustedHops int
	// TrustUnverifiedJWT lets jwt:<claim> read the payload of a bearer token
	// that no jwt_authn filter verified. Default false.
	TrustUnverifiedJWT bool
	// JWTMetadataNamespace and JWTPayloadKey locate the claims jwt_authn wrote
	// with payload_in_metadata (defaults "envoy.filters.http.jwt_authn" and
	// "jwt_payload").
	JWTMetadataNamespace string
	JWTPayloadKey        string
	// Headers selects which RateLimit response headers are sent.
	Headers HeaderStyle
	// MaxKeys bounds the number of local buckets kept in shared data.
	MaxKeys int
	// Service is the top-level default limit service for cluster rules (nil
	// when none is configured).
	Service *Service
}

// Rule is one entry of "rules".
type Rule struct {
	Name      string
	Action    Action   // limit (default) or allow
	Mode      Mode     // enforce or shadow (default: top-level "mode", else enforce)
	Group     string   // tier group: among rules sharing a non-empty group only the first that applies counts (see the package doc)
	LimitKeys []Source // composite identity; empty means one bucket for every matching request
	Match     []Condition
	// MissingKey says what happens when a request has no value for one of the
	// rule's limit keys.
	MissingKey MissingKey
	Limit      Limit
	Cost       Cost
	// ChargeOn is the response statuses whose requests keep their cost;
	// the others are refunded. The zero value (charge_on absent) holds
	// every status.
	ChargeOn StatusSet
	// Response to a rejection.
	Status          int
	Body            string       // empty: the default JSON body
	ResponseHeaders []HeaderPair // extra headers on a rejection
	// Scope is local (shared data in this Envoy) or cluster (the limit service).
	Scope   Scope
	Service *Service // for cluster scope: the rule's own, or the top-level one
	// Sync is how a cluster rule reaches the limit service: one decision per
	// request, or leases of tokens spent locally. Lease is its tuning.
	Sync  Sync
	Lease Lease

	// Algorithm is token_bucket (Limit, Cost), concurrency (Concurrency,
	// with Limit a bucket that never refills: Burst is max_in_flight) or
	// quota (Limit with its Calendar, Cost).
	Algorithm   Algorithm
	Concurrency Concurrency
}

// Lease tunes a cluster rule with sync "lease".
type Lease struct {
	TTLMS    int     // how long leased tokens stay after the last grant
	MaxShare float64 // the largest fraction of the burst one lease holds
}

// Limit is a token bucket's parameters, or a quota's: with Calendar set
// (algorithm "quota"), Burst is the limit one period holds and
// TokensPerSecond is 0.
type Limit struct {
	TokensPerSecond float64
	Burst           float64
	// Calendar is a quota's period; its zero value (no Period) for a token
	// bucket.
	Calendar calendar.Spec
	// MaxDelayMS is how long a request short of tokens may be held until
	// its tokens are there (bucket.Reserve): 0 refuses it at once.
	MaxDelayMS int
	// MaxWaiting caps the requests this rule holds at once per worker or
	// VM; past it a request that would wait is refused at once. 0 when
	// MaxDelayMS is 0.
	MaxWaiting int
}

// Quota reports whether l is a quota (algorithm "quota").
func (l Limit) Quota() bool { return l.Calendar.Period != 0 }

// Cost says how many tokens a request takes.
type Cost struct {
	// Source is SourceFixed, SourceHeader or SourceQuery (the cost is known
	// at request time), or SourceResponseHeader or SourceResponseJSON (it is
	// known from the response: the request reserves Default, and the
	// bucket is charged the difference when the cost is known).
	Source  Source
	Fixed   float64
	Default float64
	// Truncated is what a SourceResponseJSON response costs when its cost
	// cannot be read for a reason the client controls: the body was cut
	// short (the client went away, the stream was reset) or arrived
	// encoded. Default: the burst. 0 for the other sources.
	Truncated float64
	// MaxBodyBytes bounds the response body read for SourceResponseJSON
	// (a JSON body, or one event of a text/event-stream); 0 for the other
	// sources.
	MaxBodyBytes int
	// Money is the rule's price table (nil: the cost is in the rule's own
	// units). With it, Source is SourceResponseJSON with no Name (the
	// paths are Money.Terms'), and the rule counts micro-units (MicroUnits).
	Money *Money
}

// FromResponse reports whether the cost is known only from the response.
func (c Cost) FromResponse() bool {
	return c.Source.Kind == SourceResponseHeader || c.Source.Kind == SourceResponseJSON
}

// StatusSet is a set of HTTP response statuses: whole classes (2xx) and
// exact codes. The zero value, with Listed false, holds every status.
type StatusSet struct {
	// Listed is true when the set was given (charge_on present).
	Listed bool
	// Classes has bit n set (1 to 5) when every status nxx is in the set.
	Classes uint8
	// Codes are the exact statuses in the set, in the order given.
	Codes []int
}

// Has reports whether status is in the set.
func (s StatusSet) Has(status int) bool {
	if !s.Listed {
		return true
	}
	if c := status / 100; c >= 1 && c <= 5 && s.Classes&(1<<c) != 0 {
		return true
	}
	for _, code := range s.Codes {
		if code == status {
			return true
		}
	}
	return false
}

// SourceKind names where a value comes from.
type SourceKind int

const (
	SourceFixed SourceKind = iota // only for cost_source
	SourceHeader
	SourceQuery
	SourceIP
	SourcePath
	SourceMethod
	SourceAuthority
	SourceJWT
	SourceCookie
	SourceResponseHeader // only for cost_source: a response header
	SourceResponseJSON   // only for cost_source: a JSON path into the response body
	SourceRequestJSON    // a JSON path into the request body (limit keys, match, prices)
)

// Source is a parsed "kind:name" reference such as header:x-api-key.
// Name is lower-cased for headers; for jwt it is the dotted claim path.
type Source struct {
	Kind SourceKind
	Name string
}

// Condition is one entry of a rule's "match" object. All set operators must
// hold for the condition to hold.
type Condition struct {
	Source  Source
	Present *bool          // "present": true/false
	Equals  *string        // "equals"
	In      []string       // "in"
	Prefix  *string        // "prefix"
	Regex   *regexp.Regexp // "regex", compiled at load
	// RegexMaxInput is the most bytes of a value Regex reads (see
	// RegexBudget); a longer value does not match.
	RegexMaxInput int
}

// HeaderPair is one extra response header.
type HeaderPair struct{ Name, Value string }

// Service locates the limit service through an Envoy cluster.
type Service struct {
	Cluster    string
	Authority  string
	Path       string // default /v1/decide
	LeasePath  string // default /v1/lease
	ChargePath string // default /v1/charge: costs known from the response
	TimeoutMS  int    // default 25
	// LeaseTimeoutMS ("lease_timeout_ms") is the timeout of a lease call
	// (rules with sync "lease"): at least TimeoutMS; default
	// max(DefaultLeaseTimeoutMS, TimeoutMS).
	LeaseTimeoutMS int
	FailureMode    FailureMode
	Token          string // bearer token ("token"; empty when none)
	// KeySecret ("key_secret", at least MinKeySecretBytes; empty when none)
	// keys the hash that names a cluster bucket: HMAC-SHA256 of its values,
	// so a bucket's key cannot be computed from a header value without it.
	KeySecret string
}

type (
	Action      int
	Mode        int
	MissingKey  int
	Scope       int
	Sync        int
	FailureMode int
	HeaderStyle int
)

const (
	ActionLimit Action = iota
	ActionAllow
)

const (
	ModeEnforce Mode = iota
	ModeShadow
)

const (
	MissingSkip MissingKey = iota
	MissingShared
	MissingDeny
)

const (
	ScopeLocal Scope = iota
	ScopeCluster
)

const (
	SyncPerRequest Sync = iota
	SyncLease
)

const (
	FailAllow FailureMode = iota
	FailDeny
)

const (
	HeadersBoth HeaderStyle = iota
	HeadersDraft
	HeadersLegacy
	HeadersNone
)
