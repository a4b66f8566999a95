package istio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/dynamic_modules/v3"
	dmfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_modules/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/istio/pilot/pkg/config/kube/crd"
	"istio.io/istio/pkg/bootstrap"
	"istio.io/istio/pkg/bootstrap/platform"
	istioconfig "istio.io/istio/pkg/config"
	istiomesh "istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/config/validation/envoyfilter"
	"istio.io/istio/pkg/config/xds"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

const (
	nativeExample = examples + "native-envoyfilter.yaml"
	// nativeGateway is the example's EnvoyFilter for the ingress gateway.
	nativeGateway = "tokenbucket-gateway"
	// istioGenericWarning is the warning Istio's validation gives every
	// EnvoyFilter.
	istioGenericWarning = "EnvoyFilter exposes internal implementation details"
)

// exampleEnvoyFilters returns the EnvoyFilters of the native example by
// name, as Istio's own parser (the one `kubectl apply` feeds istiod
// through the API server's CRD) reads them.
func exampleEnvoyFilters(t *testing.T) map[string]istioconfig.Config {
	t.Helper()
	b, err := os.ReadFile(nativeExample)
	if err != nil {
		t.Fatal(err)
	}
	cfgs, _, err := crd.ParseInputs(string(b))
	if err != nil {
		t.Fatalf("%s: %v", nativeExample, err)
	}
	out := map[string]istioconfig.Config{}
	for _, c := range cfgs {
		if c.GroupVersionKind.Kind == "EnvoyFilter" {
			out[c.Name] = c
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no EnvoyFilter", nativeExample)
	}
	return out
}

// nativeFilter converts patch i of the EnvoyFilter c with Istio's own
// conversion (what istiod does before it patches a listener), refusing
// unknown fields, into the typed Envoy filter and its configuration.
func nativeFilter(c istioconfig.Config, i int) (*hcm.HttpFilter, *dmfilter.DynamicModuleFilter, error) {
	cp := c.Spec.(*networking.EnvoyFilter).ConfigPatches[i]
	obj, err := xds.BuildXDSObjectFromStruct(cp.ApplyTo, cp.Patch.Value, true)
	if err != nil {
		return nil, nil, err
	}
	hf, ok := obj.(*hcm.HttpFilter)
	if !ok {
		return nil, nil, &typeError{obj}
	}
	dm := &dmfilter.DynamicModuleFilter{}
	if err := hf.GetTypedConfig().UnmarshalTo(dm); err != nil {
		return nil, nil, err
	}
	return hf, dm, nil
}

type typeError struct{ obj any }

func (e *typeError) Error() string { return "patch value is not an HTTP filter" }

// TestNativeEnvoyFilterIstio: Istio's own validation accepts every
// EnvoyFilter of the native example with nothing but the warning it gives
// every EnvoyFilter, and Istio's conversion, refusing unknown fields, turns
// each patch into Envoy's DynamicModuleFilter naming the module, with the
// configuration manifest.NativeFilters reads and the plugin accepts. A
// misspelt field is caught by the strict conversion (Istio's validation only
// warns about it, and istiod then drops it).
func TestNativeEnvoyFilterIstio(t *testing.T) {
	filters := exampleEnvoyFilters(t)
	docs, err := manifest.DecodeFile(nativeExample)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range filters {
		warn, err := envoyfilter.ValidateEnvoyFilter(c)
		if err != nil {
			t.Errorf("%s: Istio's validation refuses it: %v", name, err)
		}
		// Istio's validation warns about unknown fields (it refuses only
		// what its types cannot hold at all); the one warning allowed is
		// the one every EnvoyFilter gets.
		if warn != nil && (!strings.HasPrefix(warn.Error(), istioGenericWarning) || strings.Contains(warn.Error(), "\n")) {
			t.Errorf("%s: Istio's validation warns: %v", name, warn)
		}
		var native []manifest.NativeFilter
		for _, d := range docs {
			if ef, ok := d.Obj.(*clientnetv1a3.EnvoyFilter); ok && ef.Name == name {
				if native, err = manifest.NativeFilters(ef); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(native) != 1 {
			t.Fatalf("%s: manifest.NativeFilters found %d filters, want 1", name, len(native))
		}
		hf, dm, err := nativeFilter(c, native[0].Patch)
		if err != nil {
			t.Fatalf("%s: Istio's strict conversion: %v", name, err)
		}
		sv := &wrapperspb.StringValue{}
		if err := dm.GetFilterConfig().UnmarshalTo(sv); err != nil {
			t.Fatalf("%s: filter_config: %v", name, err)
		}
		want := &dmv3.DynamicModuleConfig{Name: manifest.NativeModule, DoNotClose: true}
		if hf.GetName() != "envoy.filters.http.dynamic_modules" || dm.GetFilterName() != manifest.NativeFilterName ||
			!proto.Equal(dm.GetDynamicModuleConfig(), want) || sv.GetValue() != string(native[0].Config) {
			t.Errorf("%s: Istio builds %v with %v, want the module %v, filter %q and the configuration manifest reads", name,
				protojson.Format(hf), protojson.Format(dm), want, manifest.NativeFilterName)
		}
		if _, err := config.Parse([]byte(sv.GetValue())); err != nil {
			t.Errorf("%s: the plugin refuses the configuration Istio hands the module: %v", name, err)
		}
	}

	// A misspelt field inside the filter's configuration.
	c := filters[nativeGateway]
	c = c.DeepCopy()
	cp := c.Spec.(*networking.EnvoyFilter).ConfigPatches[0]
	tc := cp.Patch.Value.Fields["typed_config"].GetStructValue()
	tc.Fields["filter_nam"] = tc.Fields["filter_name"]
	delete(tc.Fields, "filter_name")
	if _, _, err := nativeFilter(c, 0); err == nil || !strings.Contains(err.Error(), "filter_nam") {
		t.Errorf("filter_nam: Istio's strict conversion: %v, want an unknown-field error", err)
	}
	warn, err := envoyfilter.ValidateEnvoyFilter(c)
	if err != nil || warn == nil || !strings.Contains(warn.Error(), "filter_nam") {
		t.Errorf("filter_nam: Istio's validation: warning %v, error %v; want a warning naming it", warn, err)
	}
}

// nativeModule returns the folder ENVOY_DYNAMIC_MODULES_SEARCH_PATH names,
// filled the way the example's init container fills its emptyDir: the
// module's image holds $NATIVE_MODULE (default build/libtokenbucket.so) as
// /libtokenbucket.so, and its entrypoint, cmd/installmodule, copies it into
// the folder. A missing module skips the test, or fails it under CI=true.
func nativeModule(t *testing.T) string {
	t.Helper()
	src := os.Getenv("NATIVE_MODULE")
	if src == "" {
		src = "../../build/libtokenbucket.so"
	}
	in, err := os.Open(src)
	if err != nil {
		ci.Skip(t, "no native module: %v (run `make build-native`, or set NATIVE_MODULE)", err)
	}
	defer in.Close()
	image := t.TempDir() // the image's root
	out, err := os.Create(filepath.Join(image, "lib"+manifest.NativeModule+".so"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	installer := filepath.Join(t.TempDir(), "installmodule")
	if o, err := exec.Command("go", "build", "-o", installer, "github.com/ratelimit-wasm/tokenbucket/cmd/installmodule").CombinedOutput(); err != nil {
		t.Fatalf("building cmd/installmodule: %v\n%s", err, o)
	}
	dir := t.TempDir() // the emptyDir
	o, err := exec.Command(installer, "-src", out.Name(), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("installmodule: %v\n%s", err, o)
	}
	t.Logf("the init container's step: %s", strings.TrimSpace(string(o)))
	return dir
}

// nativeGatewayFilter returns the example's gateway EnvoyFilter as YAML with
// one edit to its JSON configuration, the one gatewayPluginEdit makes to the
// WasmPlugin (the limit service's timeout), and that configuration.
func nativeGatewayFilter(t *testing.T) (string, []byte) {
	t.Helper()
	c := exampleEnvoyFilters(t)[nativeGateway].DeepCopy()
	cp := c.Spec.(*networking.EnvoyFilter).ConfigPatches[0]
	fc := cp.Patch.Value.Fields["typed_config"].GetStructValue().Fields["filter_config"].GetStructValue()
	var cfg map[string]any
	if err := json.Unmarshal([]byte(fc.Fields["value"].GetStringValue()), &cfg); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{"pluginConfig": cfg}
	gatewayPluginEdit(t)(spec)
	edited, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fc.Fields["value"] = structpb.NewStringValue(string(edited))
	specJSON, err := protojson.Marshal(c.Spec.(*networking.EnvoyFilter))
	if err != nil {
		t.Fatal(err)
	}
	var specMap map[string]any
	if err := json.Unmarshal(specJSON, &specMap); err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(map[string]any{
		"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
		"metadata": map[string]any{"name": c.Name, "namespace": c.Namespace},
		"spec":     specMap,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(y), edited
}

// nativeSetup is one discovery server, the limit service and one gateway
// Envoy loading the native module through the example's EnvoyFilter.
type nativeSetup struct {
	envoy   *envoytest.Envoy
	config  []byte        // the JSON configuration the EnvoyFilter carries
	decides *atomic.Int64 // limit service decisions with the example's Host
}

// nativeMesh starts Istio's discovery server with the gateway objects and
// the example's gateway EnvoyFilter (its limit service on port limitdPort)
// and returns it with the gateway's Envoy options: the bootstrap keeps the
// stats Istio's would keep for the example gateway's proxy configuration.
func nativeMesh(t *testing.T, limitdPort int) (*mesh, envoytest.Options, []byte) {
	t.Helper()
	filter, cfgJSON := nativeGatewayFilter(t)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	m := startMesh(t, meshObjects{GatewayPort: envoytest.FreePort(t), UpstreamPort: up.Port(),
		LimitdPort: limitdPort, Configs: []string{filter, denyAdmin("", 0)}})
	opts := m.gatewayOptions()
	opts.Data["StatsMatcher"] = istioStatsMatcher(t, gatewayProxyConfig(t))
	return m, opts, cfgJSON
}

// startNativeSetup starts the limit service (in-memory store) and an
// upstream on loopback, Istio's discovery server with the gateway objects,
// the example's gateway EnvoyFilter and an AuthorizationPolicy denying
// /admin (denyAdmin), and the gateway Envoy, whose
// environment has what the example's gateway Deployment gives istio-proxy:
// ENVOY_DYNAMIC_MODULES_SEARCH_PATH (the folder of the module) and
// GODEBUG=cgocheck=0. Envoy inherits them from this process, as it
// inherits pilot-agent's in a pod. Its bootstrap keeps the stats Istio's
// would keep for that Deployment's proxy configuration.
func startNativeSetup(t *testing.T) *nativeSetup {
	t.Helper()
	dir := nativeModule(t)
	t.Setenv(manifest.SearchPathEnv, dir)
	t.Setenv("GODEBUG", "cgocheck=0")
	_, cfgJSON := nativeGatewayFilter(t)
	cfg, err := config.Parse(cfgJSON)
	if err != nil {
		t.Fatalf("the gateway EnvoyFilter's configuration: %v", err)
	}
	limitdPort, decides := startCountingLimitd(t, cfg)
	_, opts, _ := nativeMesh(t, limitdPort)
	return &nativeSetup{envoy: envoytest.Start(t, opts), config: cfgJSON, decides: decides}
}

// gatewayProxyConfig is the proxy.istio.io/config annotation of the
// example's gateway Deployment.
func gatewayProxyConfig(t *testing.T) string {
	t.Helper()
	docs, err := manifest.DecodeFile(nativeExample)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if dep, ok := d.Obj.(*appsv1.Deployment); ok && dep.Spec.Template.Labels["istio"] == "ingressgateway" {
			if a, ok := dep.Spec.Template.Annotations["proxy.istio.io/config"]; ok {
				return a
			}
			t.Fatalf("%s: the gateway Deployment has no proxy.istio.io/config annotation", nativeExample)
		}
	}
	t.Fatalf("%s: no gateway Deployment", nativeExample)
	return ""
}

// istioStatsMatcher returns the stats matcher of the bootstrap Istio's
// agent writes for a gateway whose proxy configuration is the mesh default
// merged with the annotation proxyConfig (pkg/bootstrap, what pilot-agent
// runs, with Istio's own bootstrap template): without an inclusion for
// them, Envoy keeps none of the module's counters.
func istioStatsMatcher(t *testing.T, proxyConfig string) any {
	t.Helper()
	pc, err := istiomesh.MergeProxyConfig(proxyConfig, istiomesh.DefaultProxyConfig())
	if err != nil {
		t.Fatalf("proxy.istio.io/config: %v", err)
	}
	node, err := bootstrap.GetNodeMetaData(bootstrap.MetadataOptions{
		ID:          fmt.Sprintf("router~%s~%s.%s~%s.svc.cluster.local", gatewayIP, gatewayPod, gatewayNamespace, gatewayNamespace),
		InstanceIPs: []string{gatewayIP},
		Platform:    &platform.Unknown{},
		ProxyConfig: pc,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	if err != nil {
		t.Fatalf("go list -m istio.io/istio: %v", err)
	}
	var b bytes.Buffer
	tmpl := filepath.Join(strings.TrimSpace(string(dir)), "tools/packaging/common/envoy_bootstrap.json")
	if err := bootstrap.New(bootstrap.Config{Node: node}).WriteTo(tmpl, &b); err != nil {
		t.Fatalf("Istio's bootstrap: %v", err)
	}
	var boot struct {
		StatsConfig struct {
			StatsMatcher any `json:"stats_matcher"`
		} `json:"stats_config"`
	}
	if err := json.Unmarshal(b.Bytes(), &boot); err != nil || boot.StatsConfig.StatsMatcher == nil {
		t.Fatalf("Istio's bootstrap: no stats_config.stats_matcher (%v)", err)
	}
	return boot.StatsConfig.StatsMatcher
}

// TestIstioNative: Istio's discovery server patches the example's
// dynamic-modules filter into a real Envoy 1.40 gateway's listener, Envoy
// loads libtokenbucket.so from the folder its environment names, and the
// module enforces the example's rules.
func TestIstioNative(t *testing.T) {
	g := startNativeSetup(t)
	e := g.envoy
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.Stat("dynamicmodulescustom.tokenbucket." + name) }

	t.Run("the filter Istio patched in, before the router", func(t *testing.T) {
		filters := httpFilters(t, e)
		t.Logf("gateway HTTP filters: %v", filters)
		n := len(filters)
		if n < 2 || filters[n-2] != "envoy.filters.http.dynamic_modules" || filters[n-1] != "envoy.filters.http.router" {
			t.Fatalf("filters %v: want envoy.filters.http.dynamic_modules right before the router", filters)
		}
		got := dynamicModuleConfig(t, e)
		if !sameJSON(t, []byte(got), g.config) {
			t.Errorf("the filter's configuration in Envoy %s\nwant the EnvoyFilter's %s", got, g.config)
		}
	})

	counts := checkGatewayLimits(t, c, g.decides)

	// Before the router: after Istio's authorization filter, so a request
	// the AuthorizationPolicy denies never reaches the module.
	t.Run("after Istio's authorization filter: denied requests spend nothing", func(t *testing.T) {
		filters := httpFilters(t, e)
		if rbac, dm := index(filters, "envoy.filters.http.rbac"), index(filters, "envoy.filters.http.dynamic_modules"); rbac < 0 || dm < rbac {
			t.Fatalf("filters %v: want envoy.filters.http.rbac before the module", filters)
		}
		c := newSourceClient(t, e, "127.0.0.8")
		for i := range anonBurst + 5 {
			if st, h := c.get("/admin", nil); st != 403 || h.Get("RateLimit-Policy") != "" {
				t.Fatalf("/admin request %d: %d %v, want 403 from the DENY policy without RateLimit headers", i, st, h)
			}
		}
		start := time.Now()
		ok := 0
		for range anonBurst + 2 {
			if st, _ := c.get("/public", nil); st == 200 {
				ok++
			}
		}
		if refill := refillBound(anonRate, time.Since(start)); ok < anonBurst || ok > anonBurst+refill {
			t.Fatalf("/public after %d denied requests: %d allowed, want the whole burst %d (+ at most %d refilled)", anonBurst+5, ok, anonBurst, refill)
		}
		counts.anonAllowed += uint64(ok)
		counts.anonRejected += uint64(anonBurst + 2 - ok)
	})

	checkGatewayStats(t, "dynamicmodulescustom.", stat, counts)
}

// dynamicModuleConfig returns the JSON configuration of the gateway
// listener's dynamic-modules filter, from Envoy's config dump.
func dynamicModuleConfig(t *testing.T, e *envoytest.Envoy) string {
	t.Helper()
	for _, raw := range configDump(t, e, "dynamic_listeners") {
		var l struct {
			ActiveState struct {
				Listener struct {
					FilterChains []struct {
						Filters []struct {
							TypedConfig struct {
								HTTPFilters []struct {
									Name        string `json:"name"`
									TypedConfig struct {
										Type         string `json:"@type"`
										FilterName   string `json:"filter_name"`
										FilterConfig struct {
											Value string `json:"value"`
										} `json:"filter_config"`
									} `json:"typed_config"`
								} `json:"http_filters"`
							} `json:"typed_config"`
						} `json:"filters"`
					} `json:"filter_chains"`
				} `json:"listener"`
			} `json:"active_state"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatalf("dynamic_listeners: %v", err)
		}
		for _, fc := range l.ActiveState.Listener.FilterChains {
			for _, f := range fc.Filters {
				for _, h := range f.TypedConfig.HTTPFilters {
					if h.TypedConfig.Type == manifest.DynamicModuleFilterType && h.TypedConfig.FilterName == manifest.NativeFilterName {
						return h.TypedConfig.FilterConfig.Value
					}
				}
			}
		}
	}
	t.Fatal("no dynamic-modules filter of the native module in Envoy's listeners")
	return ""
}

// TestNativeFieldsMatchEnvoy: the field lists manifest.NativeFilters checks
// a patch value's keys against are those of Envoy's messages, as Istio's
// copy of go-control-plane (the one istiod converts with) defines them.
func TestNativeFieldsMatchEnvoy(t *testing.T) {
	for name, fields := range manifest.NativeFields {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var want []string
		fds := mt.Descriptor().Fields()
		for i := range fds.Len() {
			want = append(want, string(fds.Get(i).Name()))
		}
		got := slices.Sorted(slices.Values(fields))
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: manifest.NativeFields %v, Envoy's fields %v", name, got, want)
		}
	}
}

// TestIstioNativeNotLoadable: a gateway whose Envoy cannot load the module
// (the search path names a folder without it, or GODEBUG lacks
// cgocheck=0) refuses the listener Istio sends with the filter, and never
// serves it; Envoy keeps running and says why.
func TestIstioNativeNotLoadable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		searchPath func(dir string) string
		godebug    string
		log        string
	}{
		{"no module in the search path", func(string) string { return t.TempDir() }, "cgocheck=0", "libtokenbucket.so"},
		{"no GODEBUG=cgocheck=0", func(dir string) string { return dir }, "", "cgocheck=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := nativeModule(t)
			t.Setenv(manifest.SearchPathEnv, tc.searchPath(dir))
			t.Setenv("GODEBUG", tc.godebug)
			_, opts, _ := nativeMesh(t, envoytest.FreePort(t))
			// How long to wait for a listener that should never come:
			// Istio's push and Envoy's refusal take well under a second.
			opts.StartTimeout = 20 * time.Second
			f := envoytest.ExpectStartFailure(t, opts)
			var lines []string
			for _, l := range strings.Split(f.Log, "\n") {
				if strings.Contains(l, tc.log) && (strings.Contains(l, "[warning]") || strings.Contains(l, "[error]") || strings.Contains(l, "[critical]")) {
					lines = append(lines, l)
				}
			}
			t.Logf("outcome %v, exit code %d; log lines naming %q:\n%s", f, f.ExitCode, tc.log, strings.Join(lines, "\n"))
			if f.Outcome != envoytest.ListenerRefused || len(lines) == 0 {
				t.Fatalf("outcome %v (exit code %d), %d log lines naming %q: want the listener refused with a reason in the log\n%s",
					f, f.ExitCode, len(lines), tc.log, f.Log)
			}
		})
	}
}
