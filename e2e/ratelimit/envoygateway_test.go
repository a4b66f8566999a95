// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// Envoy Gateway's own control plane as the xDS server of a rate limit
// service: Envoy Gateway v1.9.1 (its binary, `make test-envoy-gateway`)
// runs standalone, as on a host without Kubernetes (provider Custom, file
// resources, host infrastructure), with global limits on. Its rate limit
// xDS server (port 18001, fixed in Envoy Gateway, on every address; the
// tests dial 127.0.0.1) serves a RateLimitConfig for each Gateway listener
// with a global BackendTrafficPolicy. Envoy Gateway deploys no rate limit
// service in that mode (CreateOrUpdateRateLimitInfra is "not supported yet
// for host infrastructure"), so the test starts each service itself, with
// the environment Envoy Gateway gives its own deployment, and asks it
// directly: the Envoy that Envoy Gateway runs on a host rejects its rate
// limit cluster (whose TLS files are the Kubernetes paths, /certs/ca.crt),
// and would call the service at its Kubernetes name
// (envoy-ratelimit.<namespace>.svc.cluster.local:8081) in any case.

const (
	// egRateLimitXDSPort is Envoy Gateway's rate limit xDS port
	// (XdsGrpcSotwConfigServerPort), egNodeID the node ID its snapshot is
	// keyed by (InfraName): neither can be configured.
	egRateLimitXDSPort = 18001
	egNodeID           = "envoy-ratelimit"
	// egStartTimeout bounds Envoy Gateway's start until it serves the
	// policy's RateLimitConfig (a loaded machine: generous).
	egStartTimeout = 120 * time.Second
	// egLimit is the policy's limit, examples/envoy-gateway/global.yaml's:
	// egLimit requests a minute per key (egUnit, egWindow). A fixed
	// window's edge that falls inside a run replays it with a fresh key.
	egLimit = 5
	// egPolicy holds the BackendTrafficPolicy the test gives Envoy
	// Gateway: the example's own.
	egPolicy = "../../examples/envoy-gateway/global.yaml"
	egUnit   = rlconfv3.RateLimitUnit_MINUTE
	egWindow = time.Minute
)

// egControlPlane is a running Envoy Gateway: where its rate limit xDS
// server is and the files a client needs for its mutual TLS (the
// certificates Envoy Gateway's certgen writes for its own rate limit
// deployment, envoy-rate-limit/).
type egControlPlane struct {
	url, san                string // dial url, verify the server's certificate for san
	cert, key, ca           string // client certificate, key, and the CA of both sides
	log                     func() string
	exited                  <-chan struct{} // closed when Envoy Gateway has exited
	redisAddr               string
	gatewayPort, adminPort  int
	resourcesDir, configDir string

	bin, configPath, logPath string
	envoyVersion             string
	backendPort              int
	stop                     func() // stops Envoy Gateway and the Envoy it runs
}

// xdsService is one rate limit service configured over xDS: start runs it
// against Envoy Gateway's control plane and returns the address of its
// RateLimitService (plain gRPC, loopback). Adding limitd is one more row of
// xdsServices: envoyproxy/ratelimit and build/ratelimit with the
// environment below, and limitd with its --rls-xds-* flags.
type xdsService struct {
	name  string
	start func(t *testing.T, cp *egControlPlane) string
}

// xdsServices are the services TestEnvoyGatewayControlPlane runs.
var xdsServices = []xdsService{
	{name: "envoyproxy-ratelimit", start: startReferenceEG},
	{name: "limitd-ratelimit-mode", start: func(t *testing.T, cp *egControlPlane) string {
		return startWithEnv(t, cp, compatBinary(t), "LIMITD_ALGORITHM=fixed_window")
	}},
	{name: "limitd-flags", start: startLimitdEG},
}

// egEnv is the environment Envoy Gateway v1.9.1 gives its rate limit
// deployment for xDS (expectedRateLimitContainerEnv in
// internal/infrastructure/kubernetes/ratelimit/resource.go), with the
// files and the server's address of cp; the SAN, which Envoy Gateway
// leaves to the Kubernetes service name, is the certificate's here.
func egEnv(cp *egControlPlane) []string {
	return []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + cp.url,
		"CONFIG_GRPC_XDS_NODE_ID=" + egNodeID,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + cp.cert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + cp.key,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + cp.ca,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=" + cp.san,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false",
	}
}

// startReferenceEG runs envoyproxy/ratelimit (build/envoy-ratelimit/
// service_cmd) in its GRPC_XDS_SOTW mode against cp.
func startReferenceEG(t *testing.T, cp *egControlPlane) string {
	t.Helper()
	return startWithEnv(t, cp, "")
}

