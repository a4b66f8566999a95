// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// gatewayVersion is the Envoy Gateway release whose translator's golden
// outputs are served.
const gatewayVersion = "v1.9.1"

// xdsNode is the node ID Envoy Gateway serves the rate limit
// configuration to.
const xdsNode = "envoy-ratelimit"

// gatewayModule is Envoy Gateway's source in the module cache (`go mod
// download` of it, not a dependency of any module here).
func gatewayModule(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/envoyproxy/gateway@"+gatewayVersion).Output()
	var m struct{ Dir, Error string }
	if err != nil || json.Unmarshal(out, &m) != nil || m.Dir == "" {
		t.Fatalf("go mod download github.com/envoyproxy/gateway@%s: %s %v %s", gatewayVersion, out, err, m.Error)
	}
	return m.Dir
}

// goldenCase is one of the translator's rate limit outputs: its
// RateLimitConfig resources and, per domain, the descriptors the routes'
// rate_limits actions make.
type goldenCase struct {
	name      string
	resources []*rlsconf.RateLimitConfig
	calls     map[string][]entries // domain → descriptors
}

// goldenCases reads the 26 cases of
// internal/xds/translator/testdata/out/ratelimit-config.
func goldenCases(t *testing.T) []goldenCase {
	t.Helper()
	dir := filepath.Join(gatewayModule(t), "internal", "xds", "translator", "testdata", "out", "ratelimit-config")
	names, err := filepath.Glob(filepath.Join(dir, "*.routes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []goldenCase
	for _, routes := range names {
		c := goldenCase{name: strings.TrimSuffix(filepath.Base(routes), ".routes.yaml"), calls: map[string][]entries{}}
		cfg, err := os.ReadFile(strings.TrimSuffix(routes, ".routes.yaml") + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range documents(cfg) {
			c.resources = append(c.resources, goldenResource(t, c.name, doc))
		}
		rt, err := os.ReadFile(routes)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range documents(rt) {
			var r struct {
				RateLimitsByDomain map[string][]struct {
					Actions []map[string]map[string]map[string]any `json:"actions"`
				} `json:"rateLimitsByDomain"`
			}
			if err := yaml.Unmarshal(doc, &r); err != nil {
				t.Fatalf("%s: %v", routes, err)
			}
			for domain, rls := range r.RateLimitsByDomain {
				for _, rl := range rls {
					c.calls[domain] = append(c.calls[domain], descriptorOf(t, c.name, rl.Actions))
				}
			}
		}
		out = append(out, c)
	}
	if len(out) != 26 {
		t.Fatalf("%d golden cases in %s, want 26", len(out), dir)
	}
	return out
}

func documents(b []byte) [][]byte {
	var out [][]byte
	for _, d := range strings.Split("\n"+string(b), "\n---\n") {
		if strings.TrimSpace(d) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// goldenResource decodes one golden document, envoyproxy/ratelimit's YAML
// of the resource, into the resource. The fields the YAML has and the
// resource lacks (quota_mode, value_to_metric, share_threshold) must be
// false: they are not carried over xDS.
func goldenResource(t *testing.T, name string, doc []byte) *rlsconf.RateLimitConfig {
	t.Helper()
	for _, f := range []string{"quota_mode", "value_to_metric", "share_threshold"} {
		if strings.Contains(string(doc), f+": true") {
			t.Fatalf("%s: %s set, which RateLimitConfig cannot carry", name, f)
		}
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var r rlsconf.RateLimitConfig
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, &r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &r
}

// descriptorOf is the descriptor one route rate limit's actions make for
// a request that matches them all: each action's descriptor_key and
// descriptor_value, a request header's value made up.
func descriptorOf(t *testing.T, name string, actions []map[string]map[string]map[string]any) entries {
	t.Helper()
	var e entries
	for _, a := range actions {
		for kind, spec := range a["ActionSpecifier"] {
			key, _ := spec["descriptor_key"].(string)
			value, _ := spec["descriptor_value"].(string)
			switch kind {
			case "GenericKey", "HeaderValueMatch", "RemoteAddressMatch", "QueryParameterValueMatch":
				if key == "" {
					key = map[string]string{"GenericKey": "generic_key", "HeaderValueMatch": "header_match",
						"QueryParameterValueMatch": "query_match"}[kind]
				}
			case "RequestHeaders":
				value = "user-1"
			default:
				t.Fatalf("%s: an action %s the test does not know", name, kind)
			}
			e = append(e, key, value)
		}
	}
	return e
}

// xdsServer is go-control-plane's snapshot cache and ADS server on a
// loopback port with mutual TLS, as Envoy Gateway serves the rate limit
// configuration. It records, per client (its node metadata's "who"), the
// versions ACKed and the NACKs.
type xdsServer struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	addr  string
	creds *tls.Config

	mu    sync.Mutex
	who   map[int64]string
	acked map[string]string   // who → the version last ACKed
	nacks map[string][]string // who → error details
}

func startXDSServer(t *testing.T, addr string, creds *tls.Config, cache cachev3.SnapshotCache) *xdsServer {
	t.Helper()
	if cache == nil {
		cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	}
	x := &xdsServer{t: t, cache: cache, creds: creds, who: map[int64]string{}, acked: map[string]string{}, nacks: map[string][]string{}}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(id int64, r *discovery.DiscoveryRequest) error {
		x.mu.Lock()
		defer x.mu.Unlock()
		if w := r.GetNode().GetMetadata().GetFields()["who"].GetStringValue(); w != "" {
			x.who[id] = w
		}
		w := x.who[id]
		switch {
		case r.GetErrorDetail() != nil:
			x.nacks[w] = append(x.nacks[w], r.GetErrorDetail().GetMessage())
		case r.GetResponseNonce() != "":
			x.acked[w] = r.GetVersionInfo()
		}
		return nil
	}}
	x.grpc = grpc.NewServer(grpc.Creds(credentials.NewTLS(creds)))
	discovery.RegisterAggregatedDiscoveryServiceServer(x.grpc, serverv3.NewServer(context.Background(), cache, cb))
	var ln net.Listener
	var err error
	for range 50 { // the address of a server just stopped: bounded retries
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	x.addr = ln.Addr().String()
	go func() { _ = x.grpc.Serve(ln) }()
	t.Cleanup(x.grpc.Stop)
	return x
}

// set serves rs at version to the node.
func (x *xdsServer) set(version string, rs ...*rlsconf.RateLimitConfig) {
	x.t.Helper()
	res := make([]types.Resource, len(rs))
	for i, r := range rs {
		res[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		x.t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), xdsNode, snap); err != nil {
		x.t.Fatal(err)
	}
}

// waitACK waits until every one of who ACKed version.
func (x *xdsServer) waitACK(version string, who ...string) {
	x.t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		x.mu.Lock()
		missing := slices.DeleteFunc(slices.Clone(who), func(w string) bool { return x.acked[w] == version })
		x.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("%v did not ACK version %s within %v (ACKed: %v)", missing, version, waitTimeout, x.acked)
		}
	}
}

// waitNACK waits until who NACKed more than before times, and returns the
// last reason.
func (x *xdsServer) waitNACK(who string, before int) string {
	x.t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		x.mu.Lock()
		n := x.nacks[who]
		x.mu.Unlock()
		if len(n) > before {
			return n[len(n)-1]
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("%s did not NACK within %v", who, waitTimeout)
		}
	}
}

func (x *xdsServer) nackCount(who string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.nacks[who])
}

// xdsPKI is a CA, the ADS server's certificate (for "envoy-gateway" and
// 127.0.0.1) and the client certificate both services present, as Envoy
// Gateway's certificate generator makes them, in PEM files.
type xdsPKI struct {
	server                 *tls.Config
	ca, clientCert, client string // files: the CA, the client's certificate and key
}

func newXDSPKI(t *testing.T) *xdsPKI {
	t.Helper()
	dir := t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, kind string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpl := func(n int64, cn string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(n), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	}
	caKey := key()
	caT := tmpl(1, "envoy-gateway ca")
	caT.IsCA, caT.BasicConstraintsValid, caT.KeyUsage = true, true, x509.KeyUsageCertSign
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	sKey := key()
	sT := tmpl(2, "envoy-gateway")
	sT.ExtKeyUsage, sT.DNSNames, sT.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []string{"envoy-gateway"}, []net.IP{net.IPv4(127, 0, 0, 1)}
	sDER, err := x509.CreateCertificate(rand.Reader, sT, ca, &sKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cKey := key()
	cT := tmpl(3, "envoy-ratelimit")
	cT.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	cDER, err := x509.CreateCertificate(rand.Reader, cT, ca, &cKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kDER, err := x509.MarshalECPrivateKey(cKey)
	if err != nil {
		t.Fatal(err)
	}
	return &xdsPKI{
		server: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{sDER}, PrivateKey: sKey}},
			ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
		ca: write("ca.crt", "CERTIFICATE", caDER), clientCert: write("tls.crt", "CERTIFICATE", cDER),
		client: write("tls.key", "EC PRIVATE KEY", kDER),
	}
}

// startReferenceXDS starts envoyproxy/ratelimit in its GRPC_XDS_SOTW mode
// on the ADS server at addr, with mutual TLS as Envoy Gateway configures
// it. The server must already serve a snapshot: without
// FORCE_START_WITHOUT_INITIAL_CONFIG it serves nothing before one.
func startReferenceXDS(t *testing.T, addr string, p *xdsPKI) *service {
	t.Helper()
	return startEnvXDS(t, reference, addr, p)
}

// startEnvXDS starts a service of kind k, reference (envoyproxy/ratelimit)
// or asRatelimit (build/ratelimit, with fixed windows), configured only by
// envoyproxy/ratelimit's environment as a client of the ADS server at
// addr, as startReferenceXDS says.
func startEnvXDS(t *testing.T, k kind, addr string, p *xdsPKI) *service {
	t.Helper()
	r := redistest.Start(t)
	s := &service{kind: k, redis: r}
	opts := envoyratelimit.Options{RedisAddr: r.Addr(), StartTimeout: startTimeout, Env: []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + addr, "CONFIG_GRPC_XDS_NODE_ID=" + xdsNode,
		"CONFIG_GRPC_XDS_NODE_METADATA=who=" + string(k),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + p.clientCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + p.client, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + p.ca,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=envoy-gateway",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=500ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=2s",
	}}
	if k == asRatelimit {
		opts.Binary, opts.ConfiguredLines = compatBinary(t), []string{"configuration loaded"}
		opts.Env = append(opts.Env, "LIMITD_ALGORITHM=fixed_window")
	}
	s.rl = envoyratelimit.Start(t, opts)
	s.grpcPort, s.configDir, s.log = s.rl.GRPCPort(), s.rl.ConfigDir(), s.rl.Log
	s.dial(t)
	return s
}

