package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// jwtListener is one listener of the Envoy that TestJWT and TestXFF
// share. Every listener runs the plugin from the same Wasm VM (vm_id
// "tokenbucket", same code) with its own root_id (its name), so the
// listeners' buckets live under different shared-data prefixes.
type jwtListener struct {
	name string
	port int
	// hcm holds extra HttpConnectionManager fields, one "key: value" per
	// element (the bootstrap sets use_remote_address: true).
	hcm []string
	// jwt puts jwt_authn (provider "test", payload_in_metadata
	// "jwt_payload", JWKS jwks) before the plugin: paths under /verified
	// require a valid token (401 otherwise); under /optional a valid token is
	// verified and a missing or invalid one passes unverified; other paths
	// are not checked at all.
	jwt  bool
	jwks string
	// config is the plugin configuration.
	config string
}

// jwtListeners turns listeners into the bootstrap's listeners, each running
// build of the plugin.
func jwtListeners(t *testing.T, build envoytest.Build, listeners []jwtListener) []envoytest.Listener {
	out := make([]envoytest.Listener, len(listeners))
	for i, l := range listeners {
		out[i] = envoytest.Listener{Name: l.name, Port: l.port, StatPrefix: strings.ReplaceAll(l.name, "-", "_"),
			RootID: l.name, PluginConfig: l.config, HCM: strings.Join(l.hcm, "\n")}
		out[i] = envoytest.PluginListener(t, build, out[i])
		if l.jwt {
			jwks, err := json.Marshal(l.jwks)
			if err != nil {
				t.Fatal(err)
			}
			out[i].Filters = `- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      test:
        issuer: https://issuer.test
        local_jwks:
          inline_string: ` + string(jwks) + `
        forward: true
        payload_in_metadata: jwt_payload
    rules:
    - match: {prefix: /verified}
      requires: {provider_name: test}
    - match: {prefix: /optional}
      requires:
        requires_any:
          requirements:
          - provider_name: test
          - allow_missing_or_failed: {}`
		}
	}
	return out
}

// jwtSigner signs ES256 tokens with a key generated for the test.
type jwtSigner struct {
	key *ecdsa.PrivateKey
	kid string
}

func newJWTSigner(t *testing.T) jwtSigner {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return jwtSigner{key: key, kid: "test-key"}
}

var jwtB64 = base64.RawURLEncoding

// jwks is the public key as a JSON Web Key Set.
func (s jwtSigner) jwks(t *testing.T) string {
	t.Helper()
	pt, err := s.key.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil || len(pt) != 65 {
		t.Fatalf("public key: %v (%d bytes)", err, len(pt))
	}
	set := map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": s.kid,
		"x": jwtB64.EncodeToString(pt[1:33]), "y": jwtB64.EncodeToString(pt[33:]),
	}}}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sign returns a compact ES256 JWS of claims, with iss set to the provider's
// issuer unless claims has one.
func (s jwtSigner) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	c := map[string]any{"iss": "https://issuer.test"}
	for k, v := range claims {
		c[k] = v
	}
	hdr, err := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": s.kid})
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	input := jwtB64.EncodeToString(hdr) + "." + jwtB64.EncodeToString(body)
	sum := sha256.Sum256([]byte(input))
	r, ss, err := ecdsa.Sign(rand.Reader, s.key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	ss.FillBytes(sig[32:])
	return input + "." + jwtB64.EncodeToString(sig)
}

// forge returns a token with the same header and claims as a valid one but
// a signature of random bytes: what an attacker can write without the key.
func (s jwtSigner) forge(t *testing.T, claims map[string]any) string {
	t.Helper()
	tok := s.sign(t, claims)
	i := strings.LastIndexByte(tok, '.')
	junk := make([]byte, 64)
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	return tok[:i+1] + jwtB64.EncodeToString(junk)
}

// Every rule below applies to one path prefix and has a burst of 1000 with
// almost no refill, so RateLimit-Remaining counts the requests its bucket
// admitted, and missing_key "deny" turns a claim the plugin could not read
// into a 400 with reason missing_limit_key.

