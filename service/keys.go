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
//	prefix + "{" + tag + "}:" + key
//
// where tag is the request's hash tag, or, when the request has none, 16 hex
// digits of the 64-bit FNV-1a hash of the bucket's own key. Redis Cluster
// places a key by the text between its first "{" and the next "}", which is
// always tag: the prefix holds no brace and a hash tag may not either. A
// bucket's identity is therefore the pair (hash tag, key); the same key sent
// with another hash tag, or once with and once without, is another bucket.
func storageKey(prefix, tag, key string) string {
	var b strings.Builder
	if tag == "" {
		b.Grow(len(prefix) + 2*8 + 3 + len(key))
		b.WriteString(prefix)
		b.WriteByte('{')
		b.WriteString(defaultTag(key))
	} else {
		b.Grow(len(prefix) + len(tag) + 3 + len(key))
		b.WriteString(prefix)
		b.WriteByte('{')
		b.WriteString(tag)
	}
	b.WriteString("}:")
	b.WriteString(key)
	return b.String()
}

// defaultTag is the hash tag of a bucket sent without one: the hex FNV-1a
// hash of its key, so single-bucket requests spread evenly over a cluster
// whatever characters their keys hold.
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
