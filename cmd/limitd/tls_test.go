package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/testpki"
)

// tlsFiles makes a CA, limitd's server certificate and a client's ("envoy")
// in a temporary folder.
func tlsFiles(t *testing.T) (ca *testpki.CA, cert, key, clientCert, clientKey string) {
	t.Helper()
	now := time.Now()
	ca, err := testpki.NewCA(t.TempDir(), "ca", now)
	if err != nil {
		t.Fatal(err)
	}
	if cert, key, err = ca.Issue("limitd", testpki.Loopback("limitd"), now); err != nil {
		t.Fatal(err)
	}
	if clientCert, clientKey, err = ca.Issue("envoy", testpki.Leaf{CN: "envoy", DNS: []string{"*.envoy-gateway-system"}}, now); err != nil {
		t.Fatal(err)
	}
	return ca, cert, key, clientCert, clientKey
}

func TestRunGRPCTLSFlagErrors(t *testing.T) {
	good := writeConfig(t, rlsYAML)
	ca, cert, key, _, _ := tlsFiles(t)
	grpc := []string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(grpc, "--grpc-tls-cert", cert), "--grpc-tls-cert: needs --grpc-tls-key"},
		{append(grpc, "--grpc-tls-key", key), "--grpc-tls-key: needs --grpc-tls-cert"},
		{append(grpc, "--grpc-tls-client-ca", ca.File), "--grpc-tls-client-ca: needs --grpc-tls-cert and --grpc-tls-key"},
		{append(grpc, "--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-san", "envoy"), "--grpc-tls-client-san: needs --grpc-tls-client-ca"},
		{[]string{"--grpc-tls-cert", cert, "--grpc-tls-key", key}, "--grpc-tls-cert: needs --grpc-listen"},
		{append(grpc, "--grpc-tls-cert", key, "--grpc-tls-key", key), "--grpc-tls-cert"},
		{append(grpc, "--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", key), "--grpc-tls-client-ca"},
	} {
		args := append([]string{"--listen", "127.0.0.1:0"}, tc.args...)
		err := run(context.Background(), args, env(), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// A non-loopback --grpc-listen needs a token, or a client CA (mutual TLS
// authenticates every caller).
func TestGRPCTLSStandsForAToken(t *testing.T) {
	ca, cert, key, _, _ := tlsFiles(t)
	var o rlsOptions
	fs := flag.NewFlagSet("limitd", flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse([]string{"--grpc-listen", "0.0.0.0:8081", "--rls-config", "x.yaml", "--grpc-tls-cert", cert, "--grpc-tls-key", key}); err != nil {
		t.Fatal(err)
	}
	if err := o.check(0, false); err == nil || !strings.Contains(err.Error(), "--grpc-tls-client-ca") {
		t.Errorf("TLS without a client CA, no token: %v, want an error naming --grpc-tls-client-ca", err)
	}
	o.tls.clientCA = ca.File
	if err := o.check(0, false); err != nil {
		t.Errorf("mutual TLS, no token: %v", err)
	}
}

// limitd with --grpc-tls-cert, --grpc-tls-key and --grpc-tls-client-ca on
// a real Redis: a client with a certificate of the CA is answered by the
// rate limit service and the quota service (a stream) on the one door, as
// the caller its certificate names; a cleartext client is not.
func TestRunGRPCMutualTLS(t *testing.T) {
	srv := redistest.Start(t)
	ca, cert, key, clientCert, clientKey := tlsFiles(t)
	addr, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr(),
		"--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", ca.File, "--grpc-tls-client-san", "envoy.envoy-gateway-system"}, env())
	cfg, err := testpki.ClientConfig("127.0.0.1", clientCert, clientKey, ca.File)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(grpcAddr(t, logs), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}}
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req, grpc.WaitForReady(true))
	if err != nil || r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit over mutual TLS: %v %v\n%s", r, err, logs)
	}
	q, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "apis", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: map[string]string{"generic_key": "slow"}}, NumRequestsAllowed: 1,
	}}}); err != nil {
		t.Fatal(err)
	}
	qr, err := q.Recv()
	if err != nil || len(qr.BucketAction) != 1 || qr.BucketAction[0].GetQuotaAssignmentAction() == nil {
		t.Fatalf("the quota stream over mutual TLS: %v %v", qr, err)
	}
	_ = q.CloseSend()

	plain, err := grpc.NewClient(grpcAddr(t, logs), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pstop := context.WithTimeout(ctx, 5*time.Second)
	defer pstop()
	if _, err := pb.NewRateLimitServiceClient(plain).ShouldRateLimit(pctx, req); err == nil {
		t.Error("a cleartext client was answered")
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `limitd_rls_authorized_calls_total{caller="*.envoy-gateway-system"} 2`; !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if !strings.Contains(string(m), "\nlimitd_grpc_tls_handshake_failures_total ") || strings.Contains(string(m), "\nlimitd_grpc_tls_handshake_failures_total 0\n") {
		t.Error("/metrics: the cleartext client's failed handshakes are not counted")
	}
	stopRun(t, cancel, done)
}

// secretVolume lays files out as Kubernetes mounts a secret: each name a
// link to ..data/name, ..data a link to a timestamped folder; update swaps
// ..data to a new folder at once, as the kubelet does on rotation.
type secretVolume struct {
	t   *testing.T
	dir string
	n   int
}

func newSecretVolume(t *testing.T, files map[string]string) *secretVolume {
	t.Helper()
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.update(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// update writes files (name: the file whose content to copy) into a new
// folder and points ..data at it.
func (v *secretVolume) update(files map[string]string) {
	v.t.Helper()
	v.n++
	folder := fmt.Sprintf("..2026_11_29_%02d", v.n)
	if err := os.Mkdir(filepath.Join(v.dir, folder), 0o700); err != nil {
		v.t.Fatal(err)
	}
	for name, from := range files {
		b, err := os.ReadFile(from)
		if err != nil {
			v.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v.dir, folder, name), b, 0o600); err != nil {
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(folder, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// Certificates rotated as Kubernetes rotates a mounted secret (Envoy
// Gateway's certgen, cert-manager): a new CA, and limitd's and Envoy's
// certificates signed by it, swapped in at once. New connections get the
// new server certificate, and a client certificate of the new CA is
// accepted, while the old CA's is refused; no restart.
func TestRunGRPCTLSRotation(t *testing.T) {
	srv := redistest.Start(t)
	oldCA, oldCert, oldKey, oldClient, oldClientKey := tlsFiles(t)
	newCA, newCert, newKey, newClient, newClientKey := tlsFiles(t)
	vol := newSecretVolume(t, map[string]string{"tls.crt": oldCert, "tls.key": oldKey, "ca.crt": oldCA.File})
	_, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr(),
		"--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--grpc-tls-cert", vol.path("tls.crt"), "--grpc-tls-key", vol.path("tls.key"), "--grpc-tls-client-ca", vol.path("ca.crt")}, env())
	addr := grpcAddr(t, logs)
	// handshake runs one handshake with a client certificate (trusting
	// both CAs) and returns the server's certificate, or the handshake's
	// error.
	handshake := func(clientCert, clientKey string) (*x509.Certificate, error) {
		cfg, err := testpki.ClientConfig("127.0.0.1", clientCert, clientKey, oldCA.File, newCA.File)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil { // TLS 1.3: a refused client certificate shows here
			return nil, err
		}
		return c.ConnectionState().PeerCertificates[0], nil
	}
	if served, err := handshake(oldClient, oldClientKey); err != nil || served.CheckSignatureFrom(oldCA.Cert) != nil {
		t.Fatalf("before the rotation: %v, want a certificate of the old CA", err)
	}
	vol.update(map[string]string{"tls.crt": newCert, "tls.key": newKey, "ca.crt": newCA.File})
	var served *x509.Certificate
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // polling with a deadline: limitd looks at the files at most once a second
		if served, err = handshake(newClient, newClientKey); err == nil {
			break
		}
	}
	if err != nil || served.CheckSignatureFrom(newCA.Cert) != nil {
		t.Fatalf("after the rotation: %v, want the server's certificate of the new CA\n%s", err, logs)
	}
	if _, err := handshake(oldClient, oldClientKey); err == nil {
		t.Error("after the rotation, a client certificate of the old CA is accepted")
	}
	if !strings.Contains(logs.String(), "TLS files read again") {
		t.Errorf("no log of the rotation:\n%s", logs)
	}
	stopRun(t, cancel, done)
}