// limitdXDSArgs are limitd's flags as a client of the ADS server at addr,
// with the same TLS files and node; who names it in the node's metadata.
func limitdXDSArgs(addr string, p *xdsPKI, who string) []string {
	return []string{"--rls-xds-server", addr, "--rls-xds-node-id", xdsNode,
		"--rls-xds-node-metadata", `{"who":"` + who + `"}`,
		"--rls-xds-tls-cert", p.clientCert, "--rls-xds-tls-key", p.client, "--rls-xds-tls-ca", p.ca,
		"--rls-xds-tls-san", "envoy-gateway", "--rls-algorithm", "fixed_window"}
}

// limitdProcess is a limitd started by startLimitdWith.
type limitdProcess struct {
	*service
	cmd  *exec.Cmd
	done chan struct{}
}

// startLimitdWith runs bin (build/limitd, or another program configured as
// limitd: args and env are its whole configuration beside the listeners'
// flags and --redis) on a new redis-server, and, when ready, waits until it
// is ready (/readyz and the gRPC port); else only until it has started.
// A port taken between its choice and limitd's start (other tests run on
// the machine) is chosen again, at most three times when ready. The
// process is stopped when t ends.
func startLimitdWith(t *testing.T, bin string, args, env []string, ready bool) *limitdProcess {
	t.Helper()
	r := redistest.Start(t)
	logPath := filepath.Join(t.TempDir(), "limitd.log")
	for attempt := 1; ; attempt++ {
		p := launchWith(t, bin, r, logPath, args, env)
		if !ready {
			p.dial(t)
			return p
		}
		err := waitLimitd(p.httpPort, p.grpcPort, p.done)
		if err == nil {
			p.dial(t)
			return p
		}
		p.stop()
		if attempt >= 3 || !strings.Contains(p.log(), "address already in use") {
			t.Fatalf("limitd did not start: %v\n%s", err, logtext.Tail(p.log(), 30))
		}
	}
}

