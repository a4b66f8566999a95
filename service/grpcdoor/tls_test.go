package grpcdoor

import (
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/testpki"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

// pki is a CA made in the test (package testpki), and the certificates it
// signs.
type pki struct {
	t *testing.T
	*testpki.CA
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, err := testpki.NewCA(t.TempDir(), name, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, CA: ca}
}

// leaf is a certificate's names and life.
type leaf = testpki.Leaf

// issue signs l and returns the certificate's and the key's files, and the
// key pair.
func (p *pki) issue(name string, l leaf) (certFile, keyFile string, pair tls.Certificate) {
	p.t.Helper()
	certFile, keyFile, err := p.Issue(name, l, time.Now())
	if err != nil {
		p.t.Fatal(err)
	}
	if pair, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		p.t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// serverFiles issues the door's certificate (for 127.0.0.1) and returns
// the door's TLS files with clientCA ("" for TLS without client
// certificates).
func (p *pki) serverFiles(clientCA string) *TLSFiles {
	cert, key, _ := p.issue("server", leaf{CN: "limitd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	return &TLSFiles{Cert: cert, Key: key, ClientCA: clientCA}
}

// clientTLS is a client's TLS configuration trusting ca, with certs.
func clientTLS(ca *pki, certs ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool, Certificates: certs, ServerName: "127.0.0.1", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
}

func (d *door) tlsClient(cfg *tls.Config) *grpc.ClientConn {
	d.t.Helper()
	cc, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { cc.Close() })
	return cc
}

// handshake dials the door and runs a TLS handshake with cfg.
func handshake(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	// TLS 1.3: the server checks the client's certificate after the
	// client's handshake ends; a refusal arrives as the first read's error.
	_ = tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		c.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// A verified client certificate names its caller (URI SAN, else DNS SAN,
// else CN) on a door without tokens; no certificate, one from another CA,
// an expired one and a server's (no client usage) fail the handshake, which
// is counted; a cleartext client is not served.
func TestTLSClientCertificates(t *testing.T) {
	ca, other := newPKI(t, "ca"), newPKI(t, "other")
	d := startDoor(t, Options{TLS: ca.serverFiles(ca.File)})
	for _, c := range []struct {
		name string
		leaf leaf
		want string
	}{
		{"uri", leaf{CN: "cn-1", DNS: []string{"gw.example"}, URI: "spiffe://cluster.local/ns/eg/sa/envoy"}, "spiffe://cluster.local/ns/eg/sa/envoy"},
		{"dns", leaf{CN: "cn-2", DNS: []string{"*.envoy-gateway-system", "b"}}, "*.envoy-gateway-system"},
		{"cn", leaf{CN: "envoy"}, "envoy"},
	} {
		_, _, pair := ca.issue(c.name, c.leaf)
		if got, err := echo(d.tlsClient(clientTLS(ca, pair))); err != nil || got != c.want {
			t.Errorf("%s: %q %v, want the caller %q", c.name, got, err, c.want)
		}
	}
	_, _, stranger := other.issue("stranger", leaf{CN: "envoy"})
	_, _, expired := ca.issue("expired", leaf{CN: "envoy", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	_, _, server := ca.issue("server-usage", leaf{CN: "envoy", Server: true})
	_, _, spaced := ca.issue("spaced", leaf{CN: "Envoy Gateway"})
	for name, cfg := range map[string]*tls.Config{
		"no certificate":           clientTLS(ca),
		"another CA's":             clientTLS(ca, stranger),
		"expired":                  clientTLS(ca, expired),
		"a server's":               clientTLS(ca, server),
		"a name that is no caller": clientTLS(ca, spaced),
	} {
		if c, err := handshake(d.addr, cfg); err == nil {
			c.Close()
			t.Errorf("%s: the handshake succeeded", name)
		}
	}
	if got := d.waitCounter("limitd_grpc_tls_handshake_failures_total", 5); got != 5 {
		t.Errorf("handshake failures %v, want 5", got)
	}
	if _, err := echo(d.client()); err == nil {
		t.Error("a cleartext client was served")
	}
}

// With tokens and a client CA, a call's token names its caller (the token
// wins over the certificate), a wrong token is refused, and a call without
// one is the certificate's; without a client CA, TLS only encrypts and the
// token is needed.
func TestTLSTokens(t *testing.T) {
	ca := newPKI(t, "ca")
	d := startDoor(t, Options{Tokens: testTokens[:1], TLS: ca.serverFiles(ca.File)})
	_, _, pair := ca.issue("envoy", leaf{CN: "envoy"})
	cc := d.tlsClient(clientTLS(ca, pair))
	for _, c := range []struct {
		name string
		md   []string
		want string
	}{
		{"certificate only", nil, "envoy"},
		{"certificate and token", []string{"authorization", "Bearer gw-secret"}, "gw"},
		{"certificate and a wrong token", []string{"authorization", "Bearer nope"}, ""},
	} {
		got, err := echo(cc, c.md...)
		switch {
		case c.want == "" && status.Code(err) != codes.Unauthenticated:
			t.Errorf("%s: %q %v, want Unauthenticated", c.name, got, err)
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%s: %q %v, want the caller %q", c.name, got, err, c.want)
		}
	}

	plain := startDoor(t, Options{Tokens: testTokens[:1], TLS: ca.serverFiles("")})
	cc = plain.tlsClient(clientTLS(ca, pair)) // its certificate is not asked for
	if _, err := echo(cc); status.Code(err) != codes.Unauthenticated {
		t.Errorf("TLS without a client CA, no token: %v, want Unauthenticated", err)
	}
	if got, err := echo(cc, "authorization", "Bearer gw-secret"); err != nil || got != "gw" {
		t.Errorf("TLS without a client CA, a token: %q %v, want gw", got, err)
	}
}

// ClientSAN: the client certificate must be valid for that name as a host
// name is (a DNS SAN, a wildcard one too, or an IP SAN), as
// envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN.
func TestTLSClientSAN(t *testing.T) {
	ca := newPKI(t, "ca")
	files := ca.serverFiles(ca.File)
	files.ClientSAN = "envoy.eg.svc"
	d := startDoor(t, Options{TLS: files})
	for _, c := range []struct {
		leaf leaf
		ok   bool
	}{
		{leaf{CN: "a", DNS: []string{"envoy.eg.svc"}}, true},
		{leaf{CN: "b", DNS: []string{"x.example", "*.eg.svc"}}, true},
		{leaf{CN: "envoy.eg.svc"}, false},
		{leaf{CN: "c", DNS: []string{"other.eg.example"}}, false},
		{leaf{CN: "d", URI: "spiffe://envoy.eg.svc"}, false},
	} {
		_, _, pair := ca.issue(c.leaf.CN, c.leaf)
		conn, err := handshake(d.addr, clientTLS(ca, pair))
		if err == nil {
			conn.Close()
		}
		if (err == nil) != c.ok {
			t.Errorf("%+v: handshake %v, want ok %v", c.leaf, err, c.ok)
		}
	}
}

// The files are read again when they change, at most once per
// ReloadInterval: a rotated server certificate is served to the next
// connections; a broken one is refused and the last good one serves on.
func TestTLSReload(t *testing.T) {
	ca := newPKI(t, "ca")
	files := ca.serverFiles("")
	d := startDoor(t, Options{TLS: files})
	served := func() *big.Int {
		t.Helper()
		c, err := tls.Dial("tcp", d.addr, clientTLS(ca))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	first := served()
	cert, key, _ := ca.issue("rotated", leaf{CN: "limitd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	rotate := func(from, to string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Minute) // a distinct modification time, whatever the file system's granularity
		if err := os.Chtimes(to, later, later); err != nil {
			t.Fatal(err)
		}
	}
	rotate(cert, files.Cert)
	rotate(key, files.Key)
	if got := served(); got.Cmp(first) != 0 {
		t.Errorf("the certificate changed before ReloadInterval passed: serial %v, want %v", got, first)
	}
	d.clock.add(ReloadInterval)
	second := served()
	if second.Cmp(first) == 0 {
		t.Fatalf("the rotated certificate is not served after ReloadInterval: serial %v", second)
	}
	if err := os.WriteFile(files.Cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.clock.add(ReloadInterval)
	if got := served(); got.Cmp(second) != 0 {
		t.Errorf("after a broken file: serial %v, want the last good %v", got, second)
	}
}

// Rapid reset over TLS: the scanner reads the decrypted frames, so a
// client resetting streams faster than its budget is closed as in
// cleartext.
func TestTLSRapidResetCloses(t *testing.T) {
	ca := newPKI(t, "ca")
	_, _, pair := ca.issue("envoy", leaf{CN: "envoy"})
	d := startDoor(t, Options{TLS: ca.serverFiles(ca.File), ResetBurst: 20})
	r := dialRawTLS(t, d.addr, clientTLS(ca, pair))
	for i := range 1000 {
		id, err := r.tryOpen(echoMethod, "")
		if err == nil {
			err = r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		if err != nil {
			t.Logf("closed after %d resets: %v", i+1, err)
			break
		}
	}
	if !r.closed() {
		t.Fatal("the TLS connection resetting streams stays open")
	}
	if got := d.counter("limitd_grpc_reset_closed_total"); got != 1 {
		t.Errorf("closed for resets %v, want 1", got)
	}
}

// A connection whose handshake never ends (a ClientHello's first bytes) is
// an anonymous connection: at the cap it is evicted after its grace; a
// client with a verified certificate is authenticated from its handshake
// (never evicted, even before its first call), so a new connection beyond
// the cap is then closed.
func TestTLSUnfinishedHandshakeEvicted(t *testing.T) {
	ca := newPKI(t, "ca")
	_, _, pair := ca.issue("envoy", leaf{CN: "envoy"})
	d := startDoor(t, Options{TLS: ca.serverFiles(ca.File), MaxConns: 2})
	gw, err := handshake(d.addr, clientTLS(ca, pair))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	slow, err := net.DialTimeout("tcp", d.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := slow.Write([]byte{0x16, 0x03, 0x01}); err != nil { // a record header, and no more
		t.Fatal(err)
	}
	waitConns(t, d, 2)
	d.clock.add(2 * service.DefaultConnGrace)
	next, err := net.DialTimeout("tcp", d.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if !(&rawConn{c: slow}).closed() {
		t.Fatal("the unfinished handshake was not evicted for a new connection")
	}
	waitConns(t, d, 2) // the authenticated one and the new, fresh one
	if c, err := handshake(d.addr, clientTLS(ca, pair)); err == nil {
		c.Close()
		t.Fatal("a connection beyond the cap was served (the authenticated one or the unfinished one was evicted?)")
	}
	if _, err := gw.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatalf("the authenticated client's connection: %v", err)
	}
}

// waitConns waits (bounded) until the door has n connections open: the
// guard admits a connection on the server's accepting goroutine.
func waitConns(t *testing.T, d *door, n int) {
	t.Helper()
	for range 2000 {
		if d.h.Conns() == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d connections open, want %d", d.h.Conns(), n)
}

// dialRawTLS is dialRaw over a TLS client connection.
func dialRawTLS(t *testing.T, addr string, cfg *tls.Config) *rawConn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := rawOver(c)
	if err != nil {
		t.Fatalf("raw connection: %v", err)
	}
	r.t = t
	t.Cleanup(func() { r.c.Close() })
	return r
}
