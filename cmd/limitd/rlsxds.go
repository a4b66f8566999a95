package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsxds"
)

// xdsOptions are the flags of the rate limit service's configuration over
// xDS (package rlsxds), envoyproxy/ratelimit's CONFIG_GRPC_XDS_* variables
// by other names.
type xdsOptions struct {
	server, nodeID, nodeMetadata string
	cert, key, ca, san           string
	headers                      string
	startWithoutConfig           bool
	backoff, backoffMax          time.Duration
	maxRecvBytes                 int

	// read by check
	metadata *structpb.Struct
	header   map[string]string
	client   *rlsxds.Options
}

func (o *xdsOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.server, "rls-xds-server", "", "host:port of an ADS server (xDS, state of the world) that serves the rate limit service's configuration as RateLimitConfig resources, instead of --rls-config")
	fs.StringVar(&o.nodeID, "rls-xds-node-id", "default", "the node ID the xDS client gives (Envoy Gateway serves \"envoy-ratelimit\")")
	fs.StringVar(&o.nodeMetadata, "rls-xds-node-metadata", "", "the xDS client's node metadata: a JSON object")
	fs.StringVar(&o.cert, "rls-xds-tls-cert", "", "the xDS client's certificate (PEM), for mutual TLS; with --rls-xds-tls-key")
	fs.StringVar(&o.key, "rls-xds-tls-key", "", "the xDS client's private key (PEM)")
	fs.StringVar(&o.ca, "rls-xds-tls-ca", "", "the CA (PEM) that signs the xDS server's certificate; with no TLS flag the client connects in plaintext")
	fs.StringVar(&o.san, "rls-xds-tls-san", "", "the name the xDS server's certificate must hold (default: the host of --rls-xds-server)")
	fs.StringVar(&o.headers, "rls-xds-headers", "", "gRPC metadata the xDS client sends: k=v,k=v")
	fs.DurationVar(&o.backoff, "rls-xds-backoff", rlsxds.DefaultBackoff.Initial, "the xDS client's wait after a failed stream, doubled after each further failure, jittered")
	fs.DurationVar(&o.backoffMax, "rls-xds-backoff-max", rlsxds.DefaultBackoff.Max, "the longest wait between two xDS streams")
	fs.IntVar(&o.maxRecvBytes, "rls-xds-max-recv-bytes", rlsxds.DefaultMaxMessageBytes, "the largest xDS response; a larger one ends the stream")
	fs.BoolVar(&o.startWithoutConfig, "rls-start-without-config", false, "serve before the first configuration over xDS arrives (answering Unavailable until then); without it the gRPC port opens only once one is applied")
}

// check validates the flags; the TLS files are read here, so a missing
// one stops limitd from starting.
func (o *xdsOptions) check() error {
	if o.server == "" {
		for name, set := range map[string]bool{
			"--rls-xds-node-metadata": o.nodeMetadata != "", "--rls-xds-tls-cert": o.cert != "", "--rls-xds-tls-key": o.key != "",
			"--rls-xds-tls-ca": o.ca != "", "--rls-xds-tls-san": o.san != "", "--rls-xds-headers": o.headers != "",
			"--rls-start-without-config": o.startWithoutConfig,
			"--rls-xds-backoff":          o.backoff != rlsxds.DefaultBackoff.Initial,
			"--rls-xds-backoff-max":      o.backoffMax != rlsxds.DefaultBackoff.Max,
			"--rls-xds-max-recv-bytes":   o.maxRecvBytes != rlsxds.DefaultMaxMessageBytes,
		} {
			if set {
				return fmt.Errorf("%s: needs --rls-xds-server", name)
			}
		}
		return nil
	}
	switch {
	case o.backoff <= 0:
		return fmt.Errorf("--rls-xds-backoff: must be > 0, got %v", o.backoff)
	case o.backoffMax < o.backoff:
		return fmt.Errorf("--rls-xds-backoff-max: must be >= --rls-xds-backoff (%v), got %v", o.backoff, o.backoffMax)
	case o.maxRecvBytes <= 0:
		return fmt.Errorf("--rls-xds-max-recv-bytes: must be > 0, got %d", o.maxRecvBytes)
	}
	if o.nodeMetadata != "" {
		var m map[string]any
		if err := json.Unmarshal([]byte(o.nodeMetadata), &m); err != nil || m == nil {
			return fmt.Errorf("--rls-xds-node-metadata: want a JSON object, got %q", o.nodeMetadata)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return fmt.Errorf("--rls-xds-node-metadata: %w", err)
		}
		o.metadata = s
	}
	o.header = map[string]string{}
	if o.headers != "" {
		for _, kv := range strings.Split(o.headers, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("--rls-xds-headers: want k=v,k=v, got %q", kv)
			}
			o.header[strings.TrimSpace(k)] = v
		}
	}
	tlsc, err := rlsxds.TLSConfig(o.cert, o.key, o.ca, o.san)
	if err != nil {
		return fmt.Errorf("--rls-xds-tls-*: %w", err)
	}
	o.client = &rlsxds.Options{Server: o.server, NodeID: o.nodeID, NodeMetadata: o.metadata, TLS: tlsc, Headers: o.header,
		Backoff: rlsxds.Backoff{Initial: o.backoff, Max: o.backoffMax}, MaxMessageBytes: o.maxRecvBytes}
	return nil
}

// startXDS runs the xDS client on srv until ctx ends and, unless
// --rls-start-without-config, waits for its first configuration.
func startXDS(ctx context.Context, o *xdsOptions, srv *rls.Server, m *rls.Metrics, log *slog.Logger) error {
	opts := *o.client
	opts.Apply, opts.Loaded, opts.Logger = srv.SetConfig, m.ConfigLoaded, log
	c, err := rlsxds.New(opts)
	if err != nil {
		return fmt.Errorf("--rls-xds-server: %w", err)
	}
	go func() { _ = c.Run(ctx) }()
	if o.startWithoutConfig {
		log.Info("rate limit service: serving before its first configuration over xds (answering Unavailable until then)", "server", o.server)
		return nil
	}
	log.Info("rate limit service: waiting for the first configuration over xds before serving", "server", o.server, "node", o.nodeID)
	select {
	case <-c.Configured():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("--rls-xds-server %s: stopped before a first configuration arrived", o.server)
	}
}
