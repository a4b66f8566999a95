// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package istio_test

import (
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// limitdObjects decodes limitd.yaml strictly (k8s.io/api types, unknown
// fields refused) and returns its Deployment, Service and Secrets by name.
func limitdObjects(t *testing.T) (*appsv1.Deployment, *corev1.Service, map[string]*corev1.Secret) {
	t.Helper()
	var dep *appsv1.Deployment
	var svc *corev1.Service
	secrets := map[string]*corev1.Secret{}
	for _, d := range loadManifest(t, "limitd.yaml") {
		switch o := d.Obj.(type) {
		case *appsv1.Deployment:
			dep = o
		case *corev1.Service:
			svc = o
		case *corev1.Secret:
			secrets[o.Name] = o
		}
	}
	if dep == nil || svc == nil || len(secrets) == 0 {
		t.Fatalf("limitd.yaml: want a Deployment, a Service and a Secret")
	}
	return dep, svc, secrets
}

// TestLimitdManifest checks the limit service's deployment: probes on
// /readyz and /healthz on its port, resources, a non-root user that the
// image's uid satisfies, the bearer token read from the Secret (which holds
// the token the gateway's plugin sends), and a Service that selects the pods
// and creates the cluster the gateway's cluster rules name.
func TestLimitdManifest(t *testing.T) {
	dep, svc, secrets := limitdObjects(t)
	pod := dep.Spec.Template
	if !labelsMatch(dep.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("Deployment selector %v does not select its pods %v", dep.Spec.Selector.MatchLabels, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want limitd alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	var port *corev1.ContainerPort
	for i := range c.Ports {
		port = &c.Ports[i]
	}
	if port == nil {
		t.Fatal("the container declares no port")
	}
	listen := flagValue(c.Args, "--listen")
	if !strings.HasSuffix(listen, ":"+strconv.Itoa(int(port.ContainerPort))) || strings.HasPrefix(listen, "127.") {
		t.Errorf("--listen %q: want a non-loopback address on the container port %d", listen, port.ContainerPort)
	}
	if flagValue(c.Args, "--redis") == "" {
		t.Error("no --redis: limitd would keep buckets per process")
	}

	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: want an HTTP probe on %s", name, path)
			return
		}
		if p.HTTPGet.Path != path || !portIs(p.HTTPGet.Port, port) {
			t.Errorf("%s: %s on port %v, want %s on %d", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, port.ContainerPort)
		}
	}
	probe("readinessProbe", c.ReadinessProbe, "/readyz")
	probe("livenessProbe", c.LivenessProbe, "/healthz")

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("resources.requests.%s not set", r)
		}
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
		t.Error("resources.limits.memory not set")
	}

	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
	}
	csc := c.SecurityContext
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Errorf("container securityContext %+v: want no privilege escalation and a read-only root", csc)
	}

	// The token: --token-file in a volume of the Secret, or LIMITD_TOKEN
	// from a secretKeyRef.
	secretName, key := "", ""
	if file := flagValue(c.Args, "--token-file"); file != "" {
		for _, m := range c.VolumeMounts {
			if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil {
					secretName, key = v.Secret.SecretName, strings.TrimPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
					for _, it := range v.Secret.Items {
						if it.Path == key {
							key = it.Key
						}
					}
					if v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o044 == 0 && psc.FSGroup == nil {
						t.Errorf("the token file is readable by its owner only, root, not by uid %d", *psc.RunAsUser)
					}
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.Name == "LIMITD_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secretName, key = e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
		if e.Name == "LIMITD_TOKEN" && e.Value != "" {
			t.Error("LIMITD_TOKEN is written in the Deployment: take it from the Secret")
		}
	}
	sec := secrets[secretName]
	if sec == nil {
		t.Fatalf("the token comes from no Secret of limitd.yaml (secret %q, key %q)", secretName, key)
	}
	token := sec.StringData[key]
	if token == "" {
		token = string(sec.Data[key])
	}
	gw := wasmPlugins(loadExamples(t))["wasmplugin-gateway.yaml"]
	cfg := parseIstioConfig(t, gw)
	if cfg.Service == nil || cfg.Service.Token != token {
		t.Errorf("Secret %s key %s holds %q, the gateway's plugin sends %q", secretName, key, token, cfg.Service.Token)
	}

	// The Service selects the pods, targets the container port, and is the
	// cluster the gateway's cluster rules call.
	if !labelsMatch(svc.Spec.Selector, pod.Labels) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	if len(svc.Spec.Ports) != 1 || !portIs(svc.Spec.Ports[0].TargetPort, port) || !strings.HasPrefix(svc.Spec.Ports[0].Name, "http") {
		t.Errorf("Service ports %+v: want one http port targeting container port %d", svc.Spec.Ports, port.ContainerPort)
	}
	created := manifest.Clusters(loadManifest(t, "limitd.yaml"))
	for _, r := range cfg.Rules {
		if r.Service == nil {
			continue
		}
		if host, ok := created[r.Service.Cluster]; !ok || host != r.Service.Authority {
			t.Errorf("rule %s calls cluster %q (authority %q); limitd.yaml's Service creates %v", r.Name, r.Service.Cluster, r.Service.Authority, created)
		}
	}
}

// TestLimitdManifestIsStrict: a misspelt field of the Deployment fails.
func TestLimitdManifestIsStrict(t *testing.T) {
	docs := loadManifest(t, "limitd.yaml")
	for _, d := range docs {
		if d.Kind != "Deployment" {
			continue
		}
		bad := strings.Replace(string(d.Raw), `"readinessProbe"`, `"readinessprobe"`, 1)
		y, err := yaml.JSONToYAML([]byte(bad))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := manifest.Decode("limitd.yaml", y); err == nil || !strings.Contains(err.Error(), "readinessprobe") {
			t.Errorf("a misspelt readinessProbe: %v", err)
		}
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// portIs reports whether p names the container port, by number or name.
func portIs(p intstr.IntOrString, port *corev1.ContainerPort) bool {
	if p.Type == intstr.String {
		return p.StrVal == port.Name
	}
	return p.IntVal == port.ContainerPort
}

// flagValue returns the value of --name=value or --name value in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
