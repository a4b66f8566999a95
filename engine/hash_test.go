package engine

import (
	"errors"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// collidingTenants are two x-tenant values whose bucket identities were
// equal for the rule "tenant" keyed by header:x-tenant while identities
// were an unkeyed 64-bit FNV-1a (found by go run ./engine/testdata/fnvcollide,
// a collision search of about 2^32 hash evaluations).
var collidingTenants = [2]string{"d724587ea44fa925", "eb2cf905e30c6b1d"}

const tenantRule = `{"rules": [{"name": "tenant", "limit_keys": ["header:x-tenant"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

// TestCollidingKeysKeepTheirBuckets: two key values crafted to collide
// under an unkeyed identity each have their own bucket: the second tenant's
// request is not refused by the first's spent token.
func TestCollidingKeysKeepTheirBuckets(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, tenantRule)
	for i, v := range collidingTenants {
		s := newFakeStream("x-tenant", v)
		if a := p.NewRequest(s).OnRequestHeaders(); a != Continue || s.replied != 0 {
			t.Fatalf("tenant %d (%s): action %v, replied %d; want its own bucket's token", i, v, a, s.replied)
		}
	}
	s := newFakeStream("x-tenant", collidingTenants[0])
	if p.NewRequest(s).OnRequestHeaders(); s.replied != 429 {
		t.Fatalf("tenant 0 again: replied %d, want 429 (its bucket is spent)", s.replied)
	}
}

// BenchmarkIdentity is a local bucket's identity per request: one rule
// keyed by a header of 16 bytes, and one by two values (an API key of 36
// bytes and a path of 24), the values already read.
func BenchmarkIdentity(b *testing.B) {
	for _, bc := range []struct {
		name, cfg string
		values    []string
	}{
		{"one key", tenantRule, []string{"d724587ea44fa925"}},
		{"two keys", `{"rules": [{"name": "api", "limit_keys": ["header:x-api-key", "path"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`, []string{"4f1c2b9e-7d3a-4e6b-9a1f-2c8d5e7b3a10", "/v1/chat/completions/abc"}},
		// For comparison: a cluster rule's bucket name keyed by HMAC-SHA256
		// (key_secret), with its local identity.
		{"cluster key_secret", `{"service": {"cluster": "limitd", "key_secret": "0123456789abcdef0123456789abcdef"}, "rules": [{"name": "tenant",
  "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`, []string{"d724587ea44fa925"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := newPlugin(b, newFakeHost(), bc.cfg)
			ru := p.rules[0]
			r := &requestValues{}
			for i, k := range ru.LimitKeys {
				r.values = append(r.values, cachedValue{k, bc.values[i], true})
			}
			b.ReportAllocs()
			var sink uint64
			for b.Loop() {
				id, _, _ := identity(ru, r)
				sink ^= id
			}
			if sink == 1 {
				b.Log(sink)
			}
		})
	}
}

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

// TestIdentityKey: every worker of a process (one shared data) computes
// the same identities, another process others; with a key_secret, every
// process the same.
func TestIdentityKey(t *testing.T) {
	secret := `{"service": {"cluster": "limitd", "key_secret": "0123456789abcdef0123456789abcdef"}, ` + tenantRule[1:]
	id := func(p *Plugin) uint64 {
		r := &requestValues{values: []cachedValue{{p.rules[0].LimitKeys[0], collidingTenants[0], true}}}
		v, _, _ := identity(p.rules[0], r)
		return v
	}
	h, other := newFakeHost(), newFakeHost()
	a, b, c := newPlugin(t, h, tenantRule), newPlugin(t, h, tenantRule), newPlugin(t, other, tenantRule)
	if id(a) != id(b) {
		t.Errorf("two workers of one process: %#x and %#x", id(a), id(b))
	}
	if id(a) == id(c) {
		t.Errorf("two processes share identity %#x without a key_secret", id(a))
	}
	if v, _, err := h.sd.Get(IdentityKeyKey); err != nil || len(v) != 16 {
		t.Errorf("shared data %s: %d bytes, %v; want 16", IdentityKeyKey, len(v), err)
	}
	if x, y := id(newPlugin(t, h, secret)), id(newPlugin(t, other, secret)); x != y || x == id(a) {
		t.Errorf("with a key_secret: %#x and %#x in two processes (%#x without)", x, y, id(a))
	}
}

// unavailable is shared data that fails every call while down.
type unavailable struct {
	slots.SharedData
	down bool
}

func (u *unavailable) Get(key string) ([]byte, uint32, error) {
	if u.down {
		return nil, 0, errors.New("host: unavailable")
	}
	return u.SharedData.Get(key)
}

func (u *unavailable) Set(key string, value []byte, cas uint32) error {
	if u.down {
		return errors.New("host: unavailable")
	}
	return u.SharedData.Set(key, value, cas)
}

// TestIdentityKeyUnavailable: while the identity key cannot be read, a
// local rule fails open (counted); once shared data answers, the rule
// limits again.
func TestIdentityKeyUnavailable(t *testing.T) {
	h := newFakeHost()
	sd := &unavailable{SharedData: h.sd, down: true}
	h.sd = sd
	p := newPlugin(t, h, tenantRule)
	for range 2 {
		s := newFakeStream("x-tenant", "a")
		if a := p.NewRequest(s).OnRequestHeaders(); a != Continue || s.replied != 0 {
			t.Fatalf("key unavailable: replied %d, want the request to go on", s.replied)
		}
	}
	if n := h.count("rule.tenant.failed_open"); n != 2 {
		t.Fatalf("failed_open = %d, want 2", n)
	}
	sd.down = false
	for i, want := range []int{0, 429} {
		s := newFakeStream("x-tenant", "a")
		if p.NewRequest(s).OnRequestHeaders(); s.replied != want {
			t.Fatalf("request %d after shared data is back: replied %d, want %d", i, s.replied, want)
		}
	}
}
