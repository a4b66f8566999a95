// Package rlsxds configures the rate limit service (package rls) over xDS:
// an aggregated discovery (ADS) client, state of the world, of one resource
// type, envoyproxy/ratelimit's RateLimitConfig (TypeURL), as Envoy Gateway's
// control plane serves it to the rate limit deployment.
//
// # Model
//
// Client.Run keeps one stream open to the server. It asks for TypeURL with
// the node (ID and metadata) and the additional headers as gRPC metadata.
// Each response is the whole configuration: every resource is rendered as
// a file of envoyproxy/ratelimit's YAML named "xds:<resource name>"
// (Render) and the set is parsed by rlsconfig.Parse, the one validation path
// of files, so a refusal reads as a file's would and a domain served twice
// is refused as two files of one domain are.
//
//   - A response that parses is applied (Options.Apply: the rls.Server's
//     SetConfig, as a file reload is: a bucket's name depends only on its
//     descriptor and limit, so buckets whose limit did not change keep their
//     tokens), counted (Options.Loaded(true)) and ACKed: the next request
//     carries its version_info and nonce. A response whose files are those
//     already applied (after a reconnection) is ACKed without a reload.
//   - A response that does not (wrong type URL, a resource that does not
//     decode, a configuration refused) is NACKed: the request carries the
//     version last ACKed, the response's nonce and error_detail (code
//     InvalidArgument, the reason as the message); it is counted
//     (Loaded(false)) and logged, and the last good configuration keeps
//     serving. A refusal that follows a refusal is sent after a back-off
//     (as below, doubling while refusals go on): a snapshot cache answers a
//     NACK at once with the same response while its version is not the one
//     ACKed. That same response is not converted, counted or logged again.
//   - A stream that fails (the server gone, a message over
//     Options.MaxMessageBytes, garbage on the connection) is opened again
//     after a back-off: Backoff.Initial doubling to Backoff.Max, each wait
//     drawn between half of it and all of it (jitter), reset once a stream
//     has carried a response. The configuration in use keeps serving.
//
// # Bounds
//
// A response is at most Options.MaxMessageBytes (default
// DefaultMaxMessageBytes, gRPC's own default and envoyproxy/ratelimit's)
// and at most rlsconfig.MaxFiles resources; each resource then meets
// rlsconfig's bounds. A response is handled before the next is read, so a
// flood of them costs one conversion at a time. A stream that never
// answers is not an error: the server may have nothing for this node yet.
package rlsxds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// DefaultMaxMessageBytes bounds one response unless Options say otherwise.
const DefaultMaxMessageBytes = 4 << 20

// Backoff is the wait between two streams: Initial after the first
// failure, doubled after each further one up to Max, each wait drawn
// uniformly between half of it and all of it.
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff is the back-off unless Options say otherwise.
var DefaultBackoff = Backoff{Initial: time.Second, Max: 30 * time.Second}

// Options configure a Client. Server and Apply are required.
type Options struct {
	// Server is the ADS server's host:port.
	Server string
	// NodeID and NodeMetadata name this client to the server (Envoy
	// Gateway serves the rate limit configuration to "envoy-ratelimit").
	NodeID       string
	NodeMetadata *structpb.Struct
	// TLS, when set, secures the connection (mutual TLS with a client
	// certificate); nil connects in plaintext.
	TLS *tls.Config
	// Headers are sent as gRPC metadata on the stream.
	Headers map[string]string
	// MaxMessageBytes bounds a response (default DefaultMaxMessageBytes).
	MaxMessageBytes int
	// Backoff between streams (default DefaultBackoff).
	Backoff Backoff
	// Apply makes a configuration the one in use (rls.Server.SetConfig).
	Apply func(*rlsconfig.Config)
	// Loaded counts a response applied (true) or refused (false)
	// (rls.Metrics.ConfigLoaded); optional.
	Loaded func(ok bool)
	// Logger receives the client's logs (default slog.Default()).
	Logger *slog.Logger
	// Wait waits d or until ctx ends (default a timer): tests pass their
	// own to run the back-off without real time.
	Wait func(ctx context.Context, d time.Duration) error
	// Rand is the jitter's source, in [0, 1) (default math/rand/v2).
	Rand func() float64
	// DialOptions are added to the connection's (tests: a dialer).
	DialOptions []grpc.DialOption
}

