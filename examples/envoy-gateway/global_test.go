package envoygateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/envoyproxy/gateway/api/v1alpha1/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

const (
	// globalExample holds the application's half of the global limit (a
	// Gateway, an HTTPRoute, a BackendTrafficPolicy), globalValues the
	// installation's (Helm values of Envoy Gateway's chart whose
	// config.envoyGateway is the EnvoyGateway configuration).
	globalExample = "global.yaml"
	globalValues  = "envoy-gateway-values.yaml"
	// istioLimitd holds limitd's image as examples/istio names it: the
	// same placeholder reference in both examples.
	istioLimitd = "../istio/limitd.yaml"
)

// units are the limit units of the CRD's enum (RateLimitUnit).
var units = []egv1a1.RateLimitUnit{egv1a1.RateLimitUnitSecond, egv1a1.RateLimitUnitMinute, egv1a1.RateLimitUnitHour,
	egv1a1.RateLimitUnitDay, egv1a1.RateLimitUnitMonth, egv1a1.RateLimitUnitYear}

// globalLimit is one global BackendTrafficPolicy, resolved to the
// HTTPRoutes it targets.
type globalLimit struct {
	policy *egv1a1.BackendTrafficPolicy
	routes []*gwapiv1.HTTPRoute
}

// resolveGlobal returns the BackendTrafficPolicies with a global rate limit
// and what each targets, refusing what Envoy Gateway's API server or its
// translator would: the policy's CEL rules on targets (group
// gateway.networking.k8s.io, kinds Gateway or a route), a rule selector with
// no condition, a Distinct header with a value, a deprecated type that says
// Local or no global rules under type Global (buildRateLimit in
// internal/gatewayapi/backendtrafficpolicy.go). Targets must be in the
// manifest: an HTTPRoute whose parent is one of its Gateways.
func resolveGlobal(objs objects) ([]globalLimit, error) {
	var out []globalLimit
	for _, p := range objs.trafficPolicies {
		rl := p.Spec.RateLimit
		if rl == nil {
			continue
		}
		at := "BackendTrafficPolicy " + p.Name + ": spec.rateLimit"
		if rl.Type != nil && *rl.Type != egv1a1.GlobalRateLimitType {
			return nil, fmt.Errorf("%s.type: %s, the example's limits are Global (one count across every proxy, in the rate limit service)", at, *rl.Type)
		}
		if rl.Global == nil || len(rl.Global.Rules) == 0 {
			return nil, fmt.Errorf("%s.global.rules: none (Envoy Gateway refuses type Global without them)", at)
		}
		if rl.Local != nil {
			return nil, fmt.Errorf("%s.local: the example's limits are global only", at)
		}
		for i, r := range rl.Global.Rules {
			for j, s := range r.ClientSelectors {
				sat := fmt.Sprintf("%s.global.rules[%d].clientSelectors[%d]", at, i, j)
				if len(s.Headers) == 0 && len(s.Methods) == 0 && s.Path == nil && s.SourceCIDR == nil && len(s.QueryParams) == 0 {
					return nil, fmt.Errorf("%s: no condition (the API server refuses it: at least one of headers, methods, path, sourceCIDR or queryParams)", sat)
				}
				for k, h := range s.Headers {
					if h.Type != nil && *h.Type == egv1a1.HeaderMatchDistinct && (h.Value != nil || h.Invert != nil) {
						return nil, fmt.Errorf("%s.headers[%d]: type Distinct with a value or invert (Envoy Gateway refuses the policy)", sat, k)
					}
				}
			}
			if !slices.Contains(units, r.Limit.Unit) {
				return nil, fmt.Errorf("%s.global.rules[%d].limit.unit: %q is not one of %v (the CRD's enum)", at, i, r.Limit.Unit, units)
			}
			if r.Limit.Requests == 0 {
				return nil, fmt.Errorf("%s.global.rules[%d].limit.requests: 0 refuses every request", at, i)
			}
		}
		if len(p.Spec.TargetRefs) == 0 {
			return nil, fmt.Errorf("BackendTrafficPolicy %s: no spec.targetRefs", p.Name)
		}
		gl := globalLimit{policy: p}
		for ti, ref := range p.Spec.TargetRefs {
			if ref.Group != gwapiv1.GroupName || ref.Kind != "HTTPRoute" {
				return nil, fmt.Errorf("BackendTrafficPolicy %s: spec.targetRefs[%d]: %s/%s, the example targets HTTPRoutes of group %s", p.Name, ti, ref.Group, ref.Kind, gwapiv1.GroupName)
			}
			route := find(objs.routes, p.Namespace, string(ref.Name), func(r *gwapiv1.HTTPRoute) metav1.ObjectMeta { return r.ObjectMeta })
			if route == nil {
				return nil, fmt.Errorf("BackendTrafficPolicy %s: spec.targetRefs[%d]: no HTTPRoute %s/%s", p.Name, ti, p.Namespace, ref.Name)
			}
			attached := false
			for _, pr := range route.Spec.ParentRefs {
				ns := route.Namespace
				if pr.Namespace != nil {
					ns = string(*pr.Namespace)
				}
				attached = attached || (pr.Kind == nil || *pr.Kind == "Gateway") &&
					find(objs.gateways, ns, string(pr.Name), func(g *gwapiv1.Gateway) metav1.ObjectMeta { return g.ObjectMeta }) != nil
			}
			if !attached {
				return nil, fmt.Errorf("HTTPRoute %s: spec.parentRefs: no Gateway of the manifest", route.Name)
			}
			gl.routes = append(gl.routes, route)
		}
		out = append(out, gl)
	}
	return out, nil
}

