package grpcdoor

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// TLS on the door. With Options.TLS set, every connection the guard admits
// runs a TLS handshake (TLS 1.2 at least, 1.3 preferred, ALPN h2) inside
// the door's credentials, so everything above the handshake is as for
// cleartext: the rapid-reset scanner reads the decrypted HTTP/2 frames, the
// guard counts the connection from its accept (a connection whose handshake
// never ends is an anonymous one, evicted at the cap after its grace and
// closed at HandshakeTimeout), and a failed handshake closes the connection
// and is counted (limitd_grpc_tls_handshake_failures_total).
//
// With ClientCA set, a client must present a certificate that chains to it
// (only to it: not to the system's roots) for client authentication; with
// ClientSAN too, that certificate must also be valid for ClientSAN as a
// host name is (a DNS SAN, wildcards included, or an IP SAN: what
// envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN checks). A verified
// certificate authenticates its connection from the handshake on (the
// guard never evicts it) and names the caller of each call on it that
// carries no bearer token: CertCaller. A call that carries a token is the
// token's caller (the token wins), refused if the token is wrong.
//
// The files are read again when they change (Kubernetes rotates a
// secret's files in place): at most once per ReloadInterval, on a
// handshake, the door compares each file's modification time and size with
// those it last read, and parses the three again only when one differs.
// Files that do not parse, or a key that does not match its certificate,
// are logged and the last good ones keep serving; they are not read again
// until they change.

// ReloadInterval is the least time between two checks of the TLS files.
const ReloadInterval = time.Second

// TLSFiles name the door's certificate files (PEM).
type TLSFiles struct {
	// Cert and Key are the server's certificate chain and private key:
	// both required.
	Cert, Key string
	// ClientCA, when set, is the CA bundle client certificates must chain
	// to: mutual TLS, a certificate required.
	ClientCA string
	// ClientSAN, when set (only with ClientCA), is a name the client
	// certificate must be valid for.
	ClientSAN string
}

// TLSFileError is a TLS file refused: which one (Which: "cert", for the
// certificate and its key, or "client-ca"), and why.
type TLSFileError struct {
	Which string
	Err   error
}

func (e *TLSFileError) Error() string { return "grpcdoor: tls: " + e.Which + ": " + e.Err.Error() }

func (e *TLSFileError) Unwrap() error { return e.Err }

// stamp is what tells that a file changed.
type stamp struct {
	mod  time.Time
	size int64
}

// certStore holds the door's current TLS configuration, read again from
// the files when they change. It is safe for concurrent use.
type certStore struct {
	files TLSFiles
	log   *slog.Logger

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	cfg     *tls.Config
}

// newCertStore reads the files once: an error here refuses the start.
func newCertStore(files TLSFiles, now time.Time, log *slog.Logger) (*certStore, error) {
	switch {
	case files.Cert == "" || files.Key == "":
		return nil, errors.New("grpcdoor: tls: a certificate and its key are both required")
	case files.ClientSAN != "" && files.ClientCA == "":
		return nil, errors.New("grpcdoor: tls: a client SAN needs a client CA")
	}
	s := &certStore{files: files, log: log, checked: now}
	s.stamps = s.stat()
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cfg = cfg
	return s, nil
}

func (s *certStore) paths() [3]string { return [3]string{s.files.Cert, s.files.Key, s.files.ClientCA} }

func (s *certStore) stat() [3]stamp {
	var st [3]stamp
	for i, p := range s.paths() {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			st[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return st
}

// config returns the configuration to serve a handshake at now with,
// reading the files again if ReloadInterval has passed since the last
// check and one of them changed.
func (s *certStore) config(now time.Time) *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.checked) < ReloadInterval && !now.Before(s.checked) {
		return s.cfg
	}
	s.checked = now
	st := s.stat()
	if st == s.stamps {
		return s.cfg
	}
	s.stamps = st
	cfg, err := s.load()
	if err != nil {
		s.log.Error("grpc door: TLS files changed but are refused; the last good ones keep serving", "err", err)
		return s.cfg
	}
	s.log.Info("grpc door: TLS files read again", "cert", s.files.Cert, "client_ca", s.files.ClientCA)
	s.cfg = cfg
	return cfg
}

// load parses the files into a configuration.
func (s *certStore) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return nil, &TLSFileError{"cert", fmt.Errorf("certificate %s, key %s: %w", s.files.Cert, s.files.Key, err)}
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
		Certificates: []tls.Certificate{cert},
	}
	if s.files.ClientCA == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(s.files.ClientCA)
	if err != nil {
		return nil, &TLSFileError{"client-ca", err}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &TLSFileError{"client-ca", fmt.Errorf("%s: no PEM certificate in it", s.files.ClientCA)}
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	san := s.files.ClientSAN
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
			return errors.New("grpcdoor: tls: no verified client certificate")
		}
		leaf := cs.PeerCertificates[0]
		if san != "" {
			if err := leaf.VerifyHostname(san); err != nil {
				return fmt.Errorf("grpcdoor: tls: client certificate: %w", err)
			}
		}
		_, err := CertCaller(leaf)
		return err
	}
	return cfg, nil
}

// CertCaller is the caller a verified client certificate names: its first
// URI SAN, else its first DNS SAN, else its subject's common name. The name
// must be a valid caller (service.CheckCaller: printable ASCII, no spaces,
// at most service.MaxCallerBytes); a certificate naming none is refused at
// the handshake.
func CertCaller(c *x509.Certificate) (string, error) {
	var name string
	switch {
	case len(c.URIs) > 0:
		name = c.URIs[0].String()
	case len(c.DNSNames) > 0:
		name = c.DNSNames[0]
	default:
		name = c.Subject.CommonName
	}
	if err := service.CheckCaller(name); err != nil {
		return "", fmt.Errorf("grpcdoor: tls: client certificate names no caller (first URI SAN, else DNS SAN, else CN): %w", err)
	}
	return name, nil
}
