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
		prefix, key string
		rate, burst float64
		want        string
	}{
		{"rl:", "rule:a", 10, 50, "rl:{" + defaultTag("rule:a") + "}:10/50:rule:a"},
		{"rl:", "rule:a", 0.5, 1e9, "rl:{" + defaultTag("rule:a") + "}:0.5/1000000000:rule:a"},
		{"x:", "k{with}braces", 1, 1, "x:{" + defaultTag("k{with}braces") + "}:1/1:k{with}braces"},
	}
	for _, tt := range tests {
		if got := storageKey(tt.prefix, tt.key, tt.rate, tt.burst); got != tt.want {
			t.Errorf("storageKey(%q, %q, %v, %v) = %q, want %q", tt.prefix, tt.key, tt.rate, tt.burst, got, tt.want)
		}
	}
	if tag := defaultTag("rule:a"); len(tag) != 16 {
		t.Errorf("defaultTag = %q, want 16 hex digits", tag)
	}
	// A bucket's slot depends on its key alone, not on its limit.
	if keySlot(storageKey("rl:", "a", 1, 2)) != keySlot(storageKey("rl:", "a", 3, 4)) {
		t.Error("one key under two limits falls in different slots")
	}
}
