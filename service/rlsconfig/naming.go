package rlsconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultMaxKeyBytes is Naming's bound when MaxKeyBytes is 0: the service's
// default --max-key-bytes (wire.MaxKeyBytes, held equal by a test).
const DefaultMaxKeyBytes = 512

// MaxEntries bounds the entries of one descriptor (or one RLQS bucket_id).
const MaxEntries = 32

// hashHexBytes is the length of a name's hash: 128 bits in hex.
const hashHexBytes = 32

// Naming names the counters of descriptors in the store, the same for every
// front door that counts them (ShouldRateLimit and the quota service): a
// descriptor's bucket is one bucket whichever door takes from it. The zero
// value is the default (DefaultMaxKeyBytes, no window prefix). Names are
// functions of their inputs alone.
//
// Token buckets (BucketKey) are named unambiguously: each part is written
// with its length, so no value, whatever it holds, spells another
// descriptor's name. Fixed windows (WindowKey) keep envoyproxy/ratelimit's
// names, so both services can count one window in a shared Redis during a
// cut-over; they inherit its ambiguity ("_" joins the parts, so a value
// holding "_" can spell another descriptor's counter).
//
// A name longer than MaxKeyBytes, which only a request's values make so, is
// replaced by a hash (the first 128 bits of SHA-256 of the whole name, in
// hex), its domain kept where it fits: a request cannot store a key of its
// own size, and two long names share a counter only if their hashes collide.
type Naming struct {
	// MaxKeyBytes bounds a name (not counting WindowPrefix), in bytes
	// (0: DefaultMaxKeyBytes). Past it, the name is hashed.
	MaxKeyBytes int
	// WindowPrefix starts every fixed-window counter's name
	// (envoyproxy/ratelimit's CACHE_KEY_PREFIX).
	WindowPrefix string
}

func (n Naming) max() int {
	if n.MaxKeyBytes <= 0 {
		return DefaultMaxKeyBytes
	}
	return n.MaxKeyBytes
}

// BucketKey is the key of the token bucket of a descriptor of domain whose
// entries name it with values (one per entry; an entry without one is
// named by its own value): each part as its length in decimal, ":", and
// its bytes, "_" between parts, as in
//
//	4:apis_11:generic_key_4:slow
//
// Read from the left, each length says where its part ends, so one name has
// one reading. A name longer than MaxKeyBytes is "4:apis#" and 32 hex digits
// (or "#" and the digits when the domain does not fit): after a domain an
// unhashed name goes on with "_", so the two forms never meet. The store
// names it as any /v1/decide bucket of that key and limit (package service).
func (n Naming) BucketKey(domain string, entries []Entry, values []string) string {
	var b strings.Builder
	writePart(&b, domain)
	for i, e := range entries {
		b.WriteByte('_')
		writePart(&b, e.Key)
		b.WriteByte('_')
		writePart(&b, valueOf(entries, values, i))
	}
	name := b.String()
	if len(name) <= n.max() {
		return name
	}
	b.Reset()
	if len(strconv.Itoa(len(domain)))+1+len(domain)+1+hashHexBytes <= n.max() {
		writePart(&b, domain)
	}
	b.WriteByte('#')
	b.WriteString(hashHex(name))
	return b.String()
}

// WindowKey is the name of the fixed-window counter of a descriptor, as
// envoyproxy/ratelimit names it: WindowPrefix, "<domain>_<key1>_<value1>_"
// and so on, and the window's start in Unix seconds. When the part between
// the prefix and the start is longer than MaxKeyBytes, it is
// "<domain>_#<32 hex digits>_" instead: the names keep the ambiguity they
// inherit, and a value that spells a hashed one must hold its hash.
func (n Naming) WindowKey(domain string, entries []Entry, values []string, start int64) string {
	var b strings.Builder
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(valueOf(entries, values, i))
		b.WriteByte('_')
	}
	name := b.String()
	if len(name) > n.max() {
		name = domain + "_#" + hashHex(name) + "_"
	}
	return n.WindowPrefix + name + strconv.FormatInt(start, 10)
}

// Label is s bounded for a statistics label: s itself when it is valid
// UTF-8 of at most MaxKeyBytes bytes; else its longest valid head that
// leaves room, "#" and the 32 hex digits of the hash of s.
func (n Naming) Label(s string) string {
	if len(s) <= n.max() && utf8.ValidString(s) {
		return s
	}
	head := strings.ToValidUTF8(s, "\uFFFD")
	keep := max(0, n.max()-1-hashHexBytes)
	if len(head) > keep {
		head = head[:keep]
		for len(head) > 0 && !utf8.ValidString(head) {
			head = head[:len(head)-1]
		}
	}
	return head + "#" + hashHex(s)
}

// InvalidUTF8 is the stated form of a request's string that is not valid
// UTF-8 (which Envoy sends when a header holds such bytes): U+FFFD and the
// 32 hex digits of the hash of its bytes. Such a value matches no
// configured value (only a key alone or a wildcard matching anything), and
// is counted as a value of its own: two different byte strings get two
// different forms.
func InvalidUTF8(s string) string {
	return "\uFFFD" + hashHex(s)
}

// IsInvalidUTF8 reports whether s has InvalidUTF8's form: what a door
// decoded from a string that was not UTF-8 (or a client wrote that way).
func IsInvalidUTF8(s string) bool {
	h, ok := strings.CutPrefix(s, "\uFFFD")
	if !ok || len(h) != hashHexBytes {
		return false
	}
	for i := range len(h) {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func valueOf(entries []Entry, values []string, i int) string {
	if i < len(values) {
		return values[i]
	}
	return entries[i].Value
}

func writePart(b *strings.Builder, s string) {
	b.WriteString(strconv.Itoa(len(s)))
	b.WriteByte(':')
	b.WriteString(s)
}

func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:hashHexBytes/2])
}
