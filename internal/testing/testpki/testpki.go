// Package testpki makes certificate authorities and the certificates they
// sign, as PEM files, for tests of limitd's TLS (the gRPC door's
// --grpc-tls-* flags): a CA, a server certificate, client certificates
// (expired ones, ones of another CA). Keys are ECDSA P-256. Test use only.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority whose files are in Dir.
type CA struct {
	Cert *x509.Certificate
	// File is the CA certificate's PEM file.
	File string
	Dir  string
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid from an hour before now to a day after, writing
// its certificate to dir/name-ca.crt.
func NewCA(dir, name string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("testpki: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("testpki: %w", err)
	}
	ca := &CA{Cert: cert, File: filepath.Join(dir, name+"-ca.crt"), Dir: dir, key: key}
	return ca, writePEM(ca.File, "CERTIFICATE", der)
}

// Leaf is a certificate to issue: its names, its life (zero: from an hour
// before now to a day after) and its use.
type Leaf struct {
	CN        string
	DNS       []string
	IPs       []net.IP
	URI       string
	NotBefore time.Time
	NotAfter  time.Time
	// Server: a server's extended key usage, else a client's.
	Server bool
}

// Issue signs l, writes dir/name.crt and dir/name.key, and returns their
// paths.
func (ca *CA) Issue(name string, l Leaf, now time.Time) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = now.Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = now.Add(24 * time.Hour)
	}
	usage := x509.ExtKeyUsageClientAuth
	if l.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: l.CN},
		DNSNames: l.DNS, IPAddresses: l.IPs, NotBefore: l.NotBefore, NotAfter: l.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if l.URI != "" {
		u, err := url.Parse(l.URI)
		if err != nil {
			return "", "", fmt.Errorf("testpki: uri: %w", err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("testpki: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("testpki: %w", err)
	}
	certFile, keyFile = filepath.Join(ca.Dir, name+".crt"), filepath.Join(ca.Dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "PRIVATE KEY", kder)
}

// Loopback is a server certificate's Leaf for 127.0.0.1, ::1 and
// localhost.
func Loopback(cn string) Leaf {
	return Leaf{CN: cn, DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, Server: true}
}

// ClientConfig is a client's TLS configuration trusting the CA files in
// roots (PEM), presenting the certificate and key files when set, with
// ALPN h2 and server name serverName.
func ClientConfig(serverName, certFile, keyFile string, roots ...string) (*tls.Config, error) {
	pool := x509.NewCertPool()
	for _, r := range roots {
		b, err := os.ReadFile(r)
		if err != nil {
			return nil, fmt.Errorf("testpki: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("testpki: %s: no PEM certificate", r)
		}
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("testpki: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("testpki: %w", err)
	}
	return nil
}
