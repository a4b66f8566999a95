package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// Bucket identities. A local bucket (and a cluster rule's lease) is found
// in shared data by a 64-bit identity of the rule name, its limit-key
// sources and the request's values, each length-prefixed, so that ("a|b")
// with one key can never equal ("a", "b") with two. Two values with the
// same identity share a bucket, so the identity is keyed (idHash: SipHash-2-4
// under a 128-bit secret): without the secret no client can compute
// identities, hence cannot craft a value whose bucket is another tenant's.
// The secret is the process's (identityKey), shared by every worker, so
// every worker finds the same buckets. A cluster bucket's name in the limit
// service (clusterKey) is the same in every Envoy: it is hashed unkeyed
// (hasher) unless the service has a key_secret (keyMAC).

// IdentityKeyKey holds the process's identity secret in shared data: 16
// random bytes created once (slots.LoadSecret), shared by every worker and
// configuration, unless the configuration has a key_secret.
const IdentityKeyKey = Name + ":identity-key"

// identityKey is the 128-bit key of a configuration's identities: derived
// from the service's key_secret when it has one (HMAC-SHA256 of a fixed
// label, so the key is not the secret itself), else the process's secret
// in shared data.
func identityKey(sd SharedData, keySecret string) (k0, k1 uint64, err error) {
	var b []byte
	if keySecret != "" {
		mac := hmac.New(sha256.New, []byte(keySecret))
		mac.Write([]byte(Name + " local bucket identity"))
		b = mac.Sum(nil)
	} else if b, err = slots.LoadSecret(sd, IdentityKeyKey, 16); err != nil {
		return 0, 0, err
	}
	return binary.LittleEndian.Uint64(b[0:8]), binary.LittleEndian.Uint64(b[8:16]), nil
}

// idHash is SipHash-2-4 (Aumasson and Bernstein, 2012), written to as a
// stream: a keyed pseudorandom function of 64 bits, about as fast as FNV
// on short inputs. The zero idHash is not keyed: start with newIDHash.
type idHash struct {
	v0, v1, v2, v3 uint64
	m              uint64 // the bytes of the current word so far, little-endian
	n              uint64 // bytes written
}

func newIDHash(k0, k1 uint64) idHash {
	return idHash{
		v0: k0 ^ 0x736f6d6570736575,
		v1: k1 ^ 0x646f72616e646f6d,
		v2: k0 ^ 0x6c7967656e657261,
		v3: k1 ^ 0x7465646279746573,
	}
}

// sipRound is SipHash's round.
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13) ^ v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16) ^ v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21) ^ v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17) ^ v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// write adds the bytes of p, compressing each whole word (two rounds).
func write[T ~string | ~[]byte](h *idHash, p T) {
	v0, v1, v2, v3, m, n := h.v0, h.v1, h.v2, h.v3, h.m, h.n
	i := 0
	// Eight bytes at a time: the word is what m holds (k bytes) and the
	// first 8 − k bytes read; the other k are held for the next.
	for k := 8 * (n & 7); i+8 <= len(p); i += 8 {
		w := uint64(p[i]) | uint64(p[i+1])<<8 | uint64(p[i+2])<<16 | uint64(p[i+3])<<24 |
			uint64(p[i+4])<<32 | uint64(p[i+5])<<40 | uint64(p[i+6])<<48 | uint64(p[i+7])<<56
		word := m | w<<k
		v3 ^= word
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= word
		m = w >> (64 - k) // 0 when k is 0
		n += 8
	}
	for ; i < len(p); i++ {
		m |= uint64(p[i]) << (8 * (n & 7))
		n++
		if n&7 == 0 {
			v3 ^= m
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
			v0 ^= m
			m = 0
		}
	}
	h.v0, h.v1, h.v2, h.v3, h.m, h.n = v0, v1, v2, v3, m, n
}

func (h *idHash) byte(b byte) {
	p := [1]byte{b}
	write(h, p[:])
}

func (h *idHash) uvarint(n int) {
	var b [binary.MaxVarintLen64]byte
	write(h, b[:binary.PutUvarint(b[:], uint64(n))])
}

// field adds one length-prefixed field.
func (h *idHash) field(s string) {
	h.uvarint(len(s))
	write(h, s)
}

// sum is the hash of what was written (the last word holds the length
// modulo 256 in its top byte; four rounds finish it); h is left as it was.
func (h *idHash) sum() uint64 {
	v0, v1, v2, v3 := h.v0, h.v1, h.v2, h.v3
	m := h.m | h.n<<56
	v3 ^= m
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= m
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

// hasher is a 64-bit FNV-1a hash over the same length-prefixed encoding,
// unkeyed: it names cluster buckets without a key_secret (clusterKey),
// which every Envoy must compute alike.
type hasher uint64

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func newHasher() hasher { return fnvOffset }

func (h hasher) byte(b byte) hasher { return (h ^ hasher(b)) * fnvPrime }

func (h hasher) uvarint(n int) hasher {
	for n >= 0x80 {
		h = h.byte(byte(n) | 0x80)
		n >>= 7
	}
	return h.byte(byte(n))
}

// field adds one length-prefixed field.
func (h hasher) field(s string) hasher {
	h = h.uvarint(len(s))
	for i := 0; i < len(s); i++ {
		h = h.byte(s[i])
	}
	return h
}

// sum finishes the hash with a strong mix, so every bit of the result
// depends on every input bit.
func (h hasher) sum() uint64 { return mix(uint64(h)) }

// mix is the splitmix64 finaliser.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
