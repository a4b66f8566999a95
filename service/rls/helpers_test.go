package rls

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// clock is a settable clock shared by a memory store and a Server.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) ns() int64 { return c.Now().UnixNano() }

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fixture is a rate limit service served over gRPC on a loopback port.
type fixture struct {
	t      *testing.T
	srv    *Server
	grpc   *grpcdoor.Host
	client pb.RateLimitServiceClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	dir    string
	w      *Watcher
}

type fixtureOpts struct {
	store       service.Store
	algo        rlsconfig.Algorithm
	now         func() time.Time
	tokens      []service.Token
	timeout     time.Duration
	maxKeyBytes int
	// identities and identityHeader: a front proxy's callers.
	identities     []service.Identity
	identityHeader string
	// options changes the Server's options last.
	options func(*Options)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// start serves yaml (one file, config.yaml, in a folder of its own) on
// o.store.
func start(t *testing.T, yaml string, o fixtureOpts) *fixture {
	t.Helper()
	f := &fixture{t: t, reg: prometheus.NewRegistry(), dir: t.TempDir()}
	f.write("config.yaml", yaml)
	m, err := NewMetrics(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Store: o.store, Algorithm: o.algo, Now: o.now, Logger: quiet, Metrics: m, Timeout: o.timeout,
		MaxKeyBytes: o.maxKeyBytes}
	if o.options != nil {
		o.options(&opts)
	}
	f.srv, err = NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if f.w, err = NewWatcher(f.dir, f.srv, quiet); err != nil {
		t.Fatal(err)
	}
	f.grpc, err = grpcdoor.New(grpcdoor.Options{Tokens: o.tokens, Identities: o.identities, IdentityHeader: o.identityHeader, Registerer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Register(f.grpc.Server())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.grpc.Serve(ln) }()
	f.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f.client = pb.NewRateLimitServiceClient(f.conn)
	t.Cleanup(func() {
		f.conn.Close()
		f.grpc.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return f
}

func (f *fixture) write(name, content string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// call sends req and fails the test on an error.
func (f *fixture) call(req *pb.RateLimitRequest) *pb.RateLimitResponse {
	f.t.Helper()
	resp, err := f.try(context.Background(), req)
	if err != nil {
		f.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func (f *fixture) try(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return f.client.ShouldRateLimit(ctx, req)
}

// counter is the value of a counter of f's registry with these labels (0
// when absent).
func (f *fixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return metricValue(m)
		}
	}
	return 0
}

func metricValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

// desc is a descriptor of key/value pairs.
func desc(kv ...string) *rlpb.RateLimitDescriptor {
	d := &rlpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlpb.RateLimitDescriptor, n uint64) *rlpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, ds ...*rlpb.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// codes lists the overall code and each status's code.
func codesOf(r *pb.RateLimitResponse) []pb.RateLimitResponse_Code {
	out := []pb.RateLimitResponse_Code{r.GetOverallCode()}
	for _, s := range r.GetStatuses() {
		out = append(out, s.GetCode())
	}
	return out
}

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