// launchWith starts one limitd process on r, logging to logPath, stopped
// when t ends.
func launchWith(t *testing.T, bin string, r *redistest.Server, logPath string, args, env []string) *limitdProcess {
	t.Helper()
	s := &service{kind: limitd, redis: r}
	s.log = func() string { b, _ := os.ReadFile(logPath); return string(b) }
	s.httpPort, s.grpcPort = freePort(t), freePort(t)
	argv := append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(s.httpPort),
		"--grpc-listen", "127.0.0.1:" + strconv.Itoa(s.grpcPort), "--redis", r.Addr()}, args...)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, argv...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &limitdProcess{service: s, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("limitd's log tail:\n%s", logtext.Tail(s.log(), 30))
		}
		p.stop()
	})
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (p *limitdProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// flush empties both services' Redis servers.
func flush(t *testing.T, ss ...*service) {
	t.Helper()
	for _, s := range ss {
		if _, err := redistest.Do(s.redis.Addr(), "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
	}
}

// decideGolden plays each descriptor of c on both services, in turns,
// requests_per_unit+1 times (at most 6), within one second (again, at most
// three times, when a second's edge fell inside), and reports the
// differences.
func decideGolden(t *testing.T, c goldenCase, ref, lim *service) (calls int) {
	t.Helper()
	for _, domain := range slices.Sorted(mapsKeys(c.calls)) {
		for _, d := range c.calls[domain] {
			for attempt := 1; ; attempt++ {
				flush(t, ref, lim)
				alignSecond(t, 500*time.Millisecond)
				before := time.Now()
				var problems []string
				for i := range 6 {
					a, errA := ref.call(domain, 1, d)
					b, errB := lim.call(domain, 1, d)
					calls++
					if errA != nil || errB != nil {
						problems = append(problems, fmt.Sprintf("%s %s %v call %d: envoyproxy/ratelimit %v, limitd %v", c.name, domain, d, i, errA, errB))
						break
					}
					if diff := diffResponses(a, b, true); diff != "" {
						problems = append(problems, fmt.Sprintf("%s %s %v call %d: %s\n%v\n%v", c.name, domain, d, i, diff, a, b))
					}
					if a.GetOverallCode() != rlsOK {
						break // over the limit: the next calls say the same
					}
				}
				if !time.Now().Truncate(time.Second).Equal(before.Truncate(time.Second)) && attempt < 3 {
					continue
				}
				for _, p := range problems {
					t.Error(p)
				}
				break
			}
		}
	}
	return calls
}

// TestEnvoyGatewayGolden serves each of Envoy Gateway's 26 golden
// RateLimitConfig outputs, in turn, over ADS with mutual TLS to
// envoyproxy/ratelimit (GRPC_XDS_SOTW), to limitd (--rls-xds-server,
// fixed windows) and to build/ratelimit (envoyproxy/ratelimit's
// environment, LIMITD_ALGORITHM=fixed_window); each ACKs it, and the
// descriptors the case's routes make get the same answers from each limitd
// as from envoyproxy/ratelimit (direct gRPC calls). Then, on the three: a
// changed snapshot under traffic (no call fails, each answer has the old
// limit or the new); a snapshot that does not validate is NACKed by each
// while the last good one serves; the ADS server is stopped and started
// again on its address with a new snapshot, which each takes.
func TestEnvoyGatewayGolden(t *testing.T) {
	t.Parallel()
	cases := goldenCases(t)
	p := newXDSPKI(t)
	x := startXDSServer(t, "127.0.0.1:0", p.server, nil)
	x.set("0-"+cases[0].name, cases[0].resources...)
	ref := startReferenceXDS(t, x.addr, p)
	lim := startLimitdWith(t, limitdBinary(t), limitdXDSArgs(x.addr, p, string(limitd)), nil, true).service
	compat := startEnvXDS(t, asRatelimit, x.addr, p)
	who := []string{string(reference), string(limitd), string(asRatelimit)}
	calls := 0
	for i, c := range cases {
		version := fmt.Sprintf("%d-%s", i, c.name)
		if i > 0 {
			x.set(version, c.resources...)
		}
		x.waitACK(version, who...)
		if err := ref.rl.WaitLoads(i+1, len(ref.rl.ConfigErrors()), waitTimeout); err != nil {
			t.Fatal(err)
		}
		calls += decideGolden(t, c, ref, lim)
		decideGolden(t, c, ref, compat)
	}
	t.Logf("%d cases, %d calls on each service", len(cases), calls)

	// The last case changed under traffic on both: every limit to 1000 an
	// hour; then the last case again.
	last := cases[len(cases)-1]
	domain := slices.Sorted(mapsKeys(last.calls))[0]
	d := last.calls[domain][0]
	r, err := ref.call(domain, 1, d)
	if err != nil {
		t.Fatal(err)
	}
	underChange(t, []*service{ref, lim, compat}, domain, d, r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), func() {
		x.set("changed", changeLimits(last.resources, 1000)...)
		x.waitACK("changed", who...)
		if err := ref.rl.WaitLoads(len(cases)+1, len(ref.rl.ConfigErrors()), waitTimeout); err != nil {
			t.Fatal(err)
		}
	})
	x.set("last", last.resources...)
	x.waitACK("last", who...)
	if err := ref.rl.WaitLoads(len(cases)+2, len(ref.rl.ConfigErrors()), waitTimeout); err != nil {
		t.Fatal(err)
	}

	// A bad snapshot: NACKed by both, the last case serving on.
	nr, nl, nc := x.nackCount(who[0]), x.nackCount(who[1]), x.nackCount(who[2])
	bad := &rlsconf.RateLimitConfig{Name: "bad", Domain: "bad", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1}}}}
	x.set("bad", append(slices.Clone(last.resources), bad)...)
	if why := x.waitNACK(who[0], nr); !strings.Contains(why, "invalid rate limit unit") {
		t.Errorf("envoyproxy/ratelimit's NACK: %q", why)
	}
	if why := x.waitNACK(who[1], nl); !strings.Contains(why, "rlsconfig: xds:bad") || !strings.Contains(why, "invalid rate limit unit 'UNKNOWN'") {
		t.Errorf("limitd's NACK: %q", why)
	}
	if why := x.waitNACK(who[2], nc); !strings.Contains(why, "rlsconfig: xds:bad") {
		t.Errorf("build/ratelimit's NACK: %q", why)
	}
	decideGolden(t, last, ref, lim)
	decideGolden(t, last, ref, compat)

	// The ADS server stopped and started again with a new snapshot.
	x.grpc.Stop()
	x2 := startXDSServer(t, x.addr, p.server, nil)
	x2.set("restarted", cases[0].resources...)
	x2.waitACK("restarted", who...)
	if err := ref.rl.WaitLoads(len(cases)+3, len(ref.rl.ConfigErrors()), waitTimeout); err != nil {
		t.Fatal(err)
	}
	decideGolden(t, cases[0], ref, lim)
	decideGolden(t, cases[0], ref, compat)
}