// decodeValues strictly decodes Helm values for Envoy Gateway's chart that
// hold only config.envoyGateway (any other key would be a chart setting the
// example does not mean to change, or a misspelling Helm ignores), and
// returns that configuration as the EnvoyGateway it becomes, checked by
// Envoy Gateway's own validation (validation.ValidateEnvoyGateway, which the
// controller runs at start).
func decodeValues(b []byte) (*egv1a1.EnvoyGateway, error) {
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		return nil, err
	}
	for k := range top {
		if k != "config" {
			return nil, fmt.Errorf("values: %q: the example sets only config.envoyGateway", k)
		}
	}
	var config map[string]json.RawMessage
	if err := json.Unmarshal(top["config"], &config); err != nil {
		return nil, fmt.Errorf("values: config: %w", err)
	}
	for k := range config {
		if k != "envoyGateway" {
			return nil, fmt.Errorf("values: config.%s: the example sets only config.envoyGateway", k)
		}
	}
	if config["envoyGateway"] == nil {
		return nil, errors.New("values: no config.envoyGateway")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(config["envoyGateway"], &fields); err != nil {
		return nil, fmt.Errorf("values: config.envoyGateway: %w", err)
	}
	// The chart writes the document's apiVersion and kind itself.
	fields["apiVersion"], _ = json.Marshal(egv1a1.GroupVersion.String())
	fields["kind"], _ = json.Marshal(egv1a1.KindEnvoyGateway)
	doc, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	var list []*egv1a1.EnvoyGateway
	if err := strictInto(doc, &list); err != nil {
		return nil, fmt.Errorf("values: config.envoyGateway: %w", err)
	}
	eg := list[0]
	if err := validation.ValidateEnvoyGateway(eg); err != nil {
		return nil, fmt.Errorf("values: config.envoyGateway: %w", err)
	}
	return eg, nil
}

// checkValues returns what keeps the configuration from running limitd as
// Envoy Gateway's rate limit service: global limits on (rateLimit with a
// Redis URL) and the rate limit deployment's image set to image.
func checkValues(eg *egv1a1.EnvoyGateway, image string) []error {
	var errs []error
	if eg.RateLimit == nil {
		errs = append(errs, errors.New("config.envoyGateway.rateLimit: missing: without it Envoy Gateway deploys no rate limit service and refuses global limits"))
	} else if r := eg.RateLimit.Backend.Redis; r == nil || r.URL == nil {
		errs = append(errs, errors.New("config.envoyGateway.rateLimit.backend.redis.url: missing (the example gives the URL itself)"))
	}
	p := eg.Provider
	if p == nil || p.Type != egv1a1.ProviderTypeKubernetes || p.Kubernetes == nil || p.Kubernetes.RateLimitDeployment == nil ||
		p.Kubernetes.RateLimitDeployment.Container == nil || p.Kubernetes.RateLimitDeployment.Container.Image == nil {
		errs = append(errs, errors.New("config.envoyGateway.provider.kubernetes.rateLimitDeployment.container.image: missing: Envoy Gateway would run envoyproxy/ratelimit's image"))
	} else if got := *p.Kubernetes.RateLimitDeployment.Container.Image; got != image {
		errs = append(errs, fmt.Errorf("config.envoyGateway.provider.kubernetes.rateLimitDeployment.container.image: %q, want limitd's %q", got, image))
	}
	return errs
}

// limitdImage is the image of limitd's container in examples/istio's
// limitd.yaml: the one placeholder reference for limitd's image.
func limitdImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(istioLimitd)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "image:" && strings.Contains(f[1], "/limitd:") {
			return f[1]
		}
	}
	t.Fatalf("%s: no image of limitd", istioLimitd)
	return ""
}

func loadGlobal(t *testing.T) (objects, *egv1a1.EnvoyGateway) {
	t.Helper()
	b, err := os.ReadFile(globalExample)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(b)
	if err != nil {
		t.Fatalf("%s: %v", globalExample, err)
	}
	v, err := os.ReadFile(globalValues)
	if err != nil {
		t.Fatal(err)
	}
	eg, err := decodeValues(v)
	if err != nil {
		t.Fatalf("%s: %v", globalValues, err)
	}
	return objs, eg
}