// jwtVerifiedConfig runs behind jwt_authn, with the default
// trust_unverified_jwt false.
const jwtVerifiedConfig = `{"rules": [
 {"name": "by-sub", "match": {"path": {"prefix": "/verified/sub"}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "by-org", "match": {"path": {"prefix": "/verified/org"}},
  "limit_keys": ["jwt:org.id"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "tier-enterprise", "group": "plan",
  "match": {"path": {"prefix": "/verified/tier"}, "jwt:plan": {"equals": "enterprise"}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "tier-pro", "group": "plan",
  "match": {"path": {"prefix": "/verified/tier"}, "jwt:plan": {"in": ["pro", "team"]}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100}},
 {"name": "tier-free", "group": "plan", "match": {"path": {"prefix": "/verified/tier"}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 10}},
 {"name": "seats-key", "match": {"path": {"prefix": "/verified/seats"}}, "limit_keys": ["jwt:org.seats"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "optional-sub", "match": {"path": {"prefix": "/optional"}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "unchecked-sub", "match": {"path": {"prefix": "/unchecked"}},
  "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}}
]}`

// jwtTrustingConfig reads claims of tokens nobody verified: the dangerous
// opt-in.
const jwtTrustingConfig = `{"trust_unverified_jwt": true, "rules": [
 {"name": "trusting-sub", "limit_keys": ["jwt:sub"], "missing_key": "deny",
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}},
 {"name": "trusting-seats", "match": {"jwt:org.seats": {"equals": "42"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 500}}]}`

// xffConfig returns a configuration that counts requests per client address
// with the given xff_num_trusted_hops.
func xffConfig(hops int) string {
	return `{"xff_num_trusted_hops": ` + strconv.Itoa(hops) + `, "rules": [
 {"name": "per-ip", "limit_keys": ["ip:address"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1000}}]}`
}

// rl is what a test asserts about one response: its status, the rule it
// names (in RateLimit-Policy, or else in the rejection body's "rule"),
// RateLimit-Remaining and X-RateLimit-Reason ("" for an absent header).
type rl struct {
	status    int
	rule      string
	remaining string
	reason    string
}

func rlOf(r envoytest.Result) rl {
	rule, _, _ := strings.Cut(strings.TrimPrefix(r.Header.Get("RateLimit-Policy"), `"`), `"`)
	if rule == "" {
		var body struct{ Rule string }
		if json.Unmarshal(r.Body, &body) == nil {
			rule = body.Rule
		}
	}
	return rl{r.Status, rule, r.Header.Get("RateLimit-Remaining"), r.Header.Get("X-RateLimit-Reason")}
}

// rlStep is one request of a timeline and what it must get.
type rlStep struct {
	path    string
	headers map[string]string
	want    rl
}

// runSteps sends the steps in order and reports every mismatch.
func runSteps(t *testing.T, c *envoytest.Client, steps []rlStep) {
	t.Helper()
	for i, s := range steps {
		r := c.Get(s.path, s.headers)
		if r.Err != nil {
			t.Fatalf("step %d: GET %s: %v", i, s.path, r.Err)
		}
		if got := rlOf(r); got != s.want {
			t.Errorf("step %d: GET %s %s: got %+v, want %+v (body %.200s)", i, s.path, shortHeaders(s.headers), got, s.want, r.Body)
		}
	}
}

// shortHeaders prints headers with long values (tokens) cut short.
func shortHeaders(h map[string]string) string {
	var parts []string
	for k, v := range h {
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		parts = append(parts, k+": "+v)
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, ", ") + "}"
}

// TestJWT checks jwt:<claim> on real Envoy behind jwt_authn: the plugin reads
// the claims jwt_authn verified (metadata "envoy.filters.http.jwt_authn" /
// "jwt_payload", nested claims by dots), a token nobody verified never
// becomes a key unless trust_unverified_jwt says so, and tiers match on a
// verified claim.
//
// The native module cannot read that metadata (docs/native.md: Envoy's
// dynamic-module calls read metadata one level deep, and jwt_payload is a
// structure), so it refuses jwtVerifiedConfig: its "jwt" listener runs the
// same rules with trust_unverified_jwt, behind the same jwt_authn (which
// verified the bearer token of every /verified request), and every case but
// the unverified tokens' runs unchanged; that one becomes the refusal.
func TestJWT(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testJWT)
}

// jwtNativeConfig is jwtVerifiedConfig with trust_unverified_jwt.
var jwtNativeConfig = strings.Replace(jwtVerifiedConfig, `{"rules": [`, `{"trust_unverified_jwt": true, "rules": [`, 1)