// Client is an ADS client of RateLimitConfig resources. Run it once; its
// other methods are safe for concurrent use.
type Client struct {
	o     Options
	log   *slog.Logger
	first chan struct{}

	mu      sync.Mutex
	version string // the version last ACKed
	sum     [sha256.Size]byte
	applied bool

	// refused is the digest of the response last refused, and repeats how
	// many times in a row it came again (the stream's goroutine alone).
	refused    [sha256.Size]byte
	repeats    int
	lastReason string // why it was refused ("": none refused since the last applied)
}

// New checks o and returns a Client; nothing connects before Run.
func New(o Options) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("rlsxds: options: server: required")
	}
	if o.Apply == nil {
		return nil, errors.New("rlsxds: options: apply: required")
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.Backoff.Initial <= 0 {
		o.Backoff.Initial = DefaultBackoff.Initial
	}
	if o.Backoff.Max < o.Backoff.Initial {
		o.Backoff.Max = max(DefaultBackoff.Max, o.Backoff.Initial)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Wait == nil {
		o.Wait = wait
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Loaded == nil {
		o.Loaded = func(bool) {}
	}
	return &Client{o: o, log: o.Logger, first: make(chan struct{})}, nil
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Configured is closed once a first configuration has been applied.
func (c *Client) Configured() <-chan struct{} { return c.first }

// Version is the version_info last ACKed ("" before the first).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Delay is the back-off before the stream that follows failures failed
// streams in a row (failures >= 1), before jitter: Initial doubled up to
// Max.
func (b Backoff) Delay(failures int) time.Duration {
	d := b.Initial
	for i := 1; i < failures && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// Run keeps a stream open until ctx ends, opening it again after a
// back-off when it fails. It returns ctx's error.
func (c *Client) Run(ctx context.Context) error {
	failures := 0
	for {
		answered, err := c.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if answered {
			failures = 0
		}
		failures++
		d := c.o.Backoff.Delay(failures)
		d = d/2 + time.Duration(c.o.Rand()*float64(d/2))
		c.log.Warn("rate limit service: xds stream ended; the configuration in use keeps serving",
			"server", c.o.Server, "err", err, "failures", failures, "retry_in", d.String())
		if err := c.o.Wait(ctx, d); err != nil {
			return err
		}
	}
}

// stream runs one stream: it reports whether the server answered at all,
// and why the stream ended.
func (c *Client) stream(ctx context.Context) (answered bool, err error) {
	creds := insecure.NewCredentials()
	if c.o.TLS != nil {
		creds = credentials.NewTLS(c.o.TLS)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.o.MaxMessageBytes)),
	}, c.o.DialOptions...)
	conn, err := grpc.NewClient(c.o.Server, opts...)
	if err != nil {
		return false, fmt.Errorf("rlsxds: %w", err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, metadata.New(c.o.Headers)))
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, fmt.Errorf("rlsxds: %w", err)
	}
	node := &core.Node{Id: c.o.NodeID, Metadata: c.o.NodeMetadata}
	// The first request names no version: the server sends what it has,
	// and what is already in use is not applied again.
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL}); err != nil {
		return false, fmt.Errorf("rlsxds: send: %w", err)
	}
	c.log.Info("rate limit service: xds stream open", "server", c.o.Server, "node", c.o.NodeID)
	for {
		resp, err := st.Recv()
		if err != nil {
			return answered, fmt.Errorf("rlsxds: receive: %w", err)
		}
		answered = true
		req, again := c.handle(resp, node)
		if again { // a refusal after a refusal
			c.repeats++
			d := c.o.Backoff.Delay(c.repeats)
			if err := c.o.Wait(ctx, d/2+time.Duration(c.o.Rand()*float64(d/2))); err != nil {
				return answered, err
			}
		}
		if err := st.Send(req); err != nil {
			return answered, fmt.Errorf("rlsxds: send: %w", err)
		}
	}
}

