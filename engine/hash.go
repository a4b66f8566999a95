package engine

// hasher builds a bucket identity: a 64-bit FNV-1a hash over a
// length-prefixed encoding of the rule name, the limit-key sources and their
// values, so that ("a|b") with one key can never equal ("a", "b") with two.
// The hash is the same in every worker (no per-process seed).
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
// depends on every input bit (the table uses it modulo its size).
func (h hasher) sum() uint64 { return mix(uint64(h)) }

// mix is the splitmix64 finaliser.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