func testJWT(t *testing.T, build envoytest.Build) {
	t.Parallel()
	signer := newJWTSigner(t)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	trustPort := envoytest.FreePort(t)
	verifiedConfig := jwtVerifiedConfig
	if build == envoytest.Native {
		verifiedConfig = jwtNativeConfig
	}
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Listeners: jwtListeners(t, build, []jwtListener{
			{name: "jwt", jwt: true, jwks: signer.jwks(t), config: verifiedConfig},
			{name: "trusting", port: trustPort, config: jwtTrustingConfig},
		}),
		UpstreamPort: up.Port(), Concurrency: 1,
	})
	c := e.Client()
	defer c.Close()
	bearer := func(tok string) map[string]string { return map[string]string{"authorization": "Bearer " + tok} }
	alice := bearer(signer.sign(t, map[string]any{"sub": "alice", "plan": "enterprise", "admin": true,
		"org": map[string]any{"id": "acme", "seats": 42}}))
	bob := bearer(signer.sign(t, map[string]any{"sub": "bob", "plan": "pro", "org": map[string]any{"id": "acme"}}))
	carol := bearer(signer.sign(t, map[string]any{"sub": "carol", "org": map[string]any{"id": "globex"}}))
	dave := bearer(signer.sign(t, map[string]any{"sub": "dave", "plan": "free"}))
	// What anyone can write without the key: claims of their choosing.
	mallory := bearer(signer.forge(t, map[string]any{"sub": "mallory", "plan": "enterprise",
		"org": map[string]any{"id": "acme", "seats": 42}}))
	missing := func(rule string) rl { return rl{400, rule, "", "missing_limit_key"} }

	t.Run("verified sub is the key", func(t *testing.T) {
		runSteps(t, c, []rlStep{
			{"/verified/sub", alice, rl{200, "by-sub", "999", ""}},
			{"/verified/sub", alice, rl{200, "by-sub", "998", ""}},
			{"/verified/sub", bob, rl{200, "by-sub", "999", ""}},
		})
	})
	t.Run("nested claim org.id is the key", func(t *testing.T) {
		runSteps(t, c, []rlStep{
			{"/verified/org", alice, rl{200, "by-org", "999", ""}},
			{"/verified/org", bob, rl{200, "by-org", "998", ""}}, // same org as alice
			{"/verified/org", carol, rl{200, "by-org", "999", ""}},
			{"/verified/org", dave, missing("by-org")}, // no org claim
		})
	})
	t.Run("tiers match the verified plan", func(t *testing.T) {
		runSteps(t, c, []rlStep{
			{"/verified/tier", alice, rl{200, "tier-enterprise", "999", ""}},
			{"/verified/tier", bob, rl{200, "tier-pro", "99", ""}},
			{"/verified/tier", carol, rl{200, "tier-free", "9", ""}}, // no plan claim: the fallback
			{"/verified/tier", dave, rl{200, "tier-free", "9", ""}},
		})
	})
	t.Run("jwt_authn refuses forged and missing tokens", func(t *testing.T) {
		runSteps(t, c, []rlStep{
			{"/verified/sub", mallory, rl{401, "", "", ""}},
			{"/verified/sub", nil, rl{401, "", "", ""}},
		})
	})
	if build == envoytest.Native {
		t.Run("a configuration needing the verified claims is refused", func(t *testing.T) {
			f := envoytest.ExpectStartFailure(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, PluginConfig: jwtVerifiedConfig})
			if want := "config: rules[0].limit_keys[0]: the native module cannot read the claims jwt_authn verified"; !strings.Contains(f.Log, want) {
				t.Fatalf("%v; Envoy's log lacks %q:\n%s", f, want, logtext.Tail(f.Log, 15))
			}
		})
	} else {
		t.Run("an unverified token is not a key", func(t *testing.T) {
			runSteps(t, c, []rlStep{
				// /optional: jwt_authn verifies what it can and lets the rest pass.
				{"/optional", alice, rl{200, "optional-sub", "999", ""}},
				{"/optional", mallory, missing("optional-sub")},
				{"/optional", nil, missing("optional-sub")},
				// /unchecked: jwt_authn verifies nothing, even a valid token.
				{"/unchecked", alice, missing("unchecked-sub")},
				{"/unchecked", mallory, missing("unchecked-sub")},
			})
		})
	}
	t.Run("trust_unverified_jwt reads any token", func(t *testing.T) {
		tc := envoytest.NewClient("http://127.0.0.1:" + strconv.Itoa(trustPort))
		defer tc.Close()
		runSteps(t, tc, []rlStep{
			// mallory's forged seats claim matches trusting-seats (burst 500),
			// which is then the rule closest to its limit.
			{"/", mallory, rl{200, "trusting-seats", "499", ""}},
			{"/", bob, rl{200, "trusting-sub", "999", ""}},
			{"/", mallory, rl{200, "trusting-seats", "498", ""}},
			{"/", nil, missing("trusting-sub")},
		})
	})
	// Envoy hands a Wasm plugin a number of the metadata Struct as the 8
	// bytes of a float64 and a boolean as 1 byte, not as text (the README
	// says so): such claims work as limit keys, but equals/in/prefix/regex
	// compare string claims only.
	t.Run("numeric claims work as limit keys", func(t *testing.T) {
		runSteps(t, c, []rlStep{
			{"/verified/seats", alice, rl{200, "seats-key", "999", ""}},
			{"/verified/seats", alice, rl{200, "seats-key", "998", ""}},
		})
	})
}

