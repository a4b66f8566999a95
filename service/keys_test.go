package service

import "testing"

func TestCRC16(t *testing.T) {
	// The check value of CRC-16/XMODEM, as in the Redis Cluster specification.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestKeySlot(t *testing.T) {
	tests := []struct {
		key  string
		want int
	}{
		{"foo", 12182}, // CLUSTER KEYSLOT foo
		{"bar", 5061},
		{"{foo}bar", 12182},
		{"rl:{foo}:anything", 12182},
		{"{}foo", int(crc16("{}foo") % numSlots)}, // empty tag: the whole key
		{"a{b", int(crc16("a{b") % numSlots)},
	}
	for _, tt := range tests {
		if got := keySlot(tt.key); got != tt.want {
			t.Errorf("keySlot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestStorageKey(t *testing.T) {
	tests := []struct {
		prefix, tag, key, want string
	}{
		{"rl:", "tenant-1", "rule:a", "rl:{tenant-1}:rule:a"},
		{"rl:", "", "rule:a", "rl:{" + defaultTag("rule:a") + "}:rule:a"},
		{"x:", "", "k{with}braces", "x:{" + defaultTag("k{with}braces") + "}:k{with}braces"},
	}
	for _, tt := range tests {
		if got := storageKey(tt.prefix, tt.tag, tt.key); got != tt.want {
			t.Errorf("storageKey(%q, %q, %q) = %q, want %q", tt.prefix, tt.tag, tt.key, got, tt.want)
		}
	}
	if tag := defaultTag("rule:a"); len(tag) != 16 {
		t.Errorf("defaultTag = %q, want 16 hex digits", tag)
	}
	// Buckets with one explicit tag share a slot whatever their keys.
	if keySlot(storageKey("rl:", "t", "a")) != keySlot(storageKey("rl:", "t", "zzz{x}")) {
		t.Error("keys with one hash tag fall in different slots")
	}
}
