package rlsxds

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
)

// pki is a CA, a server certificate for 127.0.0.1 and "xds.test", and a
// client certificate, as Envoy Gateway's certificate generator makes them,
// written as PEM files in dir.
type pki struct {
	dir                                  string
	ca                                   *x509.CertPool
	server                               tls.Certificate
	caFile, clientCert, clientKey, other string // other: a CA that signed nothing here
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caKey, caCert, caDER := selfSigned(t, "test ca")
	p.ca = x509.NewCertPool()
	p.ca.AddCert(caCert)
	p.caFile = p.write(t, "ca.crt", "CERTIFICATE", caDER)
	_, _, otherDER := selfSigned(t, "another ca")
	p.other = p.write(t, "other.crt", "CERTIFICATE", otherDER)

	sKey, sDER := leaf(t, caKey, caCert, "envoy-gateway", x509.ExtKeyUsageServerAuth, []string{"xds.test"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.server = tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey}
	cKey, cDER := leaf(t, caKey, caCert, "envoy-ratelimit", x509.ExtKeyUsageClientAuth, nil, nil)
	p.clientCert = p.write(t, "tls.crt", "CERTIFICATE", cDER)
	kDER, err := x509.MarshalECPrivateKey(cKey)
	if err != nil {
		t.Fatal(err)
	}
	p.clientKey = p.write(t, "tls.key", "EC PRIVATE KEY", kDER)
	return p
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serverTLS requires a client certificate signed by the CA.
func (p *pki) serverTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.ca,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

var serial int64

func template(cn string) *x509.Certificate {
	serial++
	return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
}

func selfSigned(t *testing.T, cn string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(cn)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func leaf(t *testing.T, caKey *ecdsa.PrivateKey, ca *x509.Certificate, cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(cn)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	tmpl.DNSNames, tmpl.IPAddresses = dns, ips
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// adsServer is go-control-plane's snapshot cache and ADS server on a
// loopback port, recording the requests it receives.
type adsServer struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	addr  string

	mu      sync.Mutex
	reqs    []*discovery.DiscoveryRequest
	headers []metadata.MD // of each stream opened
	got     chan struct{} // a request arrived
}

// startADS serves on addr ("127.0.0.1:0" for a new port) with creds.
func startADS(t *testing.T, addr string, creds *tls.Config) *adsServer {
	t.Helper()
	s := &adsServer{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), got: make(chan struct{}, 1024)}
	cb := serverv3.CallbackFuncs{StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		s.mu.Lock()
		s.headers = append(s.headers, md)
		s.mu.Unlock()
		return nil
	}, StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		select {
		case s.got <- struct{}{}:
		default:
		}
		return nil
	}}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(creds)))
	}
	s.grpc = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(context.Background(), s.cache, cb))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	go func() { _ = s.grpc.Serve(ln) }()
	t.Cleanup(s.grpc.Stop)
	return s
}

// set serves resources to node at version.
func (s *adsServer) set(node, version string, rs ...*rlsconf.RateLimitConfig) {
	s.t.Helper()
	res := make([]types.Resource, len(rs))
	for i, r := range rs {
		res[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatal(err)
	}
}

// await waits (bounded) for a request that ok accepts, and returns it.
func (s *adsServer) await(what string, ok func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		for _, r := range s.reqs {
			if ok(r) {
				s.mu.Unlock()
				return r
			}
		}
		s.mu.Unlock()
		select {
		case <-s.got:
		case <-deadline:
			s.t.Fatalf("no %s within 30s; requests: %v", what, s.reqs)
			return nil
		}
	}
}

// ack is a request ACKing version.
func ack(version string) func(*discovery.DiscoveryRequest) bool {
	return func(r *discovery.DiscoveryRequest) bool {
		return r.GetVersionInfo() == version && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
	}
}

// nack is a request refusing a response with an error.
func nack(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil }

// target is a rate limit service the client configures, on a memory store
// with a settable clock.
type target struct {
	srv *rls.Server
	now time.Time
	mu  sync.Mutex
	reg *prometheus.Registry
	m   *rls.Metrics
}

func newTarget(t *testing.T) *target {
	t.Helper()
	tg := &target{now: time.Unix(1_700_000_000, 0), reg: prometheus.NewRegistry()}
	var err error
	if tg.m, err = rls.NewMetrics(tg.reg); err != nil {
		t.Fatal(err)
	}
	store := service.NewMemoryStore(service.MemoryOptions{Now: func() int64 { return tg.clock().UnixNano() }})
	t.Cleanup(func() { store.Close() })
	tg.srv, err = rls.NewServer(rls.Options{Store: store, Now: tg.clock, Metrics: tg.m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

func (tg *target) clock() time.Time {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.now
}

// call asks the service about one descriptor of domain.
func (tg *target) call(domain string, kv ...string) (*pb.RateLimitResponse, error) {
	d := &rlpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return tg.srv.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlpb.RateLimitDescriptor{d}})
}

// loads is the count of config loads with result.
func (tg *target) loads(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := tg.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "limitd_rls_config_loads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

var quiet = slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelError + 1}))

// logBuffer is a logger's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waits is a back-off that waits for the test: each Wait reports its
// delay on asked and returns when the test sends on release.
type waits struct {
	asked   chan time.Duration
	release chan struct{}
}

func newWaits() *waits {
	return &waits{asked: make(chan time.Duration, 64), release: make(chan struct{})}
}

func (w *waits) wait(ctx context.Context, d time.Duration) error {
	w.asked <- d
	select {
	case <-w.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next returns the delay of the next Wait (bounded).
func (w *waits) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-w.asked:
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not back off within 30s")
		return 0
	}
}

// run starts c until the test ends.
func run(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// awaitConfigured waits (bounded) for c's first configuration.
func awaitConfigured(t *testing.T, c *Client) {
	t.Helper()
	select {
	case <-c.Configured():
	case <-time.After(30 * time.Second):
		t.Fatal("no configuration within 30s")
	}
}

// limit is a descriptor key=value limited to n per unit.
func limit(key, value string, n uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitDescriptor {
	return &rlsconf.RateLimitDescriptor{Key: key, Value: value,
		RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}}
}

func domain(name, d string, ds ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: d, Descriptors: ds}
}

func slogTo(l *logBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// auto releases every wait at once until the test ends, and returns the
// delays asked on a channel of its own.
func (w *waits) auto(t *testing.T) <-chan time.Duration {
	t.Helper()
	out := make(chan time.Duration, 64)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case d := <-w.asked:
				select {
				case out <- d:
				default:
				}
				select {
				case w.release <- struct{}{}:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return out
}