// TestXFF checks ip:address on real Envoy, behind an HTTP connection manager
// with its defaults and behind one configured as an edge proxy
// (use_remote_address true), with the plugin's xff_num_trusted_hops 0 (the
// header must not matter) and 1 (one trusted proxy in front, which appends
// the client's address).
func TestXFF(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testXFF)
}

func testXFF(t *testing.T, build envoytest.Build) {
	t.Parallel()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	ports := map[string]int{}
	// Each listener's last character is its plugin's xff_num_trusted_hops.
	listeners := []jwtListener{
		// Not tested: the connection manager's default use_remote_address
		// false. Envoy then replaces the stream's downstream address (the
		// property source.address) with the rightmost X-Forwarded-For
		// address before any filter runs, and no Wasm filter can see the
		// peer: the README requires use_remote_address true for ip:address.
		// An edge proxy (use_remote_address true): source.address is the
		// peer, or with the connection manager's own xff_num_trusted_hops N
		// the Nth address from the right; and Envoy appends the peer (its
		// own address for a loopback peer) to X-Forwarded-For before any
		// filter runs.
		{name: "edge0"},
		{name: "edge1", hcm: []string{"xff_num_trusted_hops: 1"}},
	}
	for i := range listeners {
		l := &listeners[i]
		ports[l.name] = envoytest.FreePort(t)
		l.port = ports[l.name]
		l.config = xffConfig(int(l.name[len(l.name)-1] - '0'))
	}
	envoytest.Start(t, envoytest.Options{Build: build, Listeners: jwtListeners(t, build, listeners), UpstreamPort: up.Port(), Concurrency: 1})
	client := func(name string) *envoytest.Client {
		c := envoytest.NewClient("http://127.0.0.1:" + strconv.Itoa(ports[name]))
		t.Cleanup(c.Close)
		return c
	}
	xff := func(v string) map[string]string { return map[string]string{"x-forwarded-for": v} }
	ok := func(remaining string) rl { return rl{200, "per-ip", remaining, ""} }

	// The client is 127.0.0.1 whatever X-Forwarded-For says.
	t.Run("hops 0 ignores X-Forwarded-For (use_remote_address)", func(t *testing.T) {
		runSteps(t, client("edge0"), []rlStep{
			{"/", nil, ok("999")},
			{"/", xff("1.1.1.1"), ok("998")},
			{"/", xff("2.2.2.2"), ok("997")},
		})
	})
	// The client is the rightmost address the trusted proxy appended;
	// what the client wrote to the left of it does not matter. Behind an
	// edge connection manager the header the plugin sees ends with Envoy's
	// own append, which is not the trusted proxy's: counting from the right
	// must skip it, as Envoy does (it reads the header before appending).
	t.Run("hops 1 takes the address the trusted proxy appended (use_remote_address)", func(t *testing.T) {
		runSteps(t, client("edge1"), []rlStep{
			{"/", xff("1.1.1.1"), ok("999")},
			{"/", xff("9.9.9.9, 1.1.1.1"), ok("998")},
			{"/", xff("1.1.1.2"), ok("999")},
		})
	})
}