// startLimitdEG runs build/limitd configured by its flags as a client of
// cp's xDS server (the files and node Envoy Gateway gives its own), fixed
// windows, on a redis-server of its own.
func startLimitdEG(t *testing.T, cp *egControlPlane) string {
	t.Helper()
	p := startLimitdWith(t, limitdBinary(t), []string{"--rls-xds-server", cp.url, "--rls-xds-node-id", egNodeID,
		"--rls-xds-tls-cert", cp.cert, "--rls-xds-tls-key", cp.key, "--rls-xds-tls-ca", cp.ca, "--rls-xds-tls-san", cp.san,
		"--rls-start-without-config", "--rls-algorithm", "fixed_window"}, nil, true)
	return "127.0.0.1:" + strconv.Itoa(p.grpcPort)
}

// startWithEnv runs bin ("": envoyproxy/ratelimit's; limitd's
// build/ratelimit) configured only by envoyproxy/ratelimit's environment,
// Envoy Gateway's for xDS (egEnv) and env, on cp's Redis, and waits until
// it has loaded a configuration.
func startWithEnv(t *testing.T, cp *egControlPlane, bin string, env ...string) string {
	t.Helper()
	opts := envoyratelimit.Options{Binary: bin, RedisAddr: cp.redisAddr, Env: append(egEnv(cp), env...),
		StartTimeout: egStartTimeout}
	if bin != "" {
		opts.ConfiguredLines = []string{"configuration loaded"} // limitd's log line
	}
	s, err := envoyratelimit.StartServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the service's log tail:\n%s", logtext.Tail(s.Log(), 30))
		}
		s.Stop()
	})
	return s.GRPCAddr()
}

// envoyGatewayBinary is $ENVOY_GATEWAY_BIN: `make test-envoy-gateway`
// builds Envoy Gateway and sets it. Unset, the test skips, even under
// CI=true: the build is long and not part of `make test`. Set to a path
// that holds no program, the test fails.
func envoyGatewayBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("ENVOY_GATEWAY_BIN")
	if p == "" {
		t.Skip("ENVOY_GATEWAY_BIN is unset: `make test-envoy-gateway` builds Envoy Gateway and runs this test")
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		t.Fatalf("ENVOY_GATEWAY_BIN=%q names no program", p)
	}
	return p
}

// egConfig is Envoy Gateway's own configuration: standalone (file
// resources from dir, host infrastructure under home), global limits on
// Redis at redisAddr, its admin server on a loopback port, no metrics
// server.
const egConfig = `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: [%q]
    infrastructure:
      type: Host
      host:
        configHome: %q
        dataHome: %q
        stateHome: %q
        runtimeDir: %q
logging:
  level:
    default: info
admin:
  address:
    host: 127.0.0.1
    port: %d
telemetry:
  metrics:
    prometheus:
      disable: true
rateLimit:
  backend:
    type: Redis
    redis:
      url: %q
extensionApis:
  enableBackend: true
`

// egResources are the file resources but the policy: a Gateway whose
// proxies run the project's Envoy (envoyVersion, from the data home the
// test links), and an HTTPRoute named as the example's, to a Backend on a
// loopback port where nothing listens.
const egResources = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
  parametersRef:
    group: gateway.envoyproxy.io
    kind: EnvoyProxy
    name: host-envoy
    namespace: default
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyProxy
metadata:
  name: host-envoy
  namespace: default
spec:
  provider:
    type: Host
    host:
      envoyVersion: %q
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  listeners:
  - name: http
    protocol: HTTP
    port: %d
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: backend
  namespace: default
spec:
  parentRefs:
  - name: eg
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /
    backendRefs:
    - group: gateway.envoyproxy.io
      kind: Backend
      name: backend
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: backend
  namespace: default
spec:
  endpoints:
  - ip:
      address: 127.0.0.1
      port: %d
