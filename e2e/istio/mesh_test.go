// Package istio checks the plugin as Istio's own control plane delivers it:
// Istio 1.31's in-memory discovery server (istio.io/istio/pilot/test/xds,
// what Istio's own tests use) serves ADS on a loopback port with the
// objects of one ingress gateway and the WasmPlugins of examples/istio, a
// real Envoy 1.40 (func-e's, as every e2e test) connects as that gateway
// with nothing but the ADS cluster in its bootstrap, and the tests check
// what Istio generated and what the plugin then does with real requests.
// The native module (libtokenbucket.so) runs the same way from the
// EnvoyFilter of examples/istio/native-envoyfilter.yaml (native_test.go),
// and Istio's own injector runs over that file's Deployments
// (inject_test.go).
//
// It is a Go module of its own so that istio.io/istio and its dependencies
// never enter the plugin's go.mod; it uses this repository's packages
// through a replace directive. No Kubernetes API server (Istio's fake
// client), no istio-agent (WasmPlugin urls are file://; Envoy inherits the
// test's environment as it would pilot-agent's), no sidecar. Locally a
// missing Envoy, plugin or native module skips the tests; under CI=true
// they fail.
package istio

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/istio/pilot/pkg/config/kube/crd"
	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pilot/test/xds"
	istiomesh "istio.io/istio/pkg/config/mesh"
	istiolog "istio.io/istio/pkg/log"
	"istio.io/istio/pkg/test/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// The gateway Envoy's identity, as istio-agent would announce it.
const (
	gatewayIP        = "10.1.1.1"
	gatewayNamespace = "istio-system"
	gatewayPod       = "istio-ingressgateway-0"
	istioVersion     = "1.31.0"
)

//go:embed bootstrap.yaml
var bootstrapTemplate string

func init() {
	// Stock Envoy has no istio.metadata_exchange filter; istio-agent's
	// Envoy does. This is the PILOT_ENABLE_METADATA_EXCHANGE=false of a
	// real istiod, set in the variable it initialises (environment
	// variables are read when package features is initialised, before any
	// test code runs).
	features.MetadataExchange = false
	// Nor its istio.alpn filter (PILOT_ENABLE_ALPN_FILTER=false): it sets
	// the upstream ALPN for Istio's mTLS, which this test does not use.
	features.ALPNFilter = false
	// Istio's servers log every informer sync at info; keep warnings
	// (an ACK ERROR from Envoy is one).
	for _, s := range istiolog.Scopes() {
		s.SetOutputLevel(istiolog.WarnLevel)
	}
}

// mesh is Istio's in-memory discovery server serving ADS on a loopback
// port, with the objects of one ingress gateway.
type mesh struct {
	ds          *xds.FakeDiscoveryServer
	xdsPort     int
	gatewayPort int // the gateway Service's targetPort: its listener's port
}

// meshObjects are what the server needs for a gateway Envoy to get a
// listener: the gateway's Pod (its IP identifies the proxy, its labels
// select the Gateway and the WasmPlugins) and Service (port 80 to the
// container port the listener binds), a Gateway on 127.0.0.1, a
// VirtualService to the backend, and ServiceEntries for the backend and
// the limit service on loopback ports.
type meshObjects struct {
	GatewayPort, UpstreamPort, LimitdPort int
	// Configs are more Istio resources (YAML documents), e.g. WasmPlugins.
	Configs []string
}

func (o meshObjects) kubernetes() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: %[2]s
  labels:
    app: istio-ingressgateway
    istio: ingressgateway
spec:
  containers:
  - name: istio-proxy
    image: proxyv2
    ports:
    - containerPort: %[4]d
status:
  phase: Running
  podIP: %[3]s
  podIPs:
  - ip: %[3]s
  conditions:
  - type: Ready
    status: "True"
---
apiVersion: v1
kind: Service
metadata:
  name: istio-ingressgateway
  namespace: %[2]s
