package service

import (
	"encoding/hex"
	"hash/fnv"
	"strings"
)

// DefaultKeyPrefix starts every key the service stores.
const DefaultKeyPrefix = "rl:"

// numSlots is the number of Redis Cluster hash slots.
const numSlots = 16384

// storageKey is the name under which a bucket is stored:
//
//	prefix + "{" + tag + "}:" + rate + "/" + burst + ":" + key
//
// where tag is 16 hex digits of the 64-bit FNV-1a hash of the bucket's own
// key, and rate and burst its limit as the wire carries them (shortest
// decimal form). Redis Cluster places a key by the text between its first "{"
// and the next "}", which is always tag (the prefix holds no brace), so a
// bucket's slot depends on its key alone: never on which other buckets a
// request carries, nor on a hash tag it sends (which the service ignores).
//
// A bucket's identity is the triple (key, rate, burst): its limit is fixed
// when it is created. A call that names another limit for the same key
// addresses another bucket, so no caller can refill (by claiming a faster
// rate) or deepen (by claiming a larger burst) a bucket whose limit it does
// not share; and a rule whose limit changes starts a new, full bucket while
// the old one expires.
func storageKey(prefix, key string, rate, burst float64) string {
	r, b := formatFloat(rate), formatFloat(burst)
	var sb strings.Builder
	sb.Grow(len(prefix) + 2*8 + 4 + len(r) + len(b) + len(key))
	sb.WriteString(prefix)
	sb.WriteByte('{')
	sb.WriteString(defaultTag(key))
	sb.WriteString("}:")
	sb.WriteString(r)
	sb.WriteByte('/')
	sb.WriteString(b)
	sb.WriteByte(':')
	sb.WriteString(key)
	return sb.String()
}

// defaultTag is the hash tag of a bucket: the hex FNV-1a hash of its key, so
// buckets spread evenly over a cluster whatever characters their keys hold.
func defaultTag(key string) string {
	h := fnv.New64a()
	h.Write([]byte(key))
	var sum [8]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// keySlot is the Redis Cluster hash slot of a key: CRC16 (XMODEM) of its hash
// tag (the text between the first "{" and the next "}", when non-empty), or
// of the whole key, modulo 16384.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key) % numSlots)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