`

// startEnvoyGateway writes Envoy Gateway's configuration, certificates
// and file resources (the example's policy, egLimit a minute) for a new
// redis-server, and starts it; egLimitConfig waits until it serves the
// policy. It is stopped when t ends.
func startEnvoyGateway(t *testing.T) *egControlPlane {
	t.Helper()
	bin := envoyGatewayBinary(t)
	envoyBin := envoy.DefaultBinary()
	if _, err := os.Stat(envoyBin); err != nil {
		t.Fatalf("no Envoy at %s for Envoy Gateway's proxies (FUNC_E_DATA_HOME, ENVOY_VERSION: `make setup`): %v", envoyBin, err)
	}
	r := redistest.Start(t)
	dir := t.TempDir()
	cp := &egControlPlane{redisAddr: r.Addr(), resourcesDir: filepath.Join(dir, "resources"), configDir: filepath.Join(dir, "config")}
	home := filepath.Join(dir, "home")
	data := filepath.Join(home, "data")
	version := filepath.Base(filepath.Dir(filepath.Dir(envoyBin)))
	// The host infrastructure runs Envoy through func-e from its data
	// home: the project's Envoy there, so that nothing is downloaded.
	if err := os.MkdirAll(filepath.Join(data, "envoy-versions"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(filepath.Dir(envoyBin)), filepath.Join(data, "envoy-versions", version)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{cp.resourcesDir, cp.configDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if cp.adminPort, err = loopback.FreePort(); err != nil {
		t.Fatal(err)
	}
	if cp.gatewayPort, err = loopback.FreePort(); err != nil {
		t.Fatal(err)
	}
	backendPort, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	configHome := filepath.Join(home, "config")
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cp.bin, cp.envoyVersion, cp.backendPort = bin, version, backendPort
	cp.writePolicy(t, egLimit)
	configPath := filepath.Join(cp.configDir, "envoy-gateway.yaml")
	cp.configPath = configPath
	// Envoy Gateway's validation refuses an IP address with a port as the
	// Redis URL (url.Parse of "127.0.0.1:6379" fails): a host name with a
	// port parses. On a host it only checks the URL; the services below
	// get Redis's address themselves.
	_, redisPort, err := net.SplitHostPort(cp.redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	write(configPath, fmt.Sprintf(egConfig, cp.resourcesDir, configHome, data, filepath.Join(home, "state"),
		filepath.Join(home, "run"), cp.adminPort, "localhost:"+redisPort))

	// The control plane's certificates, as `envoy-gateway certgen --local`
	// writes them for a host: envoy-gateway/ (its servers),
	// envoy-rate-limit/ (the rate limit service's client side), one CA.
	cp.logPath = filepath.Join(dir, "envoy-gateway.log")
	cp.log = func() string { b, _ := os.ReadFile(cp.logPath); return string(b) }
	ctx, cancel := context.WithTimeout(context.Background(), egStartTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "certgen", "--local", "--config-home", configHome).CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen --local: %v\n%s", err, logtext.Tail(string(out), 20))
	}
	rl := filepath.Join(configHome, "certs", "envoy-rate-limit")
	cp.cert, cp.key, cp.ca = filepath.Join(rl, "tls.crt"), filepath.Join(rl, "tls.key"), filepath.Join(rl, "ca.crt")
	if cp.san, err = firstDNSName(filepath.Join(configHome, "certs", "envoy-gateway", "tls.crt")); err != nil {
		t.Fatal(err)
	}
	cp.url = "127.0.0.1:" + strconv.Itoa(egRateLimitXDSPort)

	cp.start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Envoy Gateway's log tail:\n%s", logtext.Tail(cp.log(), 40))
		}
		cp.stop()
	})
	return cp
}

// writePolicy writes the file resources with the example's policy, its
// limit set to requests; a running Envoy Gateway watches the file.
func (cp *egControlPlane) writePolicy(t *testing.T, requests int) {
	t.Helper()
	b, err := os.ReadFile(egPolicy)
	if err != nil {
		t.Fatal(err)
	}
	var policy string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: BackendTrafficPolicy\n") {
			policy = doc
		}
	}
	want := fmt.Sprintf("requests: %d\n", egLimit)
	if !strings.Contains(policy, want) || !strings.Contains(policy, "unit: Minute\n") {
		t.Fatalf("%s: no BackendTrafficPolicy with %q and a unit of Minute", egPolicy, want)
	}
	policy = strings.Replace(policy, want, fmt.Sprintf("requests: %d\n", requests), 1)
	text := fmt.Sprintf(egResources, cp.envoyVersion, cp.gatewayPort, cp.backendPort) + "---\n" + policy
	if err := os.WriteFile(filepath.Join(cp.resourcesDir, "resources.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs Envoy Gateway (again), its log appended to cp.logPath; stop
// stops it.
func (cp *egControlPlane) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(cp.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cp.bin, "server", "--config-path", cp.configPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	cp.exited = done
	stopped := false
	cp.stop = func() {
		if stopped {
			return
		}
		stopped = true
		// Envoy Gateway stops the Envoy it started on SIGTERM; then its
		// process group (Envoy Gateway and that Envoy) is killed, so
		// that nothing outlives it.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// firstDNSName is the first DNS name of the PEM certificate in path.
func firstDNSName(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(c.DNSNames) == 0 {
		return "", fmt.Errorf("%s: no DNS name", path)
	}
	return c.DNSNames[0], nil
}

// fetchRateLimitConfigs asks cp's rate limit xDS server for its
// RateLimitConfig resources once, as the rate limit service does (node
// egNodeID, the client certificate of Envoy Gateway's certgen).
func fetchRateLimitConfigs(ctx context.Context, cp *egControlPlane) ([]*rlconfv3.RateLimitConfig, error) {
	pair, err := tls.LoadX509KeyPair(cp.cert, cp.key)
	if err != nil {
		return nil, err
	}
	return fetchWith(ctx, cp, []tls.Certificate{pair})
}

// fetchWith is fetchRateLimitConfigs presenting certs (none: no client
// certificate).
func fetchWith(ctx context.Context, cp *egControlPlane, certs []tls.Certificate) ([]*rlconfv3.RateLimitConfig, error) {
	caPEM, err := os.ReadFile(cp.ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no certificate", cp.ca)
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: certs, RootCAs: pool, ServerName: cp.san, MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(cp.url, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	const typeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: egNodeID}, TypeUrl: typeURL}); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var out []*rlconfv3.RateLimitConfig
	for _, a := range resp.GetResources() {
		c := new(rlconfv3.RateLimitConfig)
		if err := a.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("resource %s: %w", a.GetTypeUrl(), err)
		}
		out = append(out, c)
	}
	return out, nil
}

// egLimitConfig waits until cp serves a RateLimitConfig that holds the
// policy's limit of requests per egUnit and returns it: the domain (the Gateway listener), and
// the route's descriptor with the rule's one below it.
func egLimitConfig(t *testing.T, cp *egControlPlane, requests uint32) (domain string, route, rule *rlconfv3.RateLimitDescriptor) {
	t.Helper()
	last := "nothing yet"
	for deadline := time.Now().Add(egStartTimeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		select {
		case <-cp.exited:
			t.Fatalf("Envoy Gateway exited:\n%s", logtext.Tail(cp.log(), 30))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		configs, err := fetchRateLimitConfigs(ctx, cp)
		cancel()
		if err != nil {
			last = err.Error()
			continue
		}
		last = fmt.Sprintf("%d RateLimitConfigs: %v", len(configs), configs)
		for _, c := range configs {
			for _, d := range c.GetDescriptors() {
				for _, sub := range d.GetDescriptors() {
					if l := sub.GetRateLimit(); l != nil && l.GetRequestsPerUnit() == requests && l.GetUnit() == egUnit {
						return c.GetDomain(), d, sub
					}
				}
			}
		}
	}
	t.Fatalf("Envoy Gateway served no RateLimitConfig with %d per %v within %v: %s", requests, egUnit, egStartTimeout, last)
	return "", nil, nil
}

// TestEnvoyGatewayControlPlane: Envoy Gateway's own control plane,
// standalone, serves the RateLimitConfig of a global BackendTrafficPolicy
// (one descriptor for the route, its rule's below it, keyed by the header's
// value) over mutual TLS; each rate limit service it configures answers
// egLimit OK then OVER_LIMIT for one key, and OK for another. Then, with
// the service running: the policy's file edited (Envoy Gateway's file
// provider sends a new snapshot, applied without a restart); Envoy
// Gateway stopped (the last configuration keeps answering); Envoy Gateway
// started again with another limit (the service reconnects, with the
// back-off Envoy Gateway leaves at its defaults, and applies it). Each
// service row runs its own Envoy Gateway: port 18001 is fixed, so the rows
// run one after the other.
func TestEnvoyGatewayControlPlane(t *testing.T) {
	t.Parallel()
	envoyGatewayBinary(t)
	for _, svc := range xdsServices {
		t.Run(svc.name, func(t *testing.T) {
			cp := startEnvoyGateway(t)
			domain, route, rule := egLimitConfig(t, cp, egLimit)
			t.Logf("Envoy Gateway serves domain %q: %s=%s, then %s (%d per %s)", domain, route.GetKey(), route.GetValue(),
				rule.GetKey(), rule.GetRateLimit().GetRequestsPerUnit(), rule.GetRateLimit().GetUnit())
			// Mutual TLS: a client without the certificate is refused.
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			configs, err := fetchWith(ctx, cp, nil)
			cancel()
			if err == nil {
				t.Errorf("a client without a certificate got %d RateLimitConfigs", len(configs))
			} else {
				t.Logf("a client without a certificate: %v", err)
			}
			checkProxy(t, cp)

			addr := svc.start(t, cp)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			check := func(step string, requests uint32, within time.Duration) {
				t.Helper()
				// The service may hold an earlier configuration (an empty
				// first snapshot, the limit before the edit): wait until
				// it applies this one.
				if err := waitLimit(client, domain, route, rule, requests, within); err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if err := checkAnswers(client, domain, route, rule, int(requests)); err != nil {
					t.Fatalf("%s: %v", step, err)
				}
			}
			check("Envoy Gateway's policy", egLimit, waitTimeout)

			cp.writePolicy(t, egLimit-2)
			egLimitConfig(t, cp, egLimit-2)
			check("the policy's file edited", egLimit-2, waitTimeout)

			cp.stop()
			check("Envoy Gateway stopped", egLimit-2, waitTimeout)

			cp.writePolicy(t, egLimit+1)
			cp.start(t)
			egLimitConfig(t, cp, egLimit+1)
			check("Envoy Gateway started again, another limit", egLimit+1, egStartTimeout)
		})
	}
}

// checkProxy: Envoy Gateway on a host runs the Gateway's Envoy too
// (func-e, from the data home the test links), and its listener answers.
// Its rate limit filter reaches no service (Envoy rejected the cluster),
// and the policy fails open, so the answer is the backend's absence
// (nothing listens on its port), not a limit.
func checkProxy(t *testing.T, cp *egControlPlane) {
	t.Helper()
	url := "http://127.0.0.1:" + strconv.Itoa(cp.gatewayPort) + "/"
	hc := &http.Client{Timeout: 5 * time.Second}
	last := "no answer"
	for deadline := time.Now().Add(egStartTimeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		t.Logf("the Gateway's Envoy answers %s: %d", url, resp.StatusCode)
		return
	}
	t.Fatalf("the Gateway's Envoy did not answer %s within %v: %s", url, egStartTimeout, last)
}

// checkAnswers asks the service for a new key limit+1 times and for
// another key once: limit OK, OVER_LIMIT, OK. A run across egWindow's edge
// (fixed windows start again there) is replayed, at most three times.
func checkAnswers(client rlsv3.RateLimitServiceClient, domain string, route, rule *rlconfv3.RateLimitDescriptor, limit int) error {
	ask := func(key string) (rlsv3.RateLimitResponse_Code, error) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, egRequest(domain, route, rule, key))
		return resp.GetOverallCode(), err
	}
	var want []string
	for range limit {
		want = append(want, "OK")
	}
	want = append(want, "OVER_LIMIT", "other key: OK")
	var got []string
	for attempt := 0; attempt < 3; attempt++ {
		key := fmt.Sprintf("key-%d-%d", time.Now().UnixNano(), attempt)
		window := time.Now().UTC().Truncate(egWindow)
		got = got[:0]
		for i := 0; i <= limit; i++ {
			code, err := ask(key)
			if err != nil {
				return fmt.Errorf("request %d: %w", i+1, err)
			}
			got = append(got, code.String())
		}
		other, err := ask(key + "-other")
		if err != nil {
			return err
		}
		got = append(got, "other key: "+other.String())
		if !time.Now().UTC().Truncate(egWindow).Equal(window) {
			continue // a window edge fell inside: replay with a new key
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("answers %v, want %v", got, want)
		}
		return nil
	}
	return fmt.Errorf("three runs crossed a window's edge: %v", got)
}

// egRequest is the request Envoy's filter sends for the policy's rule and
// a value of x-api-key.
func egRequest(domain string, route, rule *rlconfv3.RateLimitDescriptor, key string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: route.GetKey(), Value: route.GetValue()}, {Key: rule.GetKey(), Value: key}},
	}}}
}

// waitLimit waits until the service answers for the policy's descriptors
// (with the key "probe", which it counts) with a current limit of
// requests: it has applied that configuration.
func waitLimit(client rlsv3.RateLimitServiceClient, domain string, route, rule *rlconfv3.RateLimitDescriptor, requests uint32, within time.Duration) error {
	last := errors.New("no answer")
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		resp, err := client.ShouldRateLimit(ctx, egRequest(domain, route, rule, "probe"))
		cancel()
		switch {
		case err != nil:
			last = err
		case len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != requests:
			last = fmt.Errorf("not the limit of %d yet: %v", requests, resp)
		default:
			return nil
		}
	}
	return fmt.Errorf("the service did not apply a limit of %d within %v: %w", requests, within, last)
}