// handle applies a response or refuses it, and returns the ACK or NACK,
// and again: a refusal that follows a refusal, which the caller sends
// after a back-off (a snapshot cache answers a NACK at once with the same
// response, as long as its version is not the one ACKed). The response
// last refused, sent again, is neither converted, nor counted, nor logged
// again.
func (c *Client) handle(resp *discovery.DiscoveryResponse, node *core.Node) (req *discovery.DiscoveryRequest, again bool) {
	raw := rawDigest(resp)
	if c.lastReason != "" && raw == c.refused {
		return c.nack(resp, node, c.version, c.lastReason), true
	}
	cfg, files, err := c.check(resp)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.o.Loaded(false)
		c.log.Error("rate limit service: xds configuration refused (NACK); the previous one keeps serving",
			"version", resp.GetVersionInfo(), "nonce", resp.GetNonce(), "err", err)
		again = c.lastReason != ""
		c.refused, c.lastReason = raw, err.Error()
		return c.nack(resp, node, c.version, c.lastReason), again
	}
	c.lastReason, c.repeats = "", 0
	req = &discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
	sum := rlsconfig.Digest(files)
	if !c.applied || sum != c.sum {
		c.o.Apply(cfg)
		c.o.Loaded(true)
		c.log.Info("rate limit service: configuration loaded over xds", "version", resp.GetVersionInfo(),
			"resources", len(files), "domains", cfg.Domains())
		if !c.applied {
			close(c.first)
		}
		c.sum, c.applied = sum, true
	}
	c.version = resp.GetVersionInfo()
	req.VersionInfo = c.version
	return req, false
}

// nack refuses resp for reason, naming version, the one last ACKed.
func (c *Client) nack(resp *discovery.DiscoveryResponse, node *core.Node, version, reason string) *discovery.DiscoveryRequest {
	return &discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce(), VersionInfo: version,
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: reason}}
}

// rawDigest is a response's digest as received: its version, type and
// resources' bytes (not its nonce, which changes with each sending).
func rawDigest(resp *discovery.DiscoveryResponse) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(resp.GetVersionInfo()))
	h.Write([]byte{0})
	h.Write([]byte(resp.GetTypeUrl()))
	for _, r := range resp.GetResources() {
		h.Write([]byte{0})
		h.Write([]byte(r.GetTypeUrl()))
		h.Write([]byte{0})
		h.Write(r.GetValue())
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func (c *Client) check(resp *discovery.DiscoveryResponse) (*rlsconfig.Config, []rlsconfig.File, error) {
	if resp.GetTypeUrl() != TypeURL {
		return nil, nil, fmt.Errorf("rlsxds: type_url: want %s, got %q", TypeURL, resp.GetTypeUrl())
	}
	return Convert(resp.GetResources())
}

// TLSConfig is the client's TLS from files, as envoyproxy/ratelimit's
// CONFIG_GRPC_XDS_* variables name them: a client certificate and key
// (both or neither), the CA that signs the server's certificate (default:
// the system's), and the name the server's certificate must hold (default:
// the server's host). It is nil, plaintext, when no file is named.
func TLSConfig(certFile, keyFile, caFile, san string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && caFile == "" {
		if san != "" {
			return nil, errors.New("rlsxds: tls: a server name without a certificate, key or CA")
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: san}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("rlsxds: tls: a client certificate needs its key, and a key its certificate")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("rlsxds: tls: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("rlsxds: tls: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bytes.TrimSpace(pem)) {
			return nil, fmt.Errorf("rlsxds: tls: %s: no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