spec:
  clusterIP: 10.96.0.10
  selector:
    istio: ingressgateway
  ports:
  - name: http2
    port: 80
    targetPort: %[4]d
`, gatewayPod, gatewayNamespace, gatewayIP, o.GatewayPort)
}

func (o meshObjects) istio() string {
	docs := []string{fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: gateway
  namespace: %[1]s
spec:
  selector:
    istio: ingressgateway
  servers:
  - port:
      number: 80
      name: http
      protocol: HTTP
    hosts: ["*"]
    bind: 127.0.0.1
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: backend
  namespace: %[1]s
spec:
  hosts: ["*"]
  gateways: [gateway]
  http:
  - route:
    - destination:
        host: backend.example.internal
        port:
          number: 80
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: backend
  namespace: %[1]s
spec:
  hosts: [backend.example.internal]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports:
  - number: 80
    name: http
    protocol: HTTP
    targetPort: %[2]d
  endpoints:
  - address: 127.0.0.1
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: limitd
  namespace: ratelimit
spec:
  hosts: [limitd.ratelimit.svc.cluster.local]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports:
  - number: 8429
    name: http
    protocol: HTTP
    targetPort: %[3]d
  endpoints:
  - address: 127.0.0.1
`, gatewayNamespace, o.UpstreamPort, o.LimitdPort)}
	return strings.Join(append(docs, o.Configs...), "\n---\n")
}

// startMesh starts Istio's discovery server with objs on a free loopback
// port; it stops when t ends.
func startMesh(t *testing.T, objs meshObjects) *mesh {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// No istio-agent, so no workload certificates (SDS "default" and
	// "ROOTCA" come from the agent): a cluster that may use Istio's mTLS
	// would wait for them forever. Auto mTLS off keeps every cluster plain.
	meshConfig := istiomesh.DefaultMeshConfig()
	meshConfig.EnableAutoMtls = wrapperspb.Bool(false)
	ds := xds.NewFakeDiscoveryServer(t, xds.FakeOptions{
		MeshConfig:             meshConfig,
		KubernetesObjectString: objs.kubernetes(),
		ConfigString:           objs.istio(),
		ListenerBuilder:        func() (net.Listener, error) { return ln, nil },
	})
	return &mesh{ds: ds, xdsPort: ln.Addr().(*net.TCPAddr).Port, gatewayPort: objs.GatewayPort}
}

// apply creates or updates the Istio resources of doc (YAML) in the
// server's store, as `kubectl apply` would.
func (m *mesh) apply(t *testing.T, doc string) {
	t.Helper()
	cfgs, _, err := crd.ParseInputs(doc)
	if err != nil {
		t.Fatalf("parsing %s: %v", doc, err)
	}
	store := m.ds.Store()
	for _, c := range cfgs {
		if store.Get(c.GroupVersionKind, c.Name, c.Namespace) == nil {
			_, err = store.Create(c)
		} else {
			_, err = store.Update(c)
		}
		if err != nil {
			t.Fatalf("applying %s %s/%s: %v", c.GroupVersionKind.Kind, c.Namespace, c.Name, err)
		}
	}
}

// startGateway starts Envoy as the gateway of m and waits until the gateway
// listener accepts connections.
func (m *mesh) startGateway(t *testing.T) *envoytest.Envoy {
	t.Helper()
	return envoytest.Start(t, m.gatewayOptions())
}