// rlsOK is an overall OK answer.
const rlsOK = rlsv3.RateLimitResponse_OK

// TestEnvoyGatewayStartBeforeSnapshot starts limitd before the ADS server
// has a snapshot for it: without --rls-start-without-config its ports stay
// closed (as envoyproxy/ratelimit's without
// FORCE_START_WITHOUT_INITIAL_CONFIG) until the snapshot, then it serves;
// with it, it serves at once and answers Unavailable until then. Then a
// changed snapshot under traffic: every answer is one of the two
// configurations', and the new one serves once ACKed.
func TestEnvoyGatewayStartBeforeSnapshot(t *testing.T) {
	t.Parallel()
	cases := goldenCases(t)
	c := cases[0]
	p := newXDSPKI(t)
	x := startXDSServer(t, "127.0.0.1:0", p.server, nil)
	waiting := startLimitdWith(t, limitdBinary(t), limitdXDSArgs(x.addr, p, "waiting"), nil, false)
	early := startLimitdWith(t, limitdBinary(t), append(limitdXDSArgs(x.addr, p, "early"), "--rls-start-without-config"), nil, true)
	waiting.waitLog(t, "waiting for the first configuration over xds")
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(waiting.grpcPort), time.Second); err == nil {
		conn.Close()
		t.Fatal("limitd's gRPC port is open before any configuration")
	}
	domain := slices.Sorted(mapsKeys(c.calls))[0]
	if _, err := early.call(domain, 1, c.calls[domain][0]); err == nil || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("--rls-start-without-config before any configuration: %v, want Unavailable", err)
	}
	x.set("1", c.resources...)
	if err := waitLimitd(waiting.httpPort, waiting.grpcPort, waiting.done); err != nil {
		t.Fatalf("limitd did not start after the snapshot: %v", err)
	}
	var before uint32
	for _, s := range []*service{waiting.service, early.service} {
		r, err := s.call(domain, 1, c.calls[domain][0])
		if err != nil || r.GetOverallCode() != rlsOK {
			t.Fatalf("after the snapshot: %v, %v", r, err)
		}
		before = r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}

	// A changed snapshot under traffic.
	underChange(t, []*service{waiting.service, early.service}, domain, c.calls[domain][0], before, func() {
		x.set("2", changeLimits(c.resources, 1000)...)
		x.waitACK("2", "waiting", "early")
	})
}