// TestGlobalExample: global.yaml decodes strictly into the Gateway API's and
// Envoy Gateway's types and holds one global limit on an HTTPRoute of its
// Gateway (5 requests a minute for each x-api-key); envoy-gateway-values.yaml
// is an EnvoyGateway configuration Envoy Gateway's validation accepts, with
// global limits on a Redis backend and limitd's image as the rate limit
// deployment's.
func TestGlobalExample(t *testing.T) {
	objs, eg := loadGlobal(t)
	limits, err := resolveGlobal(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(limits) != 1 || len(limits[0].routes) != 1 {
		t.Fatalf("%d global limits, want 1 on one HTTPRoute", len(limits))
	}
	rules := limits[0].policy.Spec.RateLimit.Global.Rules
	if len(rules) != 1 || len(rules[0].ClientSelectors) != 1 || len(rules[0].ClientSelectors[0].Headers) != 1 {
		t.Fatalf("rules %+v, want one rule on one header", rules)
	}
	h := rules[0].ClientSelectors[0].Headers[0]
	if h.Name != "x-api-key" || h.Type == nil || *h.Type != egv1a1.HeaderMatchDistinct {
		t.Errorf("selector %+v, want each distinct x-api-key", h)
	}
	if l := rules[0].Limit; l.Requests != 5 || l.Unit != egv1a1.RateLimitUnitMinute {
		t.Errorf("limit %d per %s, want 5 per Minute (the README's session)", l.Requests, l.Unit)
	}
	for _, err := range checkValues(eg, limitdImage(t)) {
		t.Error(err)
	}
}

// TestGlobalExampleRefusals: the decoding and the checks refuse each edit
// that would break the global limit or leave envoyproxy/ratelimit in place.
func TestGlobalExampleRefusals(t *testing.T) {
	image := limitdImage(t)
	for _, c := range []struct {
		name, file, old, new, want string
	}{
		{"misspelt policy field", globalExample, "    global:", "    globl:", `unknown field "spec.rateLimit.globl"`},
		{"local type", globalExample, "    type: Global", "    type: Local", "spec.rateLimit.type: Local"},
		{"no global rules", globalExample, "    global:\n      rules:", "    local:\n      rules:", "spec.rateLimit.global.rules: none"},
		{"Distinct with a value", globalExample, "            type: Distinct", "            type: Distinct\n            value: abc", "type Distinct with a value"},
		{"empty selector", globalExample, "        - headers:\n          # One limit for each distinct value of the header.\n          - name: x-api-key\n            type: Distinct\n", "        - {}\n", "no condition"},
		{"unknown route", globalExample, "    name: backend\n  rateLimit:", "    name: frontend\n  rateLimit:", "no HTTPRoute default/frontend"},
		{"route off the Gateway", globalExample, "  - name: eg-global\n  rules:", "  - name: eg\n  rules:", "no Gateway of the manifest"},
		{"duplicate key", globalExample, "          unit: Minute", "          unit: Minute\n          unit: Hour", "already set in map"},
		{"unknown unit", globalExample, "          unit: Minute", "          unit: Fortnight", `unit: "Fortnight" is not one of`},
		{"misspelt configuration field", globalValues, "        rateLimitDeployment:", "        rateLimitDeploymnet:", `unknown field "provider.kubernetes.rateLimitDeploymnet"`},
		{"no image", globalValues, "            image: ghcr.io/ratelimit-wasm/limitd:0.1.0\n", "", "would run envoyproxy/ratelimit's image"},
		{"other image", globalValues, "ghcr.io/ratelimit-wasm/limitd:0.1.0", "docker.io/envoyproxy/ratelimit:master", "want limitd's"},
		{"no Redis URL", globalValues, "          url: redis.redis-system.svc.cluster.local:6379", "          url: ''", "redis url"},
		{"Redis URL an IP address with a port", globalValues, "redis.redis-system.svc.cluster.local:6379", "10.0.0.7:6379", "unknown ratelimit redis url format"},
		{"other backend", globalValues, "        type: Redis", "        type: Memcache", "unsupported ratelimit backend"},
		{"rateLimit left out", globalValues, "    rateLimit:\n      backend:\n        type: Redis\n        redis:\n          # Your Redis (a single server; a comma-separated list for\n          # Sentinel or Cluster), by host name: Envoy Gateway's validation\n          # refuses an IP address with a port. It passes it on as REDIS_URL.\n          url: redis.redis-system.svc.cluster.local:6379\n", "", "rateLimit: missing"},
		{"another chart value", globalValues, "config:\n", "replicas: 2\nconfig:\n", `"replicas": the example sets only config.envoyGateway`},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(src, []byte(c.old)) {
				t.Fatalf("%s has no %q to edit", c.file, c.old)
			}
			edited := bytes.ReplaceAll(src, []byte(c.old), []byte(c.new))
			var errs []error
			if c.file == globalValues {
				eg, err := decodeValues(edited)
				if err == nil {
					errs = checkValues(eg, image)
				}
				errs = append(errs, err)
			} else {
				objs, err := decode(edited)
				if err == nil {
					var limits []globalLimit
					limits, err = resolveGlobal(objs)
					if err == nil && len(limits) != 1 {
						err = fmt.Errorf("%d global limits", len(limits))
					}
				}
				errs = append(errs, err)
			}
			err = errors.Join(errs...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