// gatewayOptions run Envoy as the gateway of m, with nothing but the ADS
// cluster in its bootstrap: every listener, route, cluster, endpoint and
// filter comes from Istio.
func (m *mesh) gatewayOptions() envoytest.Options {
	meta := map[string]any{
		"ISTIO_VERSION": istioVersion,
		"CLUSTER_ID":    "Kubernetes",
		"NAMESPACE":     gatewayNamespace,
		"INSTANCE_IPS":  gatewayIP,
		"WORKLOAD_NAME": "istio-ingressgateway",
		"LABELS":        map[string]string{"istio": "ingressgateway", "app": "istio-ingressgateway"},
	}
	return envoytest.Options{
		Config:       bootstrapTemplate,
		ListenerPort: m.gatewayPort,
		Concurrency:  2,
		Data: map[string]any{
			"NodeID":      fmt.Sprintf("router~%s~%s.%s~%s.svc.cluster.local", gatewayIP, gatewayPod, gatewayNamespace, gatewayNamespace),
			"NodeCluster": "istio-ingressgateway." + gatewayNamespace,
			"Metadata":    meta,
			"XDSPort":     m.xdsPort,
			// StatsMatcher, when set, is the bootstrap's
			// stats_config.stats_matcher (see istioStatsMatcher).
			"StatsMatcher": nil,
		},
	}
}

// wasmPlugin returns examples/istio's file as a WasmPlugin this test can
// apply: the url points at wasm (file://, which Istio turns into a local
// file data source, so no agent fetches it), the match ports at the
// gateway's listener port, and edit, when not nil, changes the rest.
func wasmPlugin(t *testing.T, file, wasm string, port int, edit func(spec map[string]any)) string {
	t.Helper()
	y, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(y, &obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		t.Fatalf("%s: no spec", file)
	}
	spec["url"] = "file://" + wasm
	spec["match"] = []any{map[string]any{"mode": "CLIENT", "ports": []any{map[string]any{"number": port}}}}
	if edit != nil {
		edit(spec)
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// pluginCopy copies $PLUGIN_WASM into a directory of the test and returns
// its absolute path: the file:// url of the WasmPlugins.
func pluginCopy(t *testing.T) string {
	t.Helper()
	src := envoytest.PluginWasm(t)
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(t.TempDir(), "plugin.wasm")
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// configDump returns the sections of Envoy's /config_dump?resource=... as
// raw JSON objects.
func configDump(t *testing.T, e *envoytest.Envoy, resource string) []json.RawMessage {
	t.Helper()
	var dump struct {
		Configs []json.RawMessage `json:"configs"`
	}
	body := adminGet(t, e, "/config_dump?resource="+resource)
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatalf("config_dump %s: %v", resource, err)
	}
	return dump.Configs
}

func adminGet(t *testing.T, e *envoytest.Envoy, path string) []byte {
	t.Helper()
	c := envoytest.NewClient(strings.TrimSuffix(e.AdminURL(""), "/"))
	defer c.Close()
	r := c.Get(path, nil)
	if r.Err != nil || r.Status != 200 {
		t.Fatalf("admin %s: %v", path, r)
	}
	return r.Body
}

// waitUntil polls cond until it holds, at most timeout.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if err := retry.UntilSuccess(func() error {
		if !cond() {
			return fmt.Errorf("not yet: %s", what)
		}
		return nil
	}, retry.Timeout(timeout), retry.Delay(50*time.Millisecond)); err != nil {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}

// yamlToJSON decodes the YAML y into v through its JSON form (json tags).
func yamlToJSON(y string, v any) error { return yaml.Unmarshal([]byte(y), v) }

// sourceClient sends requests to the gateway from the loopback address
// src (e.g. 127.0.0.2), so that the plugin's ip:address keys see a new
// client. Envoy appends the peer to X-Forwarded-For at a gateway (Istio
// sets use_remote_address), and the example trusts no hop, so the peer is
// the address.
type sourceClient struct {
	base string
	hc   *http.Client
}

func newSourceClient(t *testing.T, e *envoytest.Envoy, src string) *sourceClient {
	t.Helper()
	d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	tr := &http.Transport{Proxy: nil, DialContext: d.DialContext, MaxIdleConnsPerHost: 4, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &sourceClient{base: e.URL(""), hc: &http.Client{Transport: tr, Timeout: envoytest.RequestTimeout}}
}

// get sends GET path and returns the status and headers; a transport
// error is status 0.
func (c *sourceClient) get(path string, headers map[string]string) (int, http.Header) {
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		return 0, nil
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}
