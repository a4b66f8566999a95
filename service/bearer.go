package service

import (
	"crypto/sha256"
	"crypto/subtle"
)

// BearerTokens are the bearer tokens of limitd's callers, kept as their
// SHA-256, so that both front doors (the HTTP API and the gRPC rate limit
// service) check a call's token the same way. The zero value holds none.
type BearerTokens struct {
	sums [][sha256.Size]byte
}

// Add adds the token value; its index is the number of tokens added before.
func (b *BearerTokens) Add(value string) {
	b.sums = append(b.sums, sha256.Sum256([]byte(value)))
}

// Len is the number of tokens.
func (b *BearerTokens) Len() int { return len(b.sums) }

// Match returns the index of the token that authorization (an
// Authorization value, "Bearer <token>" with the scheme in any case)
// carries, or -1. Every token is compared, in constant time, so the time
// taken does not say which one matched.
func (b *BearerTokens) Match(authorization string) int {
	const scheme = "bearer "
	if len(authorization) <= len(scheme) || !equalFoldASCII(authorization[:len(scheme)], scheme) {
		return -1
	}
	sum := sha256.Sum256([]byte(authorization[len(scheme):]))
	match := -1
	for i := range b.sums {
		if subtle.ConstantTimeCompare(sum[:], b.sums[i][:]) == 1 {
			match = i
		}
	}
	return match
}
