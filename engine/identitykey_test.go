package engine_test

import (
	"errors"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
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
	h := fakehost.New()
	p := newPlugin(t, h, tenantRule)
	for i, v := range collidingTenants {
		s := newStream("x-tenant", v)
		if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Continue || s.Replied != 0 {
			t.Fatalf("tenant %d (%s): action %v, replied %d; want its own bucket's token", i, v, a, s.Replied)
		}
	}
	s := newStream("x-tenant", collidingTenants[0])
	if p.NewRequest(s).OnRequestHeaders(); s.Replied != 429 {
		t.Fatalf("tenant 0 again: replied %d, want 429 (its bucket is spent)", s.Replied)
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
			p := newPlugin(b, fakehost.New(), bc.cfg)
			identity := engine.IdentityOf(p, bc.values...)
			b.ReportAllocs()
			var sink uint64
			for b.Loop() {
				sink ^= identity()
			}
			if sink == 1 {
				b.Log(sink)
			}
		})
	}
}

// TestIdentityKey: every worker of a process (one shared data) computes
// the same identities, another process others; with a key_secret, every
// process the same.
func TestIdentityKey(t *testing.T) {
	secret := `{"service": {"cluster": "limitd", "key_secret": "0123456789abcdef0123456789abcdef"}, ` + tenantRule[1:]
	id := func(p *engine.Plugin) uint64 { return engine.IdentityOf(p, collidingTenants[0])() }
	h, other := fakehost.New(), fakehost.New()
	a, b, c := newPlugin(t, h, tenantRule), newPlugin(t, h, tenantRule), newPlugin(t, other, tenantRule)
	if id(a) != id(b) {
		t.Errorf("two workers of one process: %#x and %#x", id(a), id(b))
	}
	if id(a) == id(c) {
		t.Errorf("two processes share identity %#x without a key_secret", id(a))
	}
	if v, _, err := h.SD.Get(engine.IdentityKeyKey); err != nil || len(v) != 16 {
		t.Errorf("shared data %s: %d bytes, %v; want 16", engine.IdentityKeyKey, len(v), err)
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
	h := fakehost.New()
	sd := &unavailable{SharedData: h.SD, down: true}
	h.SD = sd
	p := newPlugin(t, h, tenantRule)
	for range 2 {
		s := newStream("x-tenant", "a")
		if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Continue || s.Replied != 0 {
			t.Fatalf("key unavailable: replied %d, want the request to go on", s.Replied)
		}
	}
	if n := h.Count("rule.tenant.failed_open"); n != 2 {
		t.Fatalf("failed_open = %d, want 2", n)
	}
	sd.down = false
	for i, want := range []int{0, 429} {
		s := newStream("x-tenant", "a")
		if p.NewRequest(s).OnRequestHeaders(); s.Replied != want {
			t.Fatalf("request %d after shared data is back: replied %d, want %d", i, s.Replied, want)
		}
	}
}
