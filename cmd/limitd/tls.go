package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
)

// grpcTLSOptions are the flags of the gRPC door's TLS (grpcdoor.TLSFiles):
// envoyproxy/ratelimit's GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT,
// GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT (GRPC_SERVER_TLS_CA_CERT) and
// GRPC_CLIENT_TLS_SAN map to them.
type grpcTLSOptions struct {
	cert, key, clientCA, clientSAN string
}

func (o *grpcTLSOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.cert, "grpc-tls-cert", "", "the gRPC door's TLS certificate chain (PEM; with --grpc-tls-key): --grpc-listen serves TLS instead of h2c; read again when the file changes")
	fs.StringVar(&o.key, "grpc-tls-key", "", "the private key of --grpc-tls-cert (PEM)")
	fs.StringVar(&o.clientCA, "grpc-tls-client-ca", "", "CA bundle (PEM) client certificates must chain to: mutual TLS, a certificate required; a verified certificate authenticates its caller (its first URI SAN, else DNS SAN, else CN) in place of a token")
	fs.StringVar(&o.clientSAN, "grpc-tls-client-san", "", "a name the client certificate must be valid for (a DNS SAN, wildcards included, or an IP SAN); needs --grpc-tls-client-ca")
}

// on reports whether TLS is asked for.
func (o *grpcTLSOptions) on() bool {
	return o.cert != "" || o.key != "" || o.clientCA != "" || o.clientSAN != ""
}

// mutual reports whether a client certificate authenticates callers.
func (o *grpcTLSOptions) mutual() bool { return o.clientCA != "" }

// check validates the flags together (the files are read when the door
// starts).
func (o *grpcTLSOptions) check(grpcListen string) error {
	switch {
	case !o.on():
		return nil
	case grpcListen == "":
		return errors.New("--grpc-tls-cert: needs --grpc-listen")
	case o.cert == "" && o.key != "":
		return errors.New("--grpc-tls-key: needs --grpc-tls-cert")
	case o.cert == "" || o.key == "" && o.clientCA != "":
		return errors.New("--grpc-tls-client-ca: needs --grpc-tls-cert and --grpc-tls-key")
	case o.key == "":
		return errors.New("--grpc-tls-cert: needs --grpc-tls-key")
	case o.clientSAN != "" && o.clientCA == "":
		return errors.New("--grpc-tls-client-san: needs --grpc-tls-client-ca")
	}
	return nil
}

// files are the door's TLS files, nil without TLS.
func (o *grpcTLSOptions) files() *grpcdoor.TLSFiles {
	if !o.on() {
		return nil
	}
	return &grpcdoor.TLSFiles{Cert: o.cert, Key: o.key, ClientCA: o.clientCA, ClientSAN: o.clientSAN}
}

// tlsFlagError names the flag of a TLS file the door refused.
func tlsFlagError(err error) error {
	var fe *grpcdoor.TLSFileError
	if errors.As(err, &fe) {
		return fmt.Errorf("--grpc-tls-%s: %w", fe.Which, err)
	}
	return err
}