// underChange calls every service of ss about descriptor d of domain, over
// and over (bounded), from 100 calls before change runs to 100 calls after
// it returned, then checks: no call failed,
// every answer had the limit before or 1000 (changeLimits' limit), and
// after the change every service answers 1000.
func underChange(t *testing.T, ss []*service, domain string, d entries, before uint32, change func()) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	var calls atomic.Int64
	for _, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ { // bounded; stops when told
				select {
				case <-stop:
					return
				default:
				}
				r, err := s.call(domain, 1, d)
				calls.Add(1)
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, fmt.Sprintf("%s: %v", s.kind, err))
				case r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1000 &&
					r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != before:
					failures = append(failures, fmt.Sprintf("%s: %v", s.kind, r))
				}
				mu.Unlock()
			}
		}()
	}
	waitCalls := func(n int64) {
		for deadline := time.Now().Add(waitTimeout); calls.Load() < n && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond) // bounded: until the traffic has made n calls
		}
	}
	waitCalls(100)
	change()
	waitCalls(calls.Load() + 100)
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("%d of %d calls failed under the change: %v", len(failures), calls.Load(), failures[:min(5, len(failures))])
	}
	for _, s := range ss {
		r, err := s.call(domain, 1, d)
		if err != nil || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1000 {
			t.Errorf("%s after the change: %v, %v", s.kind, r, err)
		}
	}
	t.Logf("%d calls around the change", calls.Load())
}

// changeLimits copies rs with every limit set to n per hour.
func changeLimits(rs []*rlsconf.RateLimitConfig, n uint32) []*rlsconf.RateLimitConfig {
	out := make([]*rlsconf.RateLimitConfig, len(rs))
	var walk func(ds []*rlsconf.RateLimitDescriptor)
	walk = func(ds []*rlsconf.RateLimitDescriptor) {
		for _, d := range ds {
			if d.RateLimit != nil && !d.RateLimit.Unlimited {
				d.RateLimit.RequestsPerUnit, d.RateLimit.Unit = n, rlsconf.RateLimitUnit_HOUR
			}
			walk(d.Descriptors)
		}
	}
	for i, r := range rs {
		out[i] = cloneConfig(r)
		walk(out[i].Descriptors)
	}
	return out
}

func cloneConfig(r *rlsconf.RateLimitConfig) *rlsconf.RateLimitConfig {
	b, _ := protojson.Marshal(r)
	var c rlsconf.RateLimitConfig
	_ = protojson.Unmarshal(b, &c)
	return &c
}
