package engine

import "testing"

// TestIDHashVectors: idHash is SipHash-2-4: the reference vectors (key 00
// 01 … 0f, message 00 01 … of each length), however the message is cut.
func TestIDHashVectors(t *testing.T) {
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	msg := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	for n, want := range map[int]uint64{
		0: 0x726fdb47dd0e0e31, 1: 0x74f839c593dc67fd, 2: 0x0d6c8009d9a94f5a, 3: 0x85676696d7fb7e2d,
		4: 0xcf2794e0277187b7, 8: 0x93f5f5799a932462, 15: 0xa129ca6149be45e5,
	} {
		for cut := 0; cut <= n; cut++ {
			h := newIDHash(k0, k1)
			for _, b := range msg[:cut] {
				h.byte(b)
			}
			write(&h, msg[cut:n])
			if got := h.sum(); got != want {
				t.Errorf("%d bytes cut at %d: %#x, want %#x", n, cut, got, want)
			}
		}
	}
	// Word at a time or byte at a time, however a longer message is cut.
	long := make([]byte, 100)
	for i := range long {
		long[i] = byte(i*131 + 7)
	}
	bytewise := newIDHash(k0, k1)
	for _, b := range long {
		bytewise.byte(b)
	}
	for a := 0; a <= len(long); a += 3 {
		for b := a; b <= len(long); b += 5 {
			h := newIDHash(k0, k1)
			write(&h, long[:a])
			write(&h, string(long[a:b]))
			write(&h, long[b:])
			if h.sum() != bytewise.sum() {
				t.Fatalf("cut at %d and %d: %#x, byte at a time %#x", a, b, h.sum(), bytewise.sum())
			}
		}
	}
}
